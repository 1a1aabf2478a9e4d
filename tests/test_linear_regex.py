"""Issue 40: the patterns applied to untrusted text are linear in it.

Four patterns retried a greedy run from every start position: SGLang's enum repr (``_ENUM``), a capture's
numbered key (``_INT_SUFFIX``), vLLM's log prefix and the verifier's quantization suffix. Each is now parsed by
hand or bounded. The hand parsers are compared with the old patterns on every short string of the characters
that matter (same answers), and each hostile input from the issue runs in a process that must answer well
inside a generous limit (on the old code each took minutes).
"""
from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import hostile
from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent
LOGS = hostile.FIXTURES
LIMIT = 60  # seconds; the linear code answers in about one, the old code took minutes on each input

OLD_INT_SUFFIX = re.compile(r"^(?P<name>.*?)[._\-\[]?(?P<num>-?\d+)\]?$")
OLD_ENUM = re.compile(r"<\s*[\w.]*?\.?(\w+)\s*:.*>\s*$", re.S)


def _strings(alphabet: str, longest: int):
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            yield "".join(chars)


def test_int_suffix_answers_as_the_old_pattern() -> None:
    from eagleforensics.io.capture import int_suffix

    for s in _strings("a1-_.[]\n\u0663", 5):
        m = OLD_INT_SUFFIX.match(s)
        assert int_suffix(s) == (None if m is None else (m.group("name"), m.group("num"))), repr(s)
    assert int_suffix("model.layers.12") == ("model.layers", "12")
    assert int_suffix("hidden[-1]") == ("hidden", "-1")


def test_enum_member_answers_as_the_old_pattern() -> None:
    from eagleforensics.engines.serverargs import _enum_member

    for s in _strings("<a.: >1\n", 6):
        m = OLD_ENUM.match(s)
        assert _enum_member(s) == (None if m is None else m.group(1)), repr(s)
    assert _enum_member("<SpeculativeAlgorithm.EAGLE3: 3>") == "EAGLE3"


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter importing this checkout, killed past ``LIMIT`` s (the test then fails)."""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT, cwd=ROOT,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer in {LIMIT} s: {code[:200]}")


def test_a_sglang_enum_of_120k_letters_is_read_in_one_pass(tmp_path: Path) -> None:
    """``speculative_algorithm='<'`` + 120k letters in a 122 KiB log kept ``logs`` busy past 60 s."""
    src = (LOGS / "sglang_0.5.5_broken.log").read_text()
    assert "speculative_algorithm='EAGLE3'" in src
    log = tmp_path / "enum.log"
    log.write_text(src.replace("speculative_algorithm='EAGLE3'", "speculative_algorithm='<" + "a" * 120_000 + "'"))
    code, out, err, _ = run_process(["logs", f"run={log}"], tmp_path, timeout=LIMIT)
    assert code in (0, 1, 2) and "Traceback" not in err, (code, err[-800:])


def test_a_capture_whose_keys_are_40k_digits_is_read_in_one_pass(tmp_path: Path) -> None:
    """A 242 KiB capture whose key names are 40k digits (and a letter) kept ``align`` busy past 300 s."""
    header, data = hostile.st_header(hostile.SWEEP_ST)  # the real sweep, keys renamed, its own metadata left out
    renamed, kept, at = {}, [], 0
    for i, k in enumerate([k for k in header if k.startswith("hidden.")][:6]):
        start, end = header[k]["data_offsets"]
        renamed[f"{i}{'1' * 40_000}x"] = {**header[k], "data_offsets": [at, at + end - start]}
        kept.append(data[start:end])
        at += end - start
    bad = hostile.st_write(tmp_path / "capture.safetensors", renamed, b"".join(kept))
    assert bad.stat().st_size > 240_000
    code, out, err, _ = run_process(["align", hostile.REC_ST, bad], tmp_path, timeout=LIMIT)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, (code, err[-800:])


def test_a_vllm_log_of_repeated_unclosed_prefixes_is_read_in_one_pass(tmp_path: Path) -> None:
    """Lines of 50k ``INFO 01-01 00:00:00 [`` (1 MiB each) were scanned to their end from every prefix (~45 s a line)."""
    src = (LOGS / "vllm_0.33.log").read_text()
    metrics = next(line for line in src.splitlines() if "] SpecDecoding metrics: " in line)
    log = tmp_path / "prefix.log"  # metrics lines whose prefix is 49k unclosed ones: the time is read from them
    log.write_text(src + ("INFO 01-01 00:00:00 [" * 49_000 + metrics.split("] ", 1)[1] + "\n") * 3)
    code, out, err, _ = run_process(["logs", f"run={log}"], tmp_path, timeout=LIMIT)
    assert code in (0, 1, 2) and "Traceback" not in err, (code, err[-800:])


def test_a_verifier_name_of_repeated_suffixes_is_shortened_in_one_pass() -> None:
    """A verifier name of 100k ``-fp8`` and a line break was rescanned to the break from every one (minutes)."""
    proc = _python("from eagleforensics.checks.verifier import short_name\n"
                   "print(repr(short_name('m' + '-fp8' * 100_000 + '\\nx')), short_name('org/Foo-8B-FP8'))")
    assert proc.returncode == 0 and proc.stdout.split() == ["'m'", "foo-8b"], (proc.stdout, proc.stderr[-800:])
