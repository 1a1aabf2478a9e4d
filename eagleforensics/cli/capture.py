"""``eagleforensics capture MODEL_DIR``: run a local HF model and save the full residual-stream sweep."""
from __future__ import annotations

from pathlib import Path

import click

from .common import echo_text, run_guarded


@click.command()
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--prompt", default=None,
              help="One user message, sent as a chat request: rendered with the model directory's chat template and "
                   "its generation prompt, as a server renders /v1/chat/completions (see --raw-prompt).")
@click.option("--raw-prompt", "raw_prompt", is_flag=True,
              help="Tokenize --prompt as written (a /v1/completions request) instead of through the chat template.")
@click.option("--input-ids", "input_ids", default=None,
              help="Token ids instead of a prompt: comma-separated, or a .pt/.npy/.safetensors file holding them.")
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False),
              help="Many requests in one call: a JSONL file (doctor --served-prompts' forms: chat messages rendered "
                   "with the model's chat template and the generation prompt, text as written, token ids) or a text "
                   "file of one user message per line; -o is then a directory, one capture per request.")
@click.option("-o", "--output", "output", required=True, type=click.Path(),
              help="Where to write the capture (.safetensors); with --prompts, a directory.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
def capture(model_dir: str, prompt: str | None, raw_prompt: bool, input_ids: str | None, prompts_file: str | None,
            output: str, dtype: str) -> None:
    """Capture positions p=0..N (raw) and the post-norm final of MODEL_DIR on one prompt (or, with --prompts,
    on every request of a file: the model loaded once, the sequences run in batches)."""

    def run() -> str:
        from ..errors import ForensicsError, printable
        from ..io.guards import check_not_input
        from ..io.sweep import load_local_model, prompt_ids, sweep, write_capture

        if sum(x is not None for x in (prompt, input_ids, prompts_file)) != 1:
            raise ForensicsError("give exactly one of --prompt, --input-ids or --prompts")
        if raw_prompt and prompt is None:
            raise ForensicsError("--raw-prompt applies to --prompt only")
        if prompts_file is not None:
            from ..io.captureset import capture_many

            check_not_input(output, [(model_dir, "the model directory"), (prompts_file, "the --prompts file")],
                            "capture")
            out, n, tokens = capture_many(model_dir, prompts_file, output, dtype)
            return f"wrote {n} captures ({tokens} tokens) to {printable(out)}"
        if Path(output).is_dir():
            raise ForensicsError("is a directory; a capture of one prompt is a file (--prompts writes a directory)",
                                 path=output)
        check_not_input(output, [(model_dir, "the model directory"), (input_ids, "the --input-ids file")], "capture")
        ids, how = prompt_ids(model_dir, prompt, chat=not raw_prompt) if prompt is not None else \
            (_parse_ids(input_ids or ""), "")
        model = load_local_model(model_dir)
        vocab = int(model.get_input_embeddings().weight.shape[0])
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ForensicsError(f"token ids must lie in [0, {vocab}) for this model")
        path = write_capture(output, sweep(model, ids), model, dtype)
        return (f"wrote {printable(path)} ({int(ids.numel())} tokens, {model.config.num_hidden_layers + 2} states)"
                + (f"; the prompt went in as {how}" if how else ""))

    echo_text(run_guarded(run))


INT64_MAX = (1 << 63) - 1


def _parse_ids(text: str) -> "object":
    """--input-ids: comma-separated ids, or a file holding them (a tensor, or a dict with input_ids/token_ids)."""
    import numpy as np
    import torch

    from ..errors import ForensicsError
    from ..io.safeload import load_object

    if text.replace(",", "").replace(" ", "").isdigit():  # meant as ids: each one checked before int() and torch
        ids = [t.strip() for t in text.split(",") if t.strip()]
        for t in ids:  # ASCII digits only ('²' passes isdigit() yet int() refuses it), below 2^63 (torch's int64)
            if not (t.isascii() and t.isdigit()) or len(t) > 19 or int(t) > INT64_MAX:
                raise ForensicsError(f"--input-ids: {t[:24]!r}{'...' if len(t) > 24 else ''} is not a token id "
                                     "(ids are whole numbers below 2^63, separated by commas)")
        return torch.tensor([int(t) for t in ids], dtype=torch.int64)
    obj = load_object(text)
    if isinstance(obj, dict):
        obj = obj.get("input_ids", obj.get("token_ids"))
    if not isinstance(obj, np.ndarray) or obj.dtype.kind not in "biu":  # load_object hands out ndarrays
        raise ForensicsError("holds no integer input_ids tensor", path=text)
    return torch.from_numpy(obj.reshape(-1).astype(np.int64))
