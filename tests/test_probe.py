"""``eagleforensics probe`` against stand-in servers speaking each supported release's HTTP formats, over real HTTP.

Every server binds 127.0.0.1 on an ephemeral port (tests/probeservers.py); every test runs under an
alarm, every subprocess under a timeout, every handler's wait is bounded.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagleforensics.cli.probe import probe as probe_cmd

from .probeservers import Plan, StandIn

ROOT = Path(__file__).resolve().parents[1]
RELEASES = [("sglang", "0.4.6"), ("sglang", "0.5.3"), ("sglang", "0.5.13"), ("vllm", "0.7.3"), ("vllm", "0.8.4"),
            ("vllm", "0.11.0")]
TEST_LIMIT = 60  # seconds, per test


@pytest.fixture(autouse=True)
def _alarm():
    """No probe test may hang: SIGALRM fails it after TEST_LIMIT seconds."""
    def boom(*_: object) -> None:
        raise TimeoutError(f"probe test ran past {TEST_LIMIT} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(TEST_LIMIT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture()
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("Tell me about the sea.\nWrite a poem about trees.\n"
                 '{"prompt": "Explain gravity to a child."}\nWhat is a prime number?\n')
    return p


def _probe(*args: str) -> tuple[int, str, dict | None]:
    res = CliRunner().invoke(probe_cmd, list(args))
    doc = None
    if "--json" in args and res.exit_code in (0, 1):
        doc = json.loads(res.stdout)
    return res.exit_code, res.output, doc


def _codes(doc: dict) -> set[str]:
    return {f["code"] for f in doc["findings"]}


def _expected(q: float, steps: int) -> float:
    return 1.0 + sum(q ** j for j in range(1, steps + 1))


@pytest.mark.parametrize("engine,release", RELEASES)
def test_healthy_server_each_release(engine: str, release: str, prompts: Path) -> None:
    with StandIn(Plan(engine=engine, release=release)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 0, out
    assert doc["schema"] == "eagleforensics-probe-v1" and doc["verdict"].startswith("healthy")
    acc = doc["acceptance"]
    assert acc["called"] and acc["rounds"] >= 200
    # the stand-in's chain accepts each next draft with q = 0.47: 1 + q + q^2 + q^3
    assert abs(acc["accept_length"] - _expected(0.47, 3)) < max(4 * acc["accept_length_se"], 0.05)
    assert acc["accept_length_se"] > 0
    assert (acc["per_position_acceptance"] is not None) == (release in ("0.5.13", "0.11.0"))
    assert doc["run"]["server_args"]["num_steps"] == 3 and doc["server"]["engine"] == engine
    assert doc["server"]["version"] == release and "release-unknown" not in _codes(doc)
    assert s.url not in out and "127.0.0.1" not in out  # the address is never written unless asked
    assert all(r["tok_s"] and r["tok_s"] > 0 for r in doc["requests"])


def test_engine_is_named_when_the_release_is_unknown(prompts: Path) -> None:
    with StandIn(Plan(engine="sglang", release="0.5.99")) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 0 and "release-unknown" in _codes(doc)
    assert any("0.5.99" in f["message"] for f in doc["findings"])


@pytest.mark.parametrize("engine,release", [("sglang", "0.5.13"), ("vllm", "0.7.3")])
def test_speculative_output_differs_from_baseline(engine: str, release: str, prompts: Path) -> None:
    with StandIn(Plan(engine=engine, release=release, differ_at=40)) as spec, \
            StandIn(Plan(engine=engine, release=release, speculative=False)) as base:
        code, out, doc = _probe(spec.url, "--baseline", base.url, "--prompts", str(prompts), "--max-tokens", "128",
                                "--json")
        assert code == 1 and "greedy-differs" in _codes(doc) and doc["verdict"].startswith("UNHEALTHY")
        assert doc["baseline"]["differing_outputs"] == 4
        by_text = release == "0.7.3"  # no token ids in 0.7.3's completions: compared by text
        assert ("compared-by-text" in _codes(doc)) == by_text
        if not by_text:
            assert {r["differs_from_baseline_at"] for r in doc["requests"]} == {40}
        # control: the same baseline against a server that writes the same greedy text
        with StandIn(Plan(engine=engine, release=release)) as same:
            code, out, doc = _probe(same.url, "--baseline", base.url, "--prompts", str(prompts), "--max-tokens",
                                    "128", "--json")
    assert code == 0 and "greedy-differs" not in _codes(doc) and doc["baseline"]["differing_outputs"] == 0


@pytest.mark.parametrize("engine,release", [("sglang", "0.4.6"), ("vllm", "0.11.0")])
def test_accept_length_one(engine: str, release: str, prompts: Path) -> None:
    with StandIn(Plan(engine=engine, release=release, q=0.0)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 1 and "accepts-nothing" in _codes(doc), out
    assert doc["acceptance"]["accept_length"] < 1.05 and doc["acceptance"]["called"]


def _replay_trained_only(tmp_path: Path) -> Path:
    """The incident's replay JSON with only its trained wiring (reach 0.47^j): what the engine feeds is what was
    trained, so replay expects 1 + q + q^2 + q^3 = 1.79 at 3 steps."""
    doc = json.loads((ROOT / "data_samples" / "incident" / "replay.json").read_text())
    doc["wirings"] = [w for w in doc["wirings"] if w["label"] == doc["trained"]]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("engine,release", [("sglang", "0.5.13"), ("vllm", "0.11.0")])
def test_serving_gap_against_replay(engine: str, release: str, prompts: Path, tmp_path: Path) -> None:
    replay = _replay_trained_only(tmp_path)
    with StandIn(Plan(engine=engine, release=release, q=0.25)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--replay", str(replay),
                                "--json")
    assert code == 1 and "serving-gap" in _codes(doc), out
    gap = doc["serving_gap"]
    assert gap["found"] and abs(gap["expected"] - 1.79) < 0.01 and gap["gap"] > gap["bar"]
    with StandIn(Plan(engine=engine, release=release, q=0.47)) as s:  # control: accepts what replay expects
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--replay", str(replay),
                                "--json")
    assert code == 0 and not doc["serving_gap"]["found"] and "serving-gap" not in _codes(doc), out


def test_serving_gap_above_and_temperature(prompts: Path, tmp_path: Path) -> None:
    """A server above replay's figure is said (info); a probe at a temperature replay did not run has no expectation."""
    replay = _replay_trained_only(tmp_path)
    with StandIn(Plan(engine="sglang", release="0.5.13", q=0.8)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--replay", str(replay),
                                "--json")
        assert code == 0 and "serving-gap-above" in _codes(doc) and "serving-gap" not in _codes(doc), out
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--replay", str(replay),
                                "--temperature", "0.7", "--json")
    assert code == 0 and doc["serving_gap"] is None and "temperature 0.7" in doc["serving_gap_note"]
    assert not {"serving-gap", "serving-gap-above"} & _codes(doc)


def test_records_prompts_decoded_with_the_targets_tokenizer(tmp_path: Path) -> None:
    """--train sends the records' prompt ids (up to the loss mask) and decodes them with the target's tokenizer."""
    from eagleforensics.io.training import load_training
    from eagleforensics.testing.chat import write_tokenizer

    target = write_tokenizer(tmp_path / "target")
    records = [ROOT / "data_samples" / n for n in ("data_0.ckpt", "record_layer_outputs.pt")]
    replay = _replay_trained_only(tmp_path)
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        code, out, doc = _probe(s.url, *[a for r in records for a in ("--train", str(r))], "--target", str(target),
                                "--requests", "4", "--max-tokens", "128", "--replay", str(replay), "--json")
        sent = [e["body"]["input_ids"] for e in s.plan.seen if e["method"] == "POST"]
    assert code == 0, out
    rec = load_training(records[0])
    first = [int(m) for m in rec.loss_mask].index(1)
    assert sent[0] == [int(v) for v in rec.input_ids[:first]] and sent[2] == sent[0]  # reused in turn
    assert [r["prompt"] for r in doc["requests"]] == ["data_0.ckpt", "record_layer_outputs.pt"] * 2
    assert doc["serving_gap"] is not None and not doc["serving_gap"]["found"]


def test_train_needs_the_target(tmp_path: Path) -> None:
    code, out, _ = _probe("http://127.0.0.1:9", "--train", str(ROOT / "data_samples" / "data_0.ckpt"))
    assert code == 2 and "--target" in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("release", ["0.7.3", "0.11.0"])
def test_counters_moved_by_other_traffic(release: str, prompts: Path) -> None:
    with StandIn(Plan(engine="vllm", release=release, other_traffic=1)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 1 and "counters-moved" in _codes(doc), out
    assert all(w["status"] == "moved" for w in doc["windows"])
    assert not doc["acceptance"]["called"] and doc["run"]["accept_length"] is None  # nothing called from them
    assert "moved by other traffic in every window" in doc["verdict"] and "too-few-rounds" not in _codes(doc)


def test_one_window_moved_the_rest_called(prompts: Path) -> None:
    """Other traffic during one request: that window is dropped and said, the figure rests on the other three."""
    with StandIn(Plan(engine="vllm", release="0.11.0", other_traffic=2, other_on=(1,))) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--json")
    assert [w["status"] for w in doc["windows"]] == ["ok", "moved", "ok", "ok"]
    moved = next(f for f in doc["findings"] if f["code"] == "counters-moved")
    assert code == 0 and moved["severity"] == "info" and "1 of 4 windows" in moved["message"]  # said, not a to-do
    acc = doc["acceptance"]
    assert acc["called"] and acc["units"] == 3 and abs(acc["accept_length"] - _expected(0.47, 3)) < 0.15
    assert doc["requests"][1]["accept_length"] is None and doc["requests"][0]["accept_length"] > 1


def test_vllm_084_checks_each_window_against_k(prompts: Path) -> None:
    """0.8.4 counts no drafts: k comes from the probe's own tokens, and a window that disagrees with it is dropped."""
    with StandIn(Plan(engine="vllm", release="0.8.4", other_traffic=2, other_on=(2,))) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "256", "--json")
    assert [w["status"] for w in doc["windows"]] == ["ok", "ok", "moved", "ok"], out
    assert doc["run"]["server_args"]["num_steps"] == 3 and "counters-moved" in _codes(doc)
    assert abs(doc["acceptance"]["accept_length"] - _expected(0.47, 3)) < 0.15 and code == 0


def test_vllm_082_cannot_show_speculation(prompts: Path) -> None:
    with StandIn(Plan(engine="vllm", release="0.8.2")) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--json")
    assert code == 0 and "no-speculation" in _codes(doc)
    assert any("cannot be seen" in f["message"] for f in doc["findings"])


def test_counters_that_never_publish(prompts: Path) -> None:
    with StandIn(Plan(engine="vllm", release="0.7.3", publish=False)) as s:
        t0 = time.monotonic()
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--settle", "1", "--json")
    assert code == 1 and "counters-short" in _codes(doc) and time.monotonic() - t0 < 15, out


def test_too_few_rounds_are_not_called(prompts: Path) -> None:
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "16", "--requests", "2", "--json")
    assert code == 1 and "too-few-rounds" in _codes(doc)
    assert not doc["acceptance"]["called"] and doc["acceptance"]["rounds"] < 200
    assert "not called" in doc["verdict"] and f"{doc['acceptance']['rounds']:.0f} rounds" in doc["verdict"]


def test_a_renamed_field_is_said_not_guessed(prompts: Path) -> None:
    drop = ("spec_verify_ct", "spec_accept_length", "spec_correct_drafts_histogram", "spec_accept_histogram")
    with StandIn(Plan(engine="sglang", release="0.6.0", drop=drop)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 1 and {"too-few-rounds", "release-unknown"} <= _codes(doc)
    message = next(f["message"] for f in doc["findings"] if f["code"] == "too-few-rounds")
    assert "no reply carries spec_verify_ct" in message and doc["acceptance"]["accept_length"] is None


def test_degenerate_output(prompts: Path) -> None:
    with StandIn(Plan(engine="vllm", release="0.11.0", degenerate=True)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--json")
    assert code == 1 and "degenerate-output" in _codes(doc) and doc["verdict"].startswith("UNHEALTHY")


@pytest.mark.parametrize("engine,release", [("sglang", "0.5.13"), ("vllm", "0.11.0"), ("vllm", "0.8.4")])
def test_server_without_speculation(engine: str, release: str, prompts: Path) -> None:
    """0.8.4 declares its counters at 0 whether or not it speculates: they stay at 0."""
    with StandIn(Plan(engine=engine, release=release, speculative=False)) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--json")
    assert code == 0 and "no-speculation" in _codes(doc) and "no speculative decoding" in doc["verdict"]
    assert doc["run"]["speculative"] is False and doc["run"]["tok_s"] > 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_stalled_server_ends_in_one_line(engine: str, prompts: Path) -> None:
    with StandIn(Plan(engine=engine, release="0.5.13" if engine == "sglang" else "0.11.0", stall=True)) as s:
        t0 = time.monotonic()
        code, out, _ = _probe(s.url, "--prompts", str(prompts), "--timeout", "1")
        took = time.monotonic() - t0
    assert code == 2 and took < 10
    assert len(out.strip().splitlines()) == 1 and "reply headers within 1 s" in out and "stalled" in out


@pytest.mark.parametrize("engine,release,kind", [("sglang", "0.5.13", "json"), ("sglang", "0.4.6", "fields"),
                                                 ("vllm", "0.11.0", "fields"), ("vllm", "0.7.3", "json"),
                                                 ("vllm", "0.11.0", "metrics")])
def test_malformed_replies_end_in_one_line(engine: str, release: str, kind: str, prompts: Path) -> None:
    with StandIn(Plan(engine=engine, release=release, malformed=kind)) as s:
        code, out, _ = _probe(s.url, "--prompts", str(prompts), "--engine", engine)
    assert code == 2 and len(out.strip().splitlines()) == 1 and out.startswith("eagleforensics: error:"), out
    assert {"json": "not JSON", "fields": "not what the engine sends", "metrics": "not Prometheus"}[kind] in out


def test_no_server_and_bad_options(prompts: Path) -> None:
    code, out, _ = _probe("http://127.0.0.1:9", "--prompts", str(prompts), "--engine", "sglang", "--timeout", "2")
    assert code == 2 and len(out.strip().splitlines()) == 1
    code, out, _ = _probe("http://127.0.0.1:9", "--prompts", str(prompts), "--baseline", "http://127.0.0.1:9",
                          "--temperature", "0.7")
    assert code == 2 and "--temperature must be 0" in out
    code, out, _ = _probe("ftp://127.0.0.1:9", "--prompts", str(prompts))
    assert code == 2 and "http(s)" in out


def test_ctrl_c_leaves_nothing(prompts: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with StandIn(Plan(engine="sglang", release="0.5.13", stall=True)) as s:
        proc = subprocess.Popen([sys.executable, "-m", "eagleforensics", "probe", s.url, "--prompts", str(prompts),
                                 "--out", str(out_dir / "run.json"), "--report", str(out_dir / "run.html")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                # a shell's background job starts with SIGINT ignored, and Python keeps it so:
                                # the child gets the default, as a command typed in a terminal has
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            assert s.requests.wait(30), "the probe never sent its request"
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    assert proc.returncode == 2, stderr
    assert stderr.strip().splitlines() == ["eagleforensics: error: interrupted (Ctrl-C): the probe stopped; no file "
                                           "was left half-written"]
    assert list(out_dir.iterdir()) == []  # no run, no report, no temporary file


def test_api_key_is_sent_and_never_written(prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_TEST_KEY", "sk-secret-123")
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--api-key-env",
                                "PROBE_TEST_KEY", "--json", "--out", str(tmp_path / "run.json"), "--report",
                                str(tmp_path / "run.html"))
        auth = {e["auth"] for e in s.plan.seen}
        assert auth == {"Bearer sk-secret-123"}
        written = (tmp_path / "run.json").read_text() + (tmp_path / "run.html").read_text()
        assert "sk-secret" not in out + written and s.url not in out + written
        code, out, doc = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "64", "--json", "--show-url")
        assert doc["server"]["url"] == s.url  # asked for


def test_plan_reads_probe_runs_like_logs(prompts: Path, tmp_path: Path) -> None:
    """A probe of the plain server and one of the speculative server are the runs plan fits, with the serving gap."""
    from eagleforensics.cli.plan import plan as plan_cmd

    replay = _replay_trained_only(tmp_path)
    with StandIn(Plan(engine="sglang", release="0.5.13", speculative=False, round_s=0.002)) as base, \
            StandIn(Plan(engine="sglang", release="0.5.13", round_s=0.004)) as spec:
        for name, s in (("base", base), ("spec", spec)):
            code, out, _ = _probe(s.url, "--prompts", str(prompts), "--max-tokens", "128", "--out",
                                  str(tmp_path / f"{name}.json"))
            assert code == 0, out
    res = CliRunner().invoke(plan_cmd, [f"base={tmp_path / 'base.json'}", f"spec={tmp_path / 'spec.json'}", "--replay",
                                        str(replay), "--max-topk", "1", "--json"])
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    roles = {r["label"]: r["role"] for r in doc["runs"]}
    assert roles == {"base": "baseline", "spec": "served"}
    served = next(r for r in doc["runs"] if r["label"] == "spec")
    probe_doc = json.loads((tmp_path / "spec.json").read_text())
    assert served["accept_length"] == pytest.approx(probe_doc["run"]["accept_length"])
    assert served["config"]["steps"] == 3 and served["engine"] == "sglang"
    assert doc["serving_gap"] is not None and not doc["serving_gap"]["found"]


def test_plan_refuses_a_broken_probe_run(tmp_path: Path) -> None:
    from eagleforensics.cli.plan import plan as plan_cmd

    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"schema": "eagleforensics-probe-v1", "run": {"engine": "sglang", "accept_length": -3}}))
    res = CliRunner().invoke(plan_cmd, [str(bad)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "run.json" in res.output


def test_every_finding_code_is_documented_and_emitted() -> None:
    import re

    from eagleforensics.probe import FINDING_CODES, TODO_CODES

    doc = (ROOT / "docs" / "probe.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \| (?:warning|info)", doc, re.M))
    assert documented == set(FINDING_CODES) and set(TODO_CODES) <= documented
    source = (ROOT / "eagleforensics" / "probe.py").read_text()
    emitted = set(re.findall(r'Finding\(\s*"([a-z-]+)"', source))
    assert emitted == set(FINDING_CODES), emitted ^ set(FINDING_CODES)


def test_probestats_units() -> None:
    """The arithmetic on its own: ratio SE, histograms to per-position acceptance, degenerate text, chain fit."""
    from eagleforensics.evidence.probestats import chain_reach, degenerate, first_difference, per_position, ratio

    r, se = ratio([3, 5, 4], [2, 2, 2])
    assert r == 2.0 and se > 0 and ratio([3], [2])[1] != ratio([3], [2])[1]  # one unit: NaN SE
    assert per_position([[2, 1, 1], [0, 2, 0]]) == (4 / 6, 1 / 6)  # passes that accepted >= 1, >= 2 drafts
    assert degenerate([], 0, "length", "") == "empty output"
    assert degenerate([7], 1, "stop", "x") == "stopped after one token"
    assert "repeated" in degenerate([5, 6, 7, 8] * 16, 64, "length", "a b c d " * 16)
    assert "undecodable" in degenerate(list(range(10)), 10, "length", "\ufffd\ufffd\x01ab")
    varied = list(range(100, 164))
    assert degenerate(varied, 64, "length", " ".join(map(str, varied))) is None
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2 and first_difference("abc", "abc") is None
    assert first_difference([1, 2], [1, 2, 3]) == 2
    reach = chain_reach(_expected(0.47, 3), 3)
    assert reach is not None and abs(reach[0] - 0.47) < 1e-6 and chain_reach(5.0, 3) is None
