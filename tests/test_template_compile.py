"""Issue 40: a chat template jinja2 parses but Python cannot compile is one line naming the template's file, exit 2.

jinja2 turns a template into Python source; 25 nested ``{% for %}`` pass jinja2's parser and hit Python's limit of
20 statically nested blocks, 120 nested ``{% if %}`` its limit on indentation. Both were an internal error (exit 3).
The template stays in the sandbox: it is compiled, never run, before the error.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .realdata import SAMPLES
from .test_hardening import run_process
from .test_template_bounds import _one_line, _target

CASES = {
    "25-nested-for": "{% for a in messages %}" * 25 + "x" + "{% endfor %}" * 25,
    "120-nested-if": "{% if messages %}" * 120 + "x" + "{% endif %}" * 120,
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_template_python_cannot_compile_is_one_line(case: str, tmp_path: Path) -> None:
    target = _target(tmp_path / "t", CASES[case])
    code, out, err, _ = run_process(["doctor", "--train", SAMPLES / "record_layer_outputs.pt", "--target", target],
                                    tmp_path, timeout=120)
    _one_line(code, out, err, "tokenizer_config.json", "deeper than Python can compile")


def test_a_template_nested_within_the_limit_still_renders(tmp_path: Path) -> None:
    from eagleforensics.io.tokenizer import load_tokenizer

    tok = load_tokenizer(_target(tmp_path, "{% for m in messages %}" * 5 + "{{ m.content }}" + "{% endfor %}" * 5))
    assert tok.render([{"role": "user", "content": "hi"}]).count("hi") == 1
