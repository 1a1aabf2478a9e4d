"""Issue 31: one bounded renderer for chat templates, and served prompts that are bad input named as such.

Chat templates are untrusted code. The sandbox already refused escapes; these tests hold the renderer
to limits on memory, steps and output (``io.chatrender``), run as real processes where the defect was
a process's (peak memory, a hang), and check that every template failure, and every bad served
request, is one stderr line naming the right file with exit 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagleforensics.errors import ForensicsError
from eagleforensics.io import chatrender
from eagleforensics.io.tokenizer import load_tokenizer
from eagleforensics.testing import chat

from .realdata import SAMPLES
from .test_hardening import GIB, run_process

REC = SAMPLES / "record_layer_outputs.pt"
USER = [{"role": "user", "content": "hi"}]


def _target(root: Path, template: str | None = None) -> Path:
    """A target directory with the sample's config.json and a ChatML tokenizer, its template replaced by ``template``."""
    d = chat.write_tokenizer(root, "chatml")
    (d / "config.json").write_text((SAMPLES / "target" / "config.json").read_text())
    if template is not None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = template
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def _one_line(code: int, out: str, err: str, *expect: str) -> None:
    assert code == 2 and out == "", (code, out[-300:], err[-2000:])
    assert err.count("\n") == 1 and err.startswith("eagleforensics: error: ") and "Traceback" not in err, err
    for e in expect:
        assert e in err, (e, err)


# the 89-byte template of the issue took 1.2 GiB; two nested range(100000) loops ran without end
PROCESS_CASES = {
    "string-times-a-big-number": ("{{ 'x' * 300000000 }}", "builds a value of 300,000,000"),
    "nested-range-loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                           "chat template ran"),  # past the steps or the time, whichever comes first
    "division-by-zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "recursive-macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
}


@pytest.mark.parametrize("case", PROCESS_CASES, ids=list(PROCESS_CASES))
def test_hostile_template_is_one_line_in_bounded_memory_and_time(case: str, tmp_path: Path) -> None:
    """doctor --train --target with the template: one line naming tokenizer_config.json, exit 2, peak < 1 GiB."""
    template, expect = PROCESS_CASES[case]
    target = _target(tmp_path / "t", template)
    code, out, err, peak = run_process(["doctor", "--train", REC, "--target", target], tmp_path, timeout=60)
    _one_line(code, out, err, "tokenizer_config.json", expect)
    assert peak < GIB, f"peak resident memory {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("template,expect", [
    ("{{ 'x'|center(1000000000) }}", "center an integer above"),
    ("{{ 'x'.ljust(1000000000) }}", "ljust an integer above"),
    ("{{ '{:>999999999}'.format(1) }}", "width or precision"),
    ("{{ '%999999999s' % 'x' }}", "width or precision"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "builds a"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "builds a"),
    ("{% set s = 'x' * 100000 %}{{ s.join(s) }}", "builds a value"),
    ("{% set s = 'x' * 100000 %}{{ s|join(s) }}", "builds a value"),
    ("{% set s = 'x' * 100000 %}{{ s.replace('', s) }}", "builds a value"),
    ("{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", "chat template ran"),
    ("{% for x in [1] recursive %}{% if loop.depth < 4 %}{{ loop(range(100000)) }}{% endif %}{% endfor %}",
     "chat template ran"),
    ("{% for i in range(20000) %}{{ 'x' * 1000 }}{% endfor %}", "rendered more than"),
    ("{% set s = 'x' * 1000000 %}{% set l = [s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s] %}{{ l }}",
     "prints a value of more than"),
    ("{% set s = 'x' * 1000000 %}{% set l = [s, s, s, s, s, s, s, s, s] %}{{ l ~ l }}", "builds a value"),
    ("{{ ('x\t' * 100000).expandtabs(60000) }}", "builds a value"),
    ("{% set s = 'x' * 100000 %}{{ s.translate({120: 'y' * 60000}) }}", "builds a value"),
    ("{{ ('{0:>60000}' * 1000).format(1) }}", "builds a value"),
    ("{{ messages|tojson(indent=1000) }}", "indents JSON by 1000"),
    ("{{ lipsum(5) }}", "'lipsum' is undefined"),
    ("{{ 10 ** 100000 }}", "power"),
    ("{{ messages.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
], ids=["center", "ljust", "format-width", "percent-width", "concat-doubling", "plus-doubling", "str-join",
        "join-filter", "replace", "nested-string-loops", "recursive-loop", "output-size", "printed-references",
        "concatenated-references", "expandtabs", "translate", "format-fields", "tojson-indent", "lipsum", "power",
        "escape"])
def test_every_blow_up_is_refused_before_it_happens(template: str, expect: str, tmp_path: Path) -> None:
    tok = load_tokenizer(_target(tmp_path, template))
    with pytest.raises(ForensicsError, match="failed on a probe") as exc:
        tok.render(USER)
    assert expect in str(exc.value) and "tokenizer_config.json" in str(exc.value)


def test_real_templates_render_as_before(tmp_path: Path) -> None:
    """The bounded renderer renders both template families exactly (no limit is near a real conversation)."""
    tok = load_tokenizer(_target(tmp_path / "c"))
    assert tok.render(USER, add_generation_prompt=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    llama = chat.load(chat.write_tokenizer(tmp_path / "l", "llama3"))
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 50} for i in range(200)]
    text = llama.render(long)
    assert text.count("<|start_header_id|>") == 200 and len(text) < chatrender.MAX_OUTPUT_CHARS


# ---------------------------------------------------------------------- served prompts: bad input names the file

SERVED = {
    "id-outside-vocabulary": ({"prompt_token_ids": [1, 2, 99999]}, "token id 99999 is outside"),
    "id-not-a-whole-number": ({"prompt_token_ids": [1, 2, 1e30]}, "not a token id"),
    "kwargs-set-the-generation-prompt": ({"messages": USER, "chat_template_kwargs": {"add_generation_prompt": False}},
                                         "'add_generation_prompt'"),
    "kwargs-set-the-messages": ({"messages": USER, "chat_template_kwargs": {"messages": []}}, "'messages'"),
    "object-content": ({"messages": [{"role": "user", "content": {"a": 1}}]}, "cannot render this request"),
}


@pytest.mark.parametrize("case", SERVED, ids=list(SERVED))
def test_bad_served_request_is_one_line_naming_the_served_file(case: str, tmp_path: Path) -> None:
    """Never a template-mismatch finding, a traceback, or tokenizer_config.json blamed for the request's content."""
    from click.testing import CliRunner

    from eagleforensics.cli import main

    request, expect = SERVED[case]
    served = tmp_path / "served.jsonl"
    served.write_text(json.dumps(request) + "\n")
    res = CliRunner().invoke(main, ["doctor", "--train", str(REC), "--target", str(_target(tmp_path / "t")),
                                    "--served-prompts", str(served)])
    _one_line(res.exit_code, res.stdout, res.stderr, "served.jsonl: line 1", expect)


def test_lone_surrogate_in_a_served_prompt_is_one_line(tmp_path: Path) -> None:
    """A JSON escape of half a surrogate pair is refused when the file is read, as a process (no traceback)."""
    served = tmp_path / "served.jsonl"
    served.write_text('{"prompt": "hello \\ud800 there"}\n')
    code, out, err, _ = run_process(["doctor", "--train", REC, "--target", _target(tmp_path / "t"),
                                     "--served-prompts", served], tmp_path, timeout=60)
    _one_line(code, out, err, "served.jsonl: line 1 holds a lone surrogate")


def test_every_render_of_one_template_shares_one_time_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template just under the step limit costs most of a second a render: with 2000 served prompts that was
    half an hour. All renders of one template share MAX_TOTAL_SECONDS (lowered here to keep the test short)."""
    import time

    from click.testing import CliRunner

    from eagleforensics.cli import main

    monkeypatch.setattr(chatrender, "MAX_TOTAL_SECONDS", 3.0)
    slow = "{% for i in range(900) %}{% for j in range(1000) %}{% endfor %}{% endfor %}" + chat.TEMPLATES["chatml"]
    served = tmp_path / "served.jsonl"
    served.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                              for i in range(200)))
    start = time.monotonic()
    res = CliRunner().invoke(main, ["doctor", "--train", str(REC), "--target", str(_target(tmp_path / "t", slow)),
                                    "--served-prompts", str(served)])
    assert time.monotonic() - start < 60  # 200 renders of ~0.5 s each would take minutes
    _one_line(res.exit_code, res.stdout, res.stderr, "over all the conversations rendered with it")
