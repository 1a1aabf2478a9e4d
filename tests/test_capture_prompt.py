"""``capture --prompt`` sends a user message as a chat request, as the server renders it (issue 43, defect 6).

A tiny Llama with a ChatML tokenizer (real forward passes): the prompt goes through the model directory's chat template
with the generation prompt, so the capture pairs with a chat-trained record by its ids; ``--raw-prompt`` keeps the text
as written, and align then says the rows follow other tokens on the two sides instead of blaming weights or kernels.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagleforensics.alignment import align
from eagleforensics.cli import main
from eagleforensics.io.capture import load_capture
from eagleforensics.testing.chat import load, render_record, specforge_record, write_target
from eagleforensics.testing.tinymodels import build_model

QUESTION = "Explain in a few sentences why the sky looks blue during the day and red at sunset."
ANSWER = "Sunlight is scattered by the air, and short wavelengths scatter the most, so the sky looks blue."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chatmodel")
    return write_target(out / "model", build_model("llama", num_layers=8, seed=4), "chatml")


def _capture(model_dir: Path, out: Path, *extra: str):  # noqa: ANN202
    res = CliRunner().invoke(main, ["capture", str(model_dir), "--prompt", QUESTION, "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return res.output, load_capture(out).input_ids.tolist()


def test_prompt_is_rendered_as_a_chat_request(model_dir: Path, tmp_path: Path) -> None:
    tok = load(model_dir)
    want = tok.encode(tok.render([{"role": "user", "content": QUESTION}], add_generation_prompt=True))
    said, ids = _capture(model_dir, tmp_path / "chat.safetensors")
    assert ids == want and "chat request" in said
    assert tok.decode(ids).startswith("<|im_start|>") and tok.decode(ids).endswith("<|im_start|>assistant\n")
    raw_said, raw = _capture(model_dir, tmp_path / "raw.safetensors", "--raw-prompt")
    assert raw == tok.encode(QUESTION) and "as written" in raw_said


def test_the_chat_capture_pairs_with_a_chat_trained_record_and_the_raw_one_names_the_context(model_dir: Path,
                                                                                            tmp_path: Path) -> None:
    tok = load(model_dir)
    model = build_model("llama", num_layers=8, seed=4)
    ids, mask = render_record(tok, [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}])
    torch.save(specforge_record(model, ids, mask), tmp_path / "data_0.ckpt")
    _capture(model_dir, tmp_path / "chat.safetensors")
    _capture(model_dir, tmp_path / "raw.safetensors", "--raw-prompt")
    chat = align(tmp_path / "data_0.ckpt", tmp_path / "chat.safetensors")
    assert chat.tokens.method == "ids-prefix" and not chat.tokens.other_context
    assert chat.judge().level == "OK", chat.to_text()
    raw = align(tmp_path / "data_0.ckpt", tmp_path / "raw.safetensors")
    assert raw.tokens.other_context, raw.tokens
    assert "another system prompt, chat template or prefix" in raw.to_text()


def test_raw_prompt_needs_a_prompt(model_dir: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["capture", str(model_dir), "--input-ids", "1,2,3", "--raw-prompt",
                                    "-o", str(tmp_path / "x.safetensors")])
    assert res.exit_code == 2 and "--raw-prompt applies to --prompt only" in res.output
