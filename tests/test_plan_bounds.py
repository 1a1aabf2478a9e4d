"""Issue 31: plan and logs read numbers against physical bounds (``io.physical``); impossible inputs are never planned.

Each case takes a real incident log (data_samples/incident, SGLang's line format) or replay JSON and
plants one impossible number: a tok/s no engine prints or no server reaches, a running-request count
past any server, a step count of 10^9, an accept length above what a round of its steps can
accept. Each must end as one stderr line naming the file (and line), exit 2, as a real process.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagleforensics.io import physical

from .test_hardening import run_process

ROOT = Path(__file__).resolve().parent.parent
INCIDENT = ROOT / "data_samples" / "incident"
TOK_S = re.compile(r"gen throughput \(token/s\): [0-9.]+")


def _planted(tmp: Path, name: str, source: str, old: re.Pattern | str, new: str) -> Path:
    text = (INCIDENT / source).read_text()
    planted = old.sub(new, text, count=1) if isinstance(old, re.Pattern) else text.replace(old, new, 1)
    assert planted != text
    (p := tmp / name).write_text(planted)
    return p


def _one_line(code: int, out: str, err: str, *expect: str) -> None:
    assert code == 2 and out == "", (code, out[-500:], err[-1500:])
    assert err.count("\n") == 1 and err.startswith("eagleforensics: error: ") and "Traceback" not in err, err
    for e in expect:
        assert e in err, (e, err)


LOG_CASES = {
    "tiny-tok-s": (TOK_S, "gen throughput (token/s): 1e-30", "1e-30 tok/s, which no engine prints"),
    "huge-tok-s": (TOK_S, "gen throughput (token/s): 1e150", "past the physical bound"),
    "huge-tok-s-200": (TOK_S, "gen throughput (token/s): 1e200", "past the physical bound"),
    "running-requests": ("#running-req: 1,", "#running-req: 1e23,", "running requests, past the bound"),
}


@pytest.mark.parametrize("command", ["plan", "logs"])
@pytest.mark.parametrize("case", LOG_CASES, ids=list(LOG_CASES))
def test_an_impossible_number_in_a_log_is_one_line(case: str, command: str, tmp_path: Path) -> None:
    old, new, expect = LOG_CASES[case]
    bad = _planted(tmp_path, "bad.log", "tuned_2steps.log", old, new)
    args = [command, INCIDENT / "baseline.log", INCIDENT / "tuned.log", bad]
    code, out, err, _ = run_process(args, tmp_path, timeout=60)
    _one_line(code, out, err, "bad.log: line 4 is damaged", expect)


def test_a_step_count_of_a_billion_is_refused_from_the_log_and_from_launch(tmp_path: Path) -> None:
    """10^9 steps from the arguments line, or from --launch: one line in bounded time, never a plan."""
    big = _planted(tmp_path, "big.log", "tuned_2steps.log", "'speculative_num_steps': 2,",
                   "'speculative_num_steps': 1000000000,")
    code, out, err, _ = run_process(["plan", INCIDENT / "baseline.log", INCIDENT / "tuned.log", big], tmp_path, 60)
    _one_line(code, out, err, "big.log", "1000000000 draft steps", f"cap of {physical.MAX_ENGINE_STEPS}")
    code, out, err, _ = run_process(["plan", INCIDENT / "baseline.log", INCIDENT / "tuned.log", "--launch",
                                     "tuned=1000000000"], tmp_path, 60)
    _one_line(code, out, err, "launch '1000000000'", "1000000000 draft steps")


def test_a_run_accepting_more_than_its_steps_verify_is_refused(tmp_path: Path) -> None:
    """A 1-step run cannot accept 3 tokens a round: the log or its step count is wrong, named with the log."""
    text = (INCIDENT / "tuned.log").read_text()
    bad = tmp_path / "over.log"
    bad.write_text(re.sub(r"accept len: [0-9.]+", "accept len: 3.00", text))
    code, out, err, _ = run_process(["plan", INCIDENT / "baseline.log", bad], tmp_path, 60)
    _one_line(code, out, err, "over.log", "accept length 3 is more than a round of 1 draft step can accept (2 tokens")


@pytest.mark.parametrize("where", ["wiring", "tree"])
def test_a_replay_claiming_more_than_a_round_can_accept_gets_no_pick(where: str, tmp_path: Path) -> None:
    """The issue's replay JSON: accept length 60 for a 2-step tree gave a 37x pick and a launch line."""
    doc = json.loads((INCIDENT / "replay.json").read_text())
    w = doc["wirings"][0]
    if where == "tree":
        w["tree"] = {"topk": 4, "draft_tokens": 8, "steps": 2, "accept_length": 60.0}
    else:
        doc["steps"] = w["steps"] = 2
        w["reach"] = w["reach"][:2]
        w["accept_length"] = 60.0
    p = tmp_path / "replay.json"
    p.write_text(json.dumps(doc))
    code, out, err, _ = run_process(["plan", INCIDENT / "baseline.log", INCIDENT / "broken.log", "--replay", p],
                                    tmp_path, 60)
    _one_line(code, out, err, "replay.json", "accept length 60 is more than a round of 2 draft steps can accept")


def test_the_real_incident_logs_still_plan() -> None:
    """Controls: every incident log stays inside the bounds, and plan still answers on them."""
    from eagleforensics.plan import PlanInputs, make_plan

    logs = {n: str(INCIDENT / f"{n}.log") for n in ("baseline", "tuned", "tuned_2steps", "tuned_3steps")}
    rep = make_plan(PlanInputs(logs))
    assert rep.best is not None and rep.exit_code in (0, 1)
