"""``plan``: recover known round costs from logs written in each release's line format, pick the best step count,
and say so when the runs do not pin the answer.

The logs are simulated round by round from a known cost model (``eagleforensics.testing.runlogs``: its
round time is written out there, not taken from ``serving.roundcost``) in the SGLang and vLLM line
formats ``engines.logs`` documents and the arguments-line formats ``engines.serverargs`` documents.
Every expected figure below is computed here from the truth, never from plan's own output.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.cli.plan import plan as plan_cmd
from eagleforensics.errors import ForensicsError
from eagleforensics.serving.acceptcurve import from_length, from_reach
from eagleforensics.serving.roundcost import Costs, RoundConfig, RoundTime, VerifyShare, fit_costs
from eagleforensics.serving.servinggap import GapTest
from eagleforensics.plan import PlanInputs, draft_tokens_for, make_plan
from eagleforensics.testing.runlogs import SimRun, chain_reach, write_log

ROOT = Path(__file__).resolve().parents[1]
INCIDENT = ROOT / "data_samples" / "incident"

# the truth: seconds
V, PER_TOKEN, DRAFT, DECODE = 0.014, 0.0006, 0.002, 0.011
CHAIN = chain_reach([0.8, 0.75, 0.7, 0.55, 0.45, 0.4, 0.35, 0.3])
TREE = (5, 4, 8)
TREE_REACH = [0.95, 0.85, 0.7, 0.45, 0.15]


def true_round(steps: int, topk: int = 1, tokens: int | None = None) -> float:
    m = tokens if tokens is not None else steps + 1
    return V + PER_TOKEN * (m - 1) + DRAFT * steps


def true_tok_s(steps: int, reach: list[float] = CHAIN, topk: int = 1, tokens: int | None = None) -> float:
    return (1 + sum(reach[:steps])) / true_round(steps, topk, tokens)


def true_best_chain(max_steps: int = 8) -> int:
    return max(range(1, max_steps + 1), key=true_tok_s)


def replay_doc(reach: list[float], tree: tuple[int, int, int] | None = None, tree_length: float | None = None,
               engine_source: str = "trained; sglang reading config.json", starts: int = 4000,
               other: list[float] | None = None) -> dict:
    """A replay JSON in schema v1 with the given reach (and a tree figure as newer replays write it)."""
    def wiring(label: str, source: str, r: list[float]) -> dict:
        w = {"label": label, "positions": label.split(","), "source": source, "steps": len(r), "starts": starts,
             "acc": r, "cond": r, "reach": r, "accept_length": 1 + sum(r), "note": None}
        if tree is not None and source.startswith("trained"):
            w["tree"] = {"topk": tree[1], "draft_tokens": tree[2], "steps": tree[0], "accept_length": tree_length}
        return w

    wirings = [wiring("p3,p7,p10", engine_source, list(reach))]
    if other is not None:
        wirings.append(wiring("p2,p6,p9", "engine default", list(other)))
    return {"schema": "eagleforensics-replay-v1", "steps": len(reach), "trained": "p3,p7,p10", "wirings": wirings}


def write_runs(tmp: Path, engine: str, version: str, configs: list[tuple[int, int, int | None]], *, lines: int = 60,
               reach_for: dict | None = None, **extra: object) -> dict[str, str]:
    """Baseline plus one log per (steps, topk, draft tokens), all with the true costs."""
    logs = {"baseline": str(write_log(tmp / "baseline.log", SimRun(engine, version, decode_step_s=DECODE,
                                                                   lines=lines, seed=99)))}
    for i, (k, topk, m) in enumerate(configs):
        reach = (reach_for or {}).get((k, topk, m), TREE_REACH if topk > 1 else CHAIN[:k])
        run = SimRun(engine, version, steps=k, topk=topk, draft_tokens=m, verify_s=V, per_token_s=PER_TOKEN,
                     draft_step_s=DRAFT, reach=reach[:k], lines=lines, seed=10 + i, **extra)  # type: ignore[arg-type]
        label = f"k{k}" + (f"t{topk}m{m}" if topk > 1 else "")
        logs[label] = str(write_log(tmp / f"{label}.log", run))
    return logs


# --- the cost model alone ------------------------------------------------------------------------

def test_fit_recovers_exact_costs_when_the_runs_pin_them() -> None:
    configs = [RoundConfig(1), RoundConfig(3), RoundConfig(*TREE)]
    fit = fit_costs([RoundTime(c.label, c, true_round(c.steps, c.topk, c.verified), 1e-5) for c in configs],
                    decode_step_s=DECODE)
    assert fit.determined and fit.assumptions == ()
    assert fit.point.verify_s == pytest.approx(V, rel=1e-6)
    assert fit.point.per_token_s == pytest.approx(PER_TOKEN, rel=1e-6)
    assert fit.point.draft_step_s == pytest.approx(DRAFT, rel=1e-6)


def test_chains_alone_pin_v_plus_d_but_not_the_split() -> None:
    fit = fit_costs([RoundTime(f"k{k}", RoundConfig(k), true_round(k), 1e-5) for k in (1, 4)], decode_step_s=DECODE)
    assert fit.pinned_params == (True, False, False) and not fit.determined
    assert fit.assumptions == ("flat-verify",)
    for k in range(1, 9):  # every chain is pinned: its round time is exact
        lo, hi = fit.round_range(RoundConfig(k))
        assert fit.pinned(RoundConfig(k)) and lo == pytest.approx(true_round(k)) and hi == pytest.approx(true_round(k))
    tree = RoundConfig(*TREE)
    lo, hi = fit.round_range(tree)
    assert not fit.pinned(tree) and lo < true_round(*TREE) < hi  # the truth inside, the range honest
    share = VerifyShare(Costs(V, PER_TOKEN, DRAFT).verify_share(RoundConfig(1)), RoundConfig(1), true_round(1))
    fit2 = fit_costs([RoundTime(f"k{k}", RoundConfig(k), true_round(k), 1e-5) for k in (1, 4)], verify_share=share)
    assert fit2.determined and fit2.point.per_token_s == pytest.approx(PER_TOKEN, rel=1e-6)


def test_one_run_is_under_determined_and_says_what_it_assumed() -> None:
    fit = fit_costs([RoundTime("k2", RoundConfig(2), true_round(2), 1e-5)], decode_step_s=DECODE)
    assert fit.assumptions == ("flat-verify", "verify-is-decode") and not any(fit.pinned_params)
    # the point is what the assumptions give: V = decode step, v = 0, d = the rest
    assert fit.point.verify_s == pytest.approx(DECODE) and fit.point.per_token_s == pytest.approx(0.0, abs=1e-12)
    assert fit.point.draft_step_s == pytest.approx((true_round(2) - DECODE) / 2)
    for k in range(1, 9):
        lo, hi = fit.round_range(RoundConfig(k))
        assert lo - 1e-12 <= true_round(k) <= hi + 1e-12
    # without a baseline the third assumption fills in
    fit3 = fit_costs([RoundTime("k2", RoundConfig(2), true_round(2), 1e-5)])
    assert fit3.assumptions == ("flat-verify", "draft-ratio")
    assert fit3.point.draft_step_s == pytest.approx(0.05 * fit3.point.verify_s)


def test_a_negative_cost_is_held_at_zero_and_said() -> None:
    times = [RoundTime("k1", RoundConfig(1), 0.020, 1e-5), RoundTime("k3", RoundConfig(3), 0.018, 1e-5)]
    fit = fit_costs(times)
    assert fit.point.draft_step_s >= 0 and fit.point.per_token_s >= 0 and fit.notes
    with pytest.raises(ForensicsError):
        fit_costs([RoundTime("k1", RoundConfig(1), -1.0)])


# --- acceptance curves ---------------------------------------------------------------------------

@pytest.mark.parametrize("rates", [[0.9] * 8, [0.8, 0.75, 0.7, 0.55, 0.45, 0.4, 0.35, 0.3], [0.5, 0.95, 0.95, 0.95,
                                                                                               0.2, 0.2, 0.9, 0.9],
                                   [0.3, 0.3, 0.3, 1.0, 1.0, 1.0, 1.0, 1.0]])
@pytest.mark.parametrize("measured", [1, 2, 4])
def test_accept_bounds_hold_for_any_non_increasing_reach(rates: list[float], measured: int) -> None:
    """From one accept length (SGLang) or reach up to S (vLLM), the true L(k) of every k lies inside the range."""
    reach = chain_reach(rates)
    one = from_length(1 + sum(reach[:measured]), measured, 8, "test")
    upto = from_reach(reach[:measured], 8, "test")
    for k in range(1, 9):
        truth = 1 + sum(reach[:k])
        for curve in (one, upto):
            p = curve.at(k)
            assert p.lo - 1e-9 <= truth <= p.hi + 1e-9, (k, curve.source, p)
        if k <= measured:
            assert upto.at(k).length == pytest.approx(truth)


def test_gap_bar_is_the_larger_of_the_floor_and_three_standard_errors() -> None:
    assert GapTest(2.0, 0.02, 2.4, 0.02).bar == pytest.approx(0.3)
    assert GapTest(2.0, 0.02, 2.4, 0.02).found
    wide = GapTest(2.0, 0.2, 2.4, 0.2)
    assert wide.bar == pytest.approx(3 * math.hypot(0.2, 0.2)) and not wide.found


# --- end to end, from logs in each release's format ----------------------------------------------

SGLANG_RELEASES = ["0.5.3", "0.5.4", "0.5.5", "0.5.5.post3", "0.5.9", "0.5.13", "0.5.23"]
VLLM_RELEASES = ["0.10.0", "0.11.0", "0.20.0", "0.33.0"]


@pytest.mark.parametrize("version", SGLANG_RELEASES)
def test_sglang_logs_recover_costs_and_pick_the_best(tmp_path: Path, version: str) -> None:
    logs = write_runs(tmp_path, "sglang", version, [(1, 1, None), (3, 1, None), (5, 1, None), TREE])
    tree_len = 1 + sum(TREE_REACH)
    (tmp_path / "replay.json").write_text(json.dumps(replay_doc(CHAIN, TREE, tree_len)))
    rep = make_plan(PlanInputs(logs, served="k3", replay=str(tmp_path / "replay.json")))
    fit = rep.fit
    assert fit.determined and fit.assumptions == ()
    assert fit.point.verify_s == pytest.approx(V, rel=0.04)
    assert fit.point.per_token_s == pytest.approx(PER_TOKEN, abs=0.15e-3)
    assert fit.point.draft_step_s == pytest.approx(DRAFT, abs=0.15e-3)
    # the pick: the tree (its replay figure) beats every chain; the best chain is the true one
    truth = {RoundConfig(k): true_tok_s(k) for k in range(1, 9)}
    truth[RoundConfig(*TREE)] = tree_len / true_round(*TREE)
    best = max(truth, key=truth.__getitem__)
    assert rep.best is not None and rep.best.config == best
    chains = [p for p in rep.predictions if p.config.chain and p.tok_s]
    assert max(chains, key=lambda p: p.tok_s).config.steps == true_best_chain()
    for p in chains:
        assert p.tok_s == pytest.approx(truth[p.config], rel=0.03)
    # each measured run sits on the curve
    for r in rep.runs:
        if r.role in ("fit", "served"):
            pred = next(p for p in rep.predictions if p.config == r.config)
            assert pred.tok_s == pytest.approx(r.tok_s, rel=0.03)
    assert {f.code for f in rep.findings} >= {"better-steps"} and rep.exit_code == 1


@pytest.mark.parametrize("version", VLLM_RELEASES)
def test_vllm_logs_recover_costs_from_chains_and_a_profiled_share(tmp_path: Path, version: str) -> None:
    logs = write_runs(tmp_path, "vllm", version, [(1, 1, None), (2, 1, None), (4, 1, None)], lines=30)
    share = Costs(V, PER_TOKEN, DRAFT).verify_share(RoundConfig(4))
    rep = make_plan(PlanInputs(logs, verify_share=share))  # served: the last speculative run (4 steps)
    assert rep.served.label == "k4" and rep.served.config == RoundConfig(4)
    assert rep.served.config_from.startswith("arguments line")
    fit = rep.fit
    assert fit.determined
    assert fit.point.verify_s == pytest.approx(V, rel=0.04)
    assert fit.point.per_token_s == pytest.approx(PER_TOKEN, abs=0.2e-3)
    assert fit.point.draft_step_s == pytest.approx(DRAFT, abs=0.2e-3)
    # acceptance from the served run's own per-position rates: measured up to 4 steps
    assert rep.curve is not None and "per-position" in rep.curve.source and rep.curve.measured_steps == 4
    assert rep.best is not None and rep.best.config == RoundConfig(true_best_chain())
    assert rep.best.tok_s == pytest.approx(true_tok_s(true_best_chain()), rel=0.03)
    # without the profile: chains still pinned, the split is not, and the output says so
    rep2 = make_plan(PlanInputs(logs))
    assert not rep2.fit.determined and "flat-verify" in rep2.fit.assumptions
    assert rep2.best.config == RoundConfig(true_best_chain())
    assert any(f.code == "under-determined" for f in rep2.findings)


def test_one_speculative_run_is_honest_about_what_it_does_not_know(tmp_path: Path) -> None:
    logs = write_runs(tmp_path, "sglang", "0.5.23", [(1, 1, None)], lines=80)
    (tmp_path / "replay.json").write_text(json.dumps(replay_doc(CHAIN)))
    rep = make_plan(PlanInputs(logs, replay=str(tmp_path / "replay.json")))
    assert not rep.fit.determined and rep.fit.assumptions == ("flat-verify", "verify-is-decode")
    under = next(f for f in rep.findings if f.code == "under-determined")
    assert "flat-verify" in under.message and "verify-is-decode" in under.message
    for p in rep.predictions:  # the truth of every chain inside the range plan gives
        if p.config.chain:
            truth = true_tok_s(p.config.steps)
            assert p.tok_lo * 0.97 <= truth <= p.tok_hi * 1.03, (p.config, p.tok_lo, truth, p.tok_hi)
    # the assumed costs put the best elsewhere than the truth does, and plan does not hide it
    assert rep.best.config != RoundConfig(true_best_chain())
    depends = next(f for f in rep.findings if f.code == "pick-depends")
    assert "steps" in depends.message and rep.exit_code == 1
    assert any("another step count" in t for t in rep.todo)
    # a second step count pins it, and the pick becomes the true one
    (tmp_path / "more").mkdir()
    more = write_runs(tmp_path / "more", "sglang", "0.5.23", [(1, 1, None), (4, 1, None)], lines=80)
    rep2 = make_plan(PlanInputs(more, served="k1", replay=str(tmp_path / "replay.json")))
    assert rep2.best.config == RoundConfig(true_best_chain())
    assert not any(f.code == "pick-depends" for f in rep2.findings)


def test_logs_alone_give_a_geometric_curve_with_its_range(tmp_path: Path) -> None:
    """SGLang logs without replay: only the served accept length is measured; other steps are assumed, with bounds."""
    logs = write_runs(tmp_path, "sglang", "0.5.23", [(1, 1, None), (3, 1, None)], lines=80)
    rep = make_plan(PlanInputs(logs, served="k3"))
    assert rep.curve is not None and rep.curve.assumption and "conditional acceptance" in rep.curve.assumption
    p3 = rep.curve.at(3)
    assert p3.how == "measured" and p3.length == pytest.approx(1 + sum(CHAIN[:3]), abs=0.05)
    for k in (1, 2, 5, 8):
        p = rep.curve.at(k)
        assert p.how == "geometric" and p.lo - 0.05 <= 1 + sum(CHAIN[:k]) <= p.hi + 0.05
    assert any(f.code == "extrapolated" for f in rep.findings)


# --- serving gap ---------------------------------------------------------------------------------

def _gap_case(tmp: Path, served_rates: list[float], starts: int, cuda_graph: bool = False, lines: int = 60):
    reach = chain_reach(served_rates)
    run = SimRun("sglang", "0.5.23", steps=3, verify_s=V, per_token_s=PER_TOKEN, draft_step_s=DRAFT, reach=reach,
                 lines=lines, seed=5, cuda_graph=cuda_graph, prefix_cache=True)
    logs = {"baseline": str(write_log(tmp / "b.log", SimRun("sglang", "0.5.23", decode_step_s=DECODE, seed=6))),
            "served": str(write_log(tmp / "s.log", run))}
    (tmp / "replay.json").write_text(json.dumps(replay_doc(CHAIN, starts=starts)))
    return make_plan(PlanInputs(logs, replay=str(tmp / "replay.json")))


def test_serving_gap_found_with_suspects_from_the_run_s_arguments(tmp_path: Path) -> None:
    rep = _gap_case(tmp_path, [0.6, 0.5, 0.4], starts=4000)  # L ~ 1.96 against replay's 2.82 at 3 steps
    gap = next(f for f in rep.findings if f.code == "serving-gap")
    assert rep.gap is not None and rep.gap.found and rep.gap.expected == pytest.approx(1 + sum(CHAIN[:3]))
    assert "CUDA graphs off in this run (disable_cuda_graph=True)" in gap.message
    assert "prefix cache on in this run (disable_radix_cache=False)" in gap.message
    assert "vllm-project/vllm#17504" in gap.source and rep.exit_code == 1
    status = {m.suspect.code: m.status for m in rep.suspects}
    assert status["cuda-graph"] == "matches" and status["pd-disaggregation"] == "ruled-out"
    assert status["tree"] == "ruled-out" and status["release"] == "matches"
    # predictions follow what the server measures; replay's curve is the what-if
    assert "logged by run served" in rep.curve.source and "if_serving_gap_closed" in rep.alternatives
    doc = json.loads(rep.to_json())
    assert doc["serving_gap"]["found"] and doc["suspects"][0]["status"] == "matches"


def test_no_serving_gap_when_the_server_accepts_what_replay_expects(tmp_path: Path) -> None:
    rep = _gap_case(tmp_path, [0.8, 0.75, 0.7], starts=4000)
    assert rep.gap is not None and not rep.gap.found and abs(rep.gap.gap) < 0.1
    assert not any(f.code == "serving-gap" for f in rep.findings)


def test_gap_bar_widens_with_few_replay_rows(tmp_path: Path) -> None:
    """The same 0.45-token gap is a serving gap against 4000 replayed rows, noise against 12."""
    rates = [0.7, 0.65, 0.6]  # L ~ 2.39 against 2.82
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    found = _gap_case(tmp_path / "a", rates, starts=4000)
    noisy = _gap_case(tmp_path / "b", rates, starts=12)
    assert found.gap.found and found.gap.bar == pytest.approx(0.3)
    assert not noisy.gap.found and noisy.gap.bar > noisy.gap.gap > 0.3


def test_a_wrong_wiring_is_the_loss_not_the_serving_path() -> None:
    """The incident's broken run: the engine feeds the default layers, replay expects 1.19 for them, measured 1.19."""
    rep = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "broken")},
                               replay=str(INCIDENT / "replay.json")))
    assert rep.gap is not None and not rep.gap.found and rep.gap_wiring == "p2,p16,p29"
    loss = next(f for f in rep.findings if f.code == "wiring-loss")
    assert "p3,p17,p30" in loss.message and rep.exit_code == 1
    assert rep.alternatives["if_wiring_fixed"]["tok_s"] == pytest.approx(1.47 / (1.19 / 54.8), rel=0.02)


# --- the incident ----------------------------------------------------------------------------------

def test_incident_logs_are_reproducible(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_incident_logs.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    committed = sorted(p.name for p in INCIDENT.iterdir())
    assert committed == sorted(p.name for p in tmp_path.iterdir())
    for name in committed:
        assert (tmp_path / name).read_bytes() == (INCIDENT / name).read_bytes(), name


def test_incident_sweep_is_predicted_from_two_runs() -> None:
    """After NCCL tuning: runs at 1 and 3 steps predict the 2-step run the sweep found (94 tok/s), within noise."""
    rep = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "tuned", "tuned_3steps")},
                               served="tuned", replay=str(INCIDENT / "replay_fixed.json")))
    assert rep.best.config == RoundConfig(2) and rep.best.tok_s == pytest.approx(94.0, abs=0.5)
    measured = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "tuned_2steps")}))
    assert measured.served.tok_s == pytest.approx(rep.best.tok_s, rel=0.01)
    assert rep.baseline.tok_s == pytest.approx(90.0, abs=0.3)
    share = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "fixed")},
                                 replay=str(INCIDENT / "replay_fixed.json"), verify_share=0.95))
    tuned = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "tuned")},
                                 replay=str(INCIDENT / "replay_fixed.json"), verify_share=0.9327))
    before = share.fit.point.verify_pass_s(RoundConfig(1))
    after = tuned.fit.point.verify_pass_s(RoundConfig(1))
    assert 1 - after / before == pytest.approx(0.27, abs=0.02)  # NCCL's cut, read back from the logs
    assert any(f.code == "verify-overhead" for f in share.findings)


# --- the command -----------------------------------------------------------------------------------

def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(plan_cmd, list(args), catch_exceptions=False)
    return res.exit_code, res.output


def test_cli_exit_codes_and_json() -> None:
    logs = [f"{n}={INCIDENT / (n + '.log')}" for n in ("baseline", "tuned", "tuned_3steps")]
    code, out = _cli(*logs, "--served", "tuned", "--replay", str(INCIDENT / "replay_fixed.json"), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == "eagleforensics-plan-v1" and doc["exit_code"] == 1
    assert doc["best"]["steps"] == 2 and doc["served"]["label"] == "tuned"
    assert {"runs", "costs", "acceptance", "predictions", "findings", "todo", "serving_gap"} <= set(doc)
    assert doc["costs"]["verify_ms"]["pinned"] and doc["costs"]["assumptions"][0]["code"] == "flat-verify"
    # served at the best: nothing to do
    code, out = _cli(*logs, f"{INCIDENT / 'tuned_2steps.log'}", "--served", "tuned_2steps",
                     "--replay", str(INCIDENT / "replay_fixed.json"))
    assert code == 0, out
    assert "the served 2 steps is the best" in out


@pytest.mark.parametrize("args, needle", [
    (["--replay", "nonexistent.json"], "no such replay JSON"),
    (["--served", "nope"], "--served 'nope' is not one of the runs"),
    (["--launch", "tuned=0"], "steps >= 1"),
    (["--launch", "tuned=3,4"], "needs its draft tokens"),
    (["--baseline", "tuned"], "ran with speculation"),
])
def test_cli_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    logs = [f"{n}={INCIDENT / (n + '.log')}" for n in ("baseline", "tuned")]
    res = CliRunner().invoke(plan_cmd, logs + args)
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output


def test_bad_replay_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "r.json"
    for doc, needle in (({"schema": "other"}, "schema"), ({"schema": "eagleforensics-replay-v1", "steps": 3,
                                                           "wirings": [{"label": "a", "source": "", "reach": [1.5]}]},
                                                          "outside [0, 1]"), ("[1, 2", "JSON")):
        bad.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        res = CliRunner().invoke(plan_cmd, [f"b={INCIDENT / 'baseline.log'}", f"t={INCIDENT / 'tuned.log'}",
                                            "--replay", str(bad)])
        assert res.exit_code == 2 and needle in res.output and "r.json" in res.output, res.output


def test_only_a_baseline_is_bad_input() -> None:
    res = CliRunner().invoke(plan_cmd, [str(INCIDENT / "baseline.log")])
    assert res.exit_code == 2 and "at least one speculative run" in res.output


def test_a_log_without_arguments_needs_launch(tmp_path: Path) -> None:
    text = [line for line in (INCIDENT / "tuned.log").read_text().splitlines() if "server_args=" not in line]
    (tmp_path / "noargs.log").write_text("\n".join(text) + "\n")
    logs = [f"baseline={INCIDENT / 'baseline.log'}", f"t={tmp_path / 'noargs.log'}"]
    res = CliRunner().invoke(plan_cmd, logs)
    assert res.exit_code == 2 and "--launch t=STEPS" in res.output
    code, out = _cli(*logs, "--launch", "t=1")
    assert code in (0, 1) and "t (served)" in out


def test_draft_tokens_rule() -> None:
    assert [draft_tokens_for(k, 1) for k in (1, 3, 8)] == [2, 4, 9]
    assert draft_tokens_for(5, 4) == 9 and draft_tokens_for(1, 8) == 9 and draft_tokens_for(2, 2) == 4


def test_suspects_read_each_engine_s_arguments() -> None:
    from eagleforensics.engines.serverargs import parse_server_args_line
    from eagleforensics.engines.suspects import SUSPECTS, match_suspects

    vllm = parse_server_args_line(
        "(APIServer pid=1) INFO 11-29 12:58:00 [startup.py:96] non-default args: {'model_tag': 'm', "
        "'speculative_config': {'method': 'eagle3', 'model': 'd', 'num_speculative_tokens': 3}, "
        "'enforce_eager': True, 'enable_prefix_caching': False, 'kv_transfer_config': {'kv_role': 'kv_consumer'}}")
    got = {m.suspect.code: (m.status, m.this_run) for m in match_suspects(vllm)}
    assert got["cuda-graph"] == ("matches", "CUDA graphs off in this run (enforce_eager=True): the drafter ran "
                                            "eagerly; compare a run with graphs on")
    assert got["prefix-cache"][0] == "ruled-out" and got["pd-disaggregation"][0] == "matches"
    assert "page-size" not in got and got["model-runner-v2"][0] == "unknown"  # vLLM >= 0.10.0: runner depends
    sgl = parse_server_args_line("[2026-11-29 10:00:00] server_args={'model_path': 'm', 'speculative_algorithm': "
                                 "'EAGLE3', 'speculative_num_steps': 5, 'speculative_eagle_topk': 4, "
                                 "'speculative_num_draft_tokens': 8, 'disaggregation_mode': 'decode', "
                                 "'page_size': 64, 'disable_cuda_graph': False, 'disable_radix_cache': True}")
    got = {m.suspect.code: m.status for m in match_suspects(sgl)}
    serving = ("chunked-prefill", "async-scheduling", "attention-backend", "verify-rule")  # issue 34: own tests
    assert set(serving) <= set(got)
    got = {k: v for k, v in got.items() if k not in serving}
    assert got == {"cuda-graph": "matches", "prefix-cache": "ruled-out", "pd-disaggregation": "matches",
                   "tree": "matches", "page-size": "matches", "release": "matches"}
    assert all(m.status == "unknown" for m in match_suspects(None))
    for s in SUSPECTS:  # every suspect rests on public threads
        assert s.sources and all("/" in src and "#" in src for src in s.sources)


def test_runs_from_two_deployments_do_not_fit_one_cost() -> None:
    """Before and after NCCL tuning at the same launch: two round times for one configuration, said, not averaged away."""
    rep = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "fixed", "tuned")}))
    bad = next(f for f in rep.findings if f.code == "fit-residual")
    assert "fixed" in bad.message and "tuned" in bad.message and rep.exit_code == 1
    same = make_plan(PlanInputs({n: str(INCIDENT / f"{n}.log") for n in ("baseline", "broken", "fixed")}))
    assert not any(f.code == "fit-residual" for f in same.findings)  # other drafter, same costs: they agree


def test_newer_replay_json_sampled_figure_and_tree_are_read(tmp_path: Path) -> None:
    """A replay run with --temperature: the gap is tested against the lower of its greedy and sampled figures."""
    doc = replay_doc(CHAIN, TREE, 1 + sum(TREE_REACH))
    sampled = chain_reach([0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25])
    doc["wirings"][0]["sampling"] = {"temperature": 0.7, "top_p": 1.0,
                                     "greedy_drafts": {"reach": CHAIN, "accept_length": 1 + sum(CHAIN)},
                                     "sampled_drafts": {"reach": sampled, "accept_length": 1 + sum(sampled)}}
    (tmp_path / "replay.json").write_text(json.dumps(doc))
    logs = write_runs(tmp_path, "sglang", "0.5.23", [(3, 1, None)], lines=60,
                      reach_for={(3, 1, None): sampled})
    rep = make_plan(PlanInputs(logs, replay=str(tmp_path / "replay.json")))
    assert rep.gap.expected == pytest.approx(1 + sum(sampled[:3])) and not rep.gap.found
    assert "temperature 0.7" in rep.gap_note


def test_a_vllm_token_tree_is_not_taken_for_a_chain(tmp_path: Path) -> None:
    logs = write_runs(tmp_path, "vllm", "0.33.0", [(3, 1, None)], lines=5)
    path = Path(logs["k3"])
    path.write_text(path.read_text().replace("'num_speculative_tokens': 3}",
                                             "'num_speculative_tokens': 3, 'speculative_token_tree': '[(0,), (1,)]'}"))
    res = CliRunner().invoke(plan_cmd, [f"{k}={v}" for k, v in logs.items()])
    assert res.exit_code == 2 and "vLLM token tree" in res.output and "--launch k3=" in res.output
    code, out = _cli(*[f"{k}={v}" for k, v in logs.items()], "--launch", "k3=3")
    assert code in (0, 1) and "k3 (served)" in out


def test_every_finding_code_is_documented_in_the_plan_page() -> None:
    import re

    from eagleforensics.plan import FINDING_CODES, TODO_CODES

    text = (ROOT / "docs" / "plan.md").read_text()
    section = text[:text.index("## The incident, worked through")]
    documented = set(re.findall(r"^\| `([a-z-]+)` \| (?:warning|info)", section, re.M))
    assert documented == set(FINDING_CODES) and set(TODO_CODES) <= documented
    source = (ROOT / "eagleforensics" / "plan.py").read_text()
    emitted = set(re.findall(r'Finding\(\s*"([a-z-]+)"', source))
    assert emitted == set(FINDING_CODES), emitted ^ set(FINDING_CODES)


def test_plan_reads_a_real_replay_json_with_its_tree(tmp_path: Path) -> None:
    """``eagleforensics replay --json --topk 2 --draft-tokens 5`` on the sample drafter: plan reads its reach and tree."""
    from eagleforensics.cli.replay import replay as replay_cmd

    samples = ROOT / "data_samples"
    res = CliRunner().invoke(replay_cmd, [str(samples / "drafter"), str(samples / "capture_sweep.safetensors"),
                                          "--train", str(samples / "record_layer_outputs.pt"), "--target",
                                          str(samples / "target"), "--engine", "sglang", "--steps", "4",
                                          "--topk", "2", "--draft-tokens", "5", "--json"])
    doc = json.loads(res.output)
    (tmp_path / "replay.json").write_text(res.output)
    fed = next(w for w in doc["wirings"] if "sglang" in w["source"])
    logs = write_runs(tmp_path, "sglang", "0.5.23", [(2, 1, None), (4, 1, None), (4, 2, 5)], lines=40,
                      reach_for={(2, 1, None): fed["reach"], (4, 1, None): fed["reach"],
                                 (4, 2, 5): fed["tree"]["depth_share"]})
    rep = make_plan(PlanInputs(logs, served="k4", replay=str(tmp_path / "replay.json")))
    assert rep.gap_wiring == fed["label"] and rep.gap.expected == pytest.approx(fed["accept_length"])
    tree = next(p for p in rep.predictions if p.config == RoundConfig(4, 2, 5))
    assert tree.accept == pytest.approx(fed["tree"]["accept_length"]) and "tree figure" in tree.accept_how
    assert "teacher-forced" in tree.accept_how  # this capture is a prompt: replay's chain and tree frames differ
    assert rep.curve.source.startswith(f"replay {fed['label']}") and rep.curve.measured_steps == 4
