"""probe against deployments as they are: vLLM counting past the cut, metrics off, routers over disagreeing back-ends,
SGLang's adaptive steps, vLLM's per-request metrics, and the positive control (``probe --control``).

The stand-ins (tests/probedeploy.py) are written from the cited releases' wheels; each binds 127.0.0.1 on an
ephemeral port and stops itself; every test runs under an alarm.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.cli.probe import probe as probe_cmd

from .probedeploy import Backend, Router, backend
from .test_probe import _alarm  # noqa: F401  (autouse: no probe test may hang)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("".join(f"Prompt number {i}: tell me about topic {i * 7 % 13}.\n" for i in range(16)))
    return p


def _probe(*args: str) -> tuple[int, str, dict | None]:
    res = CliRunner().invoke(probe_cmd, list(args))
    doc = json.loads(res.stdout) if "--json" in args and res.exit_code in (0, 1) else None
    return res.exit_code, res.output, doc


def _codes(doc: dict) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in doc["findings"]}


def _chain(q: float, k: int) -> float:
    return 1.0 + sum(q ** j for j in range(1, k + 1))


def _replay(tmp_path: Path, q: float, steps: int = 8) -> Path:
    """A replay JSON whose trained wiring (fed by the engine too) reaches q^j at step j."""
    doc = json.loads((ROOT / "data_samples" / "incident" / "replay.json").read_text())
    w = [x for x in doc["wirings"] if x["label"] == doc["trained"]][0]
    w.update({"acc": [q] * steps, "cond": [q] * steps, "reach": [q ** j for j in range(1, steps + 1)],
              "accept_length": _chain(q, steps), "steps": steps})
    doc["wirings"], doc["steps"] = [w], steps
    path = tmp_path / f"replay_{q}.json"
    path.write_text(json.dumps(doc))
    return path


# -- 1. counts as vLLM counts them -------------------------------------------------------------------

@pytest.mark.parametrize("release", ["0.10.1.1", "0.34.0"])
@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_vllm_counts_past_the_cut_is_not_other_traffic(release: str, concurrency: str, prompts: Path) -> None:
    """k=7 at 0.92 a step: vLLM counts the last round's accepted drafts before cutting at max_tokens or EOS; a
    probe with no other client reports the figure and no 'other traffic'."""
    for eos in (None, 200):
        with backend(Backend(engine="vllm", release=release, k=7, q=0.92, eos_at=eos)) as s:
            code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--concurrency",
                                    concurrency, "--json")
        assert code == 0, out
        assert "counters-moved" not in _codes(doc), out
        acc = doc["acceptance"]
        assert acc["called"] and all(w["status"] == "ok" for w in doc["windows"])
        assert abs(acc["accept_length"] - _chain(0.92, 7)) < max(4 * acc["accept_length_se"], 0.3), out
        if eos is not None:
            assert {r["finish_reason"] for r in doc["requests"]} == {"stop"}


def test_vllm_other_traffic_still_caught(prompts: Path) -> None:
    """The slack is the engine's overshoot, not a blanket: a window moved by another client's request is dropped."""
    with backend(Backend(engine="vllm", release="0.34.0", k=7, q=0.92, other_on=(3,))) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--json")
    assert code == 0 and _codes(doc).get("counters-moved") == "info", out
    assert [w["status"] for w in doc["windows"]].count("moved") == 1 and doc["windows"][3]["status"] == "moved"


# -- 3. metrics disabled is not "no speculation" -----------------------------------------------------

def test_disable_log_stats_is_named(prompts: Path) -> None:
    with backend(Backend(engine="vllm", release="0.34.0", k=3, q=0.6, log_stats=False)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--json")
    codes = _codes(doc)
    assert code == 1 and codes.get("metrics-disabled") == "warning" and "no-speculation" not in codes, out
    assert "metrics disabled: acceptance cannot be read" in doc["verdict"]
    assert any("--disable-log-stats" in f["fix"] for f in doc["findings"] if f["code"] == "metrics-disabled")


def test_no_speculation_is_still_no_speculation(prompts: Path) -> None:
    """Clean: a vLLM server with stats on and no speculative config is 'no speculative decoding', not metrics off."""
    with backend(Backend(engine="vllm", release="0.34.0", k=0)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--json")
    codes = _codes(doc)
    assert code == 0 and "no-speculation" in codes and "metrics-disabled" not in codes, out


# -- 5. vLLM's per-request metrics --------------------------------------------------------------------

def test_vllm_per_request_metrics_carry_the_figure(prompts: Path) -> None:
    """0.29+: metrics.speculative_decoding per request, even with --disable-log-stats."""
    with backend(Backend(engine="vllm", release="0.29.0", k=3, q=0.6, log_stats=False, per_request="summary")) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--concurrency", "4",
                                "--json")
    assert code == 0, out
    acc = doc["acceptance"]
    assert acc["called"] and acc["units"] == 16 and acc["accept_length_se"] > 0
    assert abs(acc["accept_length"] - _chain(0.6, 3)) < max(4 * acc["accept_length_se"], 0.1)
    assert _codes(doc).get("metrics-disabled") == "info" and "metrics disabled" not in doc["verdict"]
    assert all(r["rounds"] for r in doc["requests"])
    assert len(acc["per_position_acceptance"]) == 3


def _other_client(url: str, engine: str, n: int) -> None:
    """Another client's requests, straight to the server (not through probe)."""
    import urllib.request

    for i in range(n):
        body = ({"text": f"another client {i}", "sampling_params": {"max_new_tokens": 200}} if engine == "sglang" else
                {"model": "m", "prompt": f"another client {i}", "max_tokens": 200})
        req = urllib.request.Request(url + ("/generate" if engine == "sglang" else "/v1/completions"),
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()


@pytest.mark.parametrize("engine,release", [("sglang", "0.5.23"), ("vllm", "0.34.0")])
def test_window_between_two_probe_runs(engine: str, release: str, prompts: Path, tmp_path: Path) -> None:
    """SGLang's own averages are since start: --since differences the earlier probe's last read of the server-wide
    counters and this probe's first, so the figure is the traffic between the two runs only."""
    first = tmp_path / "first.json"
    with backend(Backend(engine=engine, release=release, k=3, q=0.6)) as s:
        code, out, _ = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--out", str(first))
        assert code == 0, out
        s.b.q = 0.3  # the server got worse after the first probe: the traffic between runs accepts less
        _other_client(s.url, engine, 12)
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--since", str(first),
                                "--json")
    assert code == 0, out
    b = doc["between_runs"]
    assert b["accept_length"] is not None and b["rounds"] > 200, b
    assert abs(b["accept_length"] - _chain(0.3, 3)) < max(4 * b["accept_length_se"], 0.05), b
    assert abs(doc["acceptance"]["accept_length"] - _chain(0.3, 3)) < 0.15  # this probe's own, after the change


def test_since_from_the_log_without_counters(prompts: Path, tmp_path: Path) -> None:
    """SGLang without --enable-metrics: no counters, so the window between the runs comes from the server's log
    (its decode lines between the two probes); without --log it is said not measured."""
    import time

    first, log = tmp_path / "first.json", tmp_path / "server.log"
    with backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.6, enable_metrics=False, log=str(log))) as s:
        code, out, _ = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--out", str(first))
        assert code == 0, out
        time.sleep(1.1)  # the log stamps whole seconds: the window's edges are a second wide
        s.b.q = 0.3
        _other_client(s.url, "sglang", 12)
        time.sleep(1.1)
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--since", str(first),
                                "--json")
        assert code == 0 and doc["between_runs"]["accept_length"] is None and "--enable-metrics" in \
            doc["between_runs"]["note"], out
        time.sleep(1.1)
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--since", str(first),
                                "--log", str(log), "--json")
    assert code == 0, out
    b = doc["between_runs"]
    assert b["log"]["lines"] == 12 + 16, b  # the other client's 12 and the probe just before this one
    assert b["accept_length"] is not None and b["rounds"] is None
    assert abs(b["accept_length"] - _chain(0.3, 3)) < 0.15  # per-line figures of 64-token requests at 0.3 a step


def test_log_needs_since(prompts: Path, tmp_path: Path) -> None:
    code, out, _ = _probe("http://127.0.0.1:9", "--prompts", str(prompts), "--log", str(tmp_path / "x.log"))
    assert code == 2 and "--since" in out and len(out.strip().splitlines()) == 1


# -- 2. deployments: routers and disagreeing requests ---------------------------------------------------

def test_router_whose_metrics_are_one_backends(prompts: Path) -> None:
    """Two vLLM back-ends at 2.90 and 1.45 behind a router whose /metrics is the first one's."""
    a = backend(Backend(engine="vllm", release="0.34.0", k=3, q=0.79, seed=1))
    b = backend(Backend(engine="vllm", release="0.34.0", k=3, q=0.32, seed=2))
    with a, b, Router([a, b], metrics_from=0) as r:
        code, out, doc = _probe(r.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    codes = _codes(doc)
    assert code == 1 and codes.get("one-backend-metrics") == "warning", out
    assert "ONE BACK-END" in doc["verdict"] and "router" in doc["verdict"]
    assert doc["deployment"]["metrics_backend_requests"] == list(range(0, 16, 2))


def test_router_whose_metrics_are_one_backends_four_at_a_time(prompts: Path) -> None:
    """The same pool probed 4 at a time: one window, holding about half of the probe's tokens."""
    a = backend(Backend(engine="vllm", release="0.34.0", k=3, q=0.79, seed=1))
    b = backend(Backend(engine="vllm", release="0.34.0", k=3, q=0.32, seed=2))
    with a, b, Router([a, b], metrics_from=0) as r:
        code, out, doc = _probe(r.url, "--prompts", str(prompts), "--max-tokens", "128", "--concurrency", "4",
                                "--json")
    assert code == 1 and _codes(doc).get("one-backend-metrics") == "warning", out
    assert 0.3 < doc["deployment"]["metrics_share_of_probe_tokens"] < 0.7


def test_router_with_per_request_metrics_splits_the_requests(prompts: Path) -> None:
    """The same pool with vLLM 0.29's per-request metrics: the requests disagree, the split is the two back-ends."""
    a = backend(Backend(engine="vllm", release="0.29.0", k=3, q=0.79, seed=1, per_request="summary"))
    b = backend(Backend(engine="vllm", release="0.29.0", k=3, q=0.32, seed=2, per_request="summary"))
    with a, b, Router([a, b], metrics_from=0) as r:
        code, out, doc = _probe(r.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 1 and _codes(doc).get("requests-disagree") == "warning", out
    low, high = doc["deployment"]["heterogeneity"]["split"]
    assert sorted(low["units"]) == list(range(1, 16, 2)) and sorted(high["units"]) == list(range(0, 16, 2))
    assert abs(low["accept_length"] - 1.455) < 0.15 and abs(high["accept_length"] - 2.907) < 0.25
    assert abs(doc["acceptance"]["accept_length"] - 1.91) < 0.25  # the pool's figure
    assert doc["acceptance"]["per"] == "request" and "ONE BACK-END" not in doc["verdict"]
    assert _codes(doc).get("one-backend-metrics") == "info"  # said, but each reply carries its own figure


def test_sglang_router_requests_disagree_and_backends_differ(prompts: Path) -> None:
    a = backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.79, seed=1, port_tag=30001))
    b = backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.32, seed=2, port_tag=30002))
    with a, b, Router([a, b], metrics_from=None) as r:
        code, out, doc = _probe(r.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    codes = _codes(doc)
    assert code == 1 and codes.get("requests-disagree") == "warning" and codes.get("backends-differ") == "warning", out
    assert "requests disagree" in doc["verdict"] and "router" in doc["verdict"]
    low, high = doc["deployment"]["heterogeneity"]["split"]
    assert len(low["units"]) == len(high["units"]) == 8
    assert abs(high["accept_length"] - low["accept_length"]) > 1.0


@pytest.mark.parametrize("engine,release", [("sglang", "0.5.23"), ("vllm", "0.34.0"), ("vllm", "0.29.0")])
def test_one_backend_raises_no_deployment_finding(engine: str, release: str, prompts: Path) -> None:
    """Clean: one healthy back-end (directly, and behind a router over one) names no pool and no disagreement."""
    per = "summary" if release == "0.29.0" else "none"
    with backend(Backend(engine=engine, release=release, k=3, q=0.6, per_request=per)) as s:
        for url in (s.url,):
            code, out, doc = _probe(url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
            codes = _codes(doc)
            assert code == 0, out
            assert not {"requests-disagree", "backends-differ", "one-backend-metrics"} & set(codes), out
            assert doc["deployment"]["heterogeneity"]["disagree"] is False


def test_prompts_of_two_kinds_disagree_without_a_pool(tmp_path: Path) -> None:
    """Clean for the pool: one back-end, prose then code prompts that accept differently: the requests disagree
    (said, info), but nothing ties the split to back-ends, so no warning and exit 0."""
    p = tmp_path / "kinds.txt"
    p.write_text("".join(f"Tell a story about place {i}.\n" for i in range(8)) +
                 "".join(f"Write code that sorts list {i}.\n" for i in range(8)))
    with backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.32, q_code=0.79)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(p), "--max-tokens", "128", "--json")
    assert code == 0 and _codes(doc).get("requests-disagree") == "info", out
    assert doc["deployment"]["heterogeneity"]["pool_evidence"] == []
    assert "backends-differ" not in _codes(doc)


# -- 4. steps as served ------------------------------------------------------------------------------

@pytest.mark.parametrize("metrics", [True, False])
def test_sglang_adaptive_steps_are_read(metrics: bool, prompts: Path, tmp_path: Path) -> None:
    """Launched at 7 steps, running at 3: the gap test compares against replay at 3 steps (2.53), no false gap."""
    replay = _replay(tmp_path, 0.7)
    with backend(Backend(engine="sglang", release="0.5.23", k=7, q=0.7, adaptive=True, running=3, adapt_after=20,
                         enable_metrics=metrics)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--replay", str(replay),
                                "--json")
    codes = _codes(doc)
    assert code == 0 and "adaptive-steps" in codes and "serving-gap" not in codes, out
    assert doc["deployment"]["steps"]["launched"] == 7 and doc["deployment"]["steps"]["running"] == 3
    assert doc["run"]["server_args"]["num_steps"] == 3 and doc["run"]["server_args"]["launch_num_steps"] == 7
    assert abs(doc["serving_gap"]["expected"] - _chain(0.7, 3)) < 0.01
    msg = next(f["message"] for f in doc["findings"] if f["code"] == "adaptive-steps")
    assert ("sglang:spec_num_steps" in msg) == metrics and ("per-position" in msg) != metrics


def test_sglang_fixed_steps_no_adaptive_finding(prompts: Path, tmp_path: Path) -> None:
    replay = _replay(tmp_path, 0.7)
    with backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.7)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--replay", str(replay),
                                "--json")
    assert code == 0 and "adaptive-steps" not in _codes(doc) and "steps" not in doc["deployment"], out


# -- 6. the positive control ------------------------------------------------------------------------------

def _records(tmp_path: Path) -> list[str]:
    from eagleforensics.testing.chat import write_tokenizer

    target = write_tokenizer(tmp_path / "target")
    return ["--train", str(ROOT / "data_samples" / "data_0.ckpt"), "--target", str(target)]


def test_control_on_the_incident_names_the_serving_side(tmp_path: Path) -> None:
    """The incident: trained p3,p17,p30 (replay 1.47 at one step) served reading p2,p16,p29 (0.19 a step)."""
    replay = ROOT / "data_samples" / "incident" / "replay.json"
    with backend(Backend(engine="sglang", release="0.5.23", k=1, q=0.19)) as s:
        code, out, doc = _probe(s.url, *_records(tmp_path), "--requests", "8", "--max-tokens", "256",
                                "--replay", str(replay), "--control", "--json")
    assert code == 1 and _codes(doc).get("control-loss") == "warning" and "control-holds" not in _codes(doc), out
    c = doc["control"]
    assert c["found"] and abs(c["expected"] - 1.47) < 0.01 and abs(c["gap"] - 0.28) < 0.06 and c["gap"] > c["bar"]
    msg = next(f["message"] for f in doc["findings"] if f["code"] == "control-loss")
    assert "serving side" in msg and "+-" in msg
    assert "control: the server loses" in doc["verdict"]


def test_control_on_a_healthy_server_loses_nothing(tmp_path: Path) -> None:
    replay = ROOT / "data_samples" / "incident" / "replay.json"
    with backend(Backend(engine="sglang", release="0.5.23", k=1, q=0.47)) as s:
        code, out, doc = _probe(s.url, *_records(tmp_path), "--requests", "8", "--max-tokens", "256",
                                "--replay", str(replay), "--control", "--json")
    codes = _codes(doc)
    assert code == 0 and "control-loss" not in codes and "control-holds" in codes, out
    assert not doc["control"]["found"] and "accepts what the drafter can" in doc["verdict"]


def test_control_replays_the_drafter_on_the_records_it_sends(tmp_path: Path) -> None:
    """--control --drafter: the CLI replays the drafter on the record (its trained wiring, the target's lm_head:
    2.375 at 3 steps) and probe sends the same record: a server that accepts as the drafter can holds, one at
    0.2 a step loses past the bar."""
    from eagleforensics.testing.chat import write_tokenizer

    target = tmp_path / "target"  # a target directory as a user has it: weights and tokenizer together
    target.mkdir()
    for f in (ROOT / "data_samples" / "target").iterdir():
        (target / f.name).symlink_to(f)
    write_tokenizer(target)
    args = ["--train", str(ROOT / "data_samples" / "data_0.ckpt"), "--target", str(target),
            "--drafter", str(ROOT / "data_samples" / "drafter"), "--requests", "8",
            "--max-tokens", "256", "--control", "--json"]
    with backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.675)) as s:
        code, out, doc = _probe(s.url, *args)
    assert code == 0 and "control-holds" in _codes(doc), out
    assert abs(doc["control"]["expected"] - 2.375) < 0.02 and not doc["control"]["found"]
    with backend(Backend(engine="sglang", release="0.5.23", k=3, q=0.2)) as s:
        code, out, doc = _probe(s.url, *args)
    assert code == 1 and _codes(doc).get("control-loss") == "warning", out
    assert doc["control"]["gap"] > doc["control"]["bar"] > 0


def test_control_needs_records_and_replay(prompts: Path) -> None:
    code, out, _ = _probe("http://127.0.0.1:9", "--prompts", str(prompts), "--control")
    assert code == 2 and "--control" in out and len(out.strip().splitlines()) == 1


def test_probepool_units() -> None:
    """The arithmetic on its own: the chi-square tail, the runs test, the split, served steps, the slack."""
    from eagleforensics.engines.probecounts import has_vllm_family, overshoot, request_spec, served_steps
    from eagleforensics.evidence.probepool import alternation_z, chi2_tail, heterogeneity, histogram_variance

    assert abs(chi2_tail(30.58, 15) - 0.01) < 0.002 and abs(chi2_tail(7.26, 15) - 0.95) < 0.01
    assert alternation_z([True, False] * 8) > 3 and alternation_z([True] * 8 + [False] * 8) < -3
    assert histogram_variance([1, 0, 1]) == 1.0
    het = heterogeneity([300, 290, 150, 145], [100, 100, 100, 100], [0.05] * 4)
    assert het is not None and het.disagree and het.low.members == (2, 3) and het.high.members == (0, 1)
    assert not heterogeneity([300, 302, 298, 301], [100] * 4, [0.05] * 4).disagree
    assert heterogeneity([1, 2, 3], [1, 1, 1], [0.1] * 3) is None  # too few units
    assert served_steps((0.69, 0.49, 0.34, 0.004, 0.002)) == 3 and served_steps((0.47, 0.22, 0.10, 0.05)) is None
    assert overshoot("0.10.1.1", 7, "length") == 7 and overshoot("0.34.0", 7, "length") == 6
    assert overshoot("0.34.0", 7, "stop") == 7 and overshoot("0.34.0", None, "stop") == 0
    assert overshoot("0.33.0", 7, "length") == 6 and overshoot("0.29.0", 7, "length") == 7
    assert has_vllm_family("# TYPE vllm:num_requests_running gauge\n") and not has_vllm_family("python_info 1\n")
    good = {"metrics": {"speculative_decoding": {"acceptance_histogram": [1, 2, 3], "num_spec_steps": 6,
                                                 "num_accepted_draft_tokens": 8, "num_draft_tokens": 12,
                                                 "num_spec_tokens": 2}}}
    spec = request_spec(good)
    assert spec is not None and abs(spec.accept_length - (1 + 8 / 6)) < 1e-9
    good["metrics"]["speculative_decoding"]["num_spec_steps"] = 7  # does not add up: not read
    assert request_spec(good) is None and request_spec({"metrics": None}) is None


def test_plan_reads_the_steps_an_adaptive_server_runs(prompts: Path, tmp_path: Path) -> None:
    """plan takes the probe run at the steps actually run (3), not the launch's 7: no false serving gap there."""
    from eagleforensics.cli.plan import plan as plan_cmd

    replay = _replay(tmp_path, 0.7)
    run = tmp_path / "adaptive.json"
    with backend(Backend(engine="sglang", release="0.5.23", k=7, q=0.7, adaptive=True, running=3)) as s:
        code, out, _ = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--out", str(run))
    assert code == 0, out
    res = CliRunner().invoke(plan_cmd, [f"spec={run}", "--replay", str(replay), "--max-topk", "1", "--json"])
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    served = next(r for r in doc["runs"] if r["label"] == "spec")
    assert served["config"]["steps"] == 3
    assert doc["serving_gap"] is not None and not doc["serving_gap"]["found"]
