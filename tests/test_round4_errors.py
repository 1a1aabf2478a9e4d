"""Issue 31, round four: inputs that gave a traceback, nan or a wrong write now end as one stderr line, exit 2.

Each is run as a real process (``run_process``: exit code, stderr, peak memory), on the real fixtures.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "specforge"


def one_line(code: int, out: str, err: str, *expect: str) -> None:
    assert code == 2 and out == "", (code, out[-500:], err[-1500:])
    assert err.count("\n") == 1 and err.startswith("eagleforensics: error: ") and "Traceback" not in err, err
    for e in expect:
        assert e in err, (e, err)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_temperature_no_engine_samples_at_is_one_line(json_flag: list[str], tmp_path: Path) -> None:
    """--temperature 1e-45 printed nan (a traceback with --json): logits / 1e-45 overflow. Engines do not sample
    there either (vLLM raises it to 0.01, SGLang goes greedy below 1e-6): one line saying so."""
    args = ["replay", FIX / "drafter", FIX / "heldout_3.safetensors", "--target", FIX / "target", "--train",
            FIX / "heldout_3.ckpt", "--steps", "2", "--temperature", "1e-45", *json_flag]
    code, out, err, _ = run_process(args, tmp_path, timeout=120)
    one_line(code, out, err, "--temperature 1e-45", "pass 0 for greedy")
