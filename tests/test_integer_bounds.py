"""Issue 40: every integer read from a config or a log is bounded by what the engines accept (``io.bounds``).

``num_nextn_predict_layers`` = 10^9 made the MTP check build a billion names (MemoryError, exit 3) and a vLLM log's
``pipeline_parallel_size`` = 10^9 a billion pipeline stages. Now a value only one check reads leaves that check
"not run" with the reason; one the whole run reads is one line naming the file and the field, exit 2. Each runs as a
process under a 6 GiB address-space limit, so the old code fails fast instead of filling the machine.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagleforensics.testing.defects import SAMPLES, edit_config, vllm_log

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 6 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def run_limited(args: list, cwd: Path, timeout: float = 300) -> tuple[int, str, str]:
    """``python -m eagleforensics ARGS`` with at most ``LIMIT_BYTES`` of address space, killed past ``timeout``."""
    try:
        proc = subprocess.run([sys.executable, "-m", "eagleforensics", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd, preexec_fn=_limited,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer in {timeout:.0f} s: {args}")
    return proc.returncode, proc.stdout, proc.stderr


def _one_line(code: int, err: str, *expect: str) -> None:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err[-1500:])
    for e in expect:
        assert e in err, (e, err)


def test_a_billion_mtp_layers_leave_the_mtp_check_not_run(tmp_path: Path) -> None:
    target = shutil.copytree(SAMPLES / "target", tmp_path / "target")
    edit_config(target, num_nextn_predict_layers=10 ** 9)
    code, out, err = run_limited(["doctor", "--drafter", SAMPLES / "drafter", "--target", target, "--json"], tmp_path)
    assert code in (0, 1) and "Traceback" not in err, (code, err[-1500:])
    rows = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rows["mtp-weights"]["status"] == "not-run"
    assert "num_nextn_predict_layers = 1000000000, past the cap of 64" in rows["mtp-weights"]["reason"]
    assert rows["sizes"]["status"] == "clean"


def test_a_real_mtp_count_is_still_checked(tmp_path: Path) -> None:
    target = shutil.copytree(SAMPLES / "target", tmp_path / "target")
    edit_config(target, num_nextn_predict_layers=1)
    code, out, err = run_limited(["doctor", "--target", target, "--only", "mtp-weights", "--json"], tmp_path)
    rows = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rows["mtp-weights"]["status"] == "found", (code, rows["mtp-weights"], err[-800:])


def test_a_vllm_log_with_a_billion_pipeline_stages_is_one_line(tmp_path: Path) -> None:
    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "server.log", "0.14.0", SAMPLES / "target", spec, pipeline_parallel_size=10 ** 9)
    code, out, err = run_limited(["doctor", "--drafter", SAMPLES / "drafter", "--target", SAMPLES / "target",
                                  "--log", log], tmp_path)
    _one_line(code, err, "server.log", "line 2", "pipeline_parallel_size is 1000000000, past the cap of 1,024")


@pytest.mark.parametrize("field, value", [("speculative_num_steps", 10 ** 12), ("speculative_eagle_topk", 100_000),
                                          ("tp_size", 10 ** 6), ("speculative_num_draft_tokens", 10 ** 7)])
def test_an_sglang_launch_past_the_engines_bounds_is_one_line(field: str, value: int, tmp_path: Path) -> None:
    src = (ROOT / "tests" / "fixtures" / "logs" / "sglang_0.5.5_broken.log").read_text()
    at = re.compile(rf"\b{field}=").search(src, src.index("server_args=")).start()  # the arguments line's own
    end = src.index(",", at)
    log = tmp_path / "sglang.log"
    log.write_text(src[:at] + f"{field}={value}" + src[end:])
    code, out, err = run_limited(["logs", f"run={log}"], tmp_path)
    _one_line(code, err, "sglang.log", f"{field} is {value}", "past the cap of")


@pytest.mark.parametrize("field", ["num_hidden_layers", "vocab_size", "hidden_size"])
def test_a_target_config_past_any_served_model_is_one_line(field: str, tmp_path: Path) -> None:
    target = shutil.copytree(SAMPLES / "target", tmp_path / "target")
    edit_config(target, **{field: 10 ** 9})
    code, out, err = run_limited(["doctor", "--drafter", SAMPLES / "drafter", "--target", target], tmp_path)
    _one_line(code, err, "config.json", f"{field} is 1000000000, past the cap of")


def test_a_nested_config_field_is_named_with_its_path(tmp_path: Path) -> None:
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.bounds import check_config_ints

    check_config_ints(json.loads((SAMPLES / "target" / "config.json").read_text()), "config.json")  # the real one
    with pytest.raises(ForensicsError, match=r"text_config\.num_hidden_layers is about 10\^99"):
        check_config_ints({"text_config": {"num_hidden_layers": 10 ** 99}}, "config.json")


def test_a_launch_line_past_a_bound_reads_as_none_or_one_line() -> None:
    from eagleforensics.engines.serverargs import parse_server_args_line
    from eagleforensics.errors import ForensicsError

    line = "INFO 11-29 12:58:00 [utils.py:233] non-default args: {'model': 'm', 'pipeline_parallel_size': 5000}"
    assert parse_server_args_line(line) is None
    with pytest.raises(ForensicsError, match="pipeline_parallel_size is 5000, past the cap of 1,024"):
        parse_server_args_line(line, strict=True)
    assert parse_server_args_line(line.replace("5000", "2")).pp == 2
