"""One voice: causes, not codes; the measured cost decides the label; one severity on every surface.

Every planted defect of the doctor matrix (``testing.defects``) is run with the samples' incident
record and capture, so align's wiring row and replay run beside the defect's own check. For each
case the text, the JSON and the report's tables (the DataFrames the HTML is rendered from) must
show the same causes with the same severity, cost label and verdict, each cause's codes must be
the ones its root-cause key groups, and no cost label may be contradicted by replay's numbers on
the same page.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from eagleforensics import causes as C
from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.errors import ForensicsError
from eagleforensics.report.doctorreport import causes_table, checks_table
from eagleforensics.results import Finding
from eagleforensics.testing.defects import DEFECTS, SAMPLES, plant, vllm_log
from eagleforensics.verdict import LEVEL_OF_SEVERITY

from .torchthreads import one_thread  # noqa: F401  (autouse: the tiny drafters train on one torch thread)

RECORD, CAPTURE = SAMPLES / "record_layer_outputs.pt", SAMPLES / "capture.pt"
WIRING_CODES = ("serving-mismatch", "off-by-default", "nested-ignored", "default-fallback")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("planted-causes")
    return {d.name: plant(d, out) for d in DEFECTS}


def _doctor(case, **extra):  # noqa: ANN001, ANN202
    inputs = {"train": str(RECORD), **case.inputs, "capture": str(CAPTURE), **extra}  # a case's own --train DIR stays
    return diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), **inputs))


def _text_causes(text: str) -> dict[str, tuple[str, str]]:
    """key -> (severity, label) as the text prints each cause's head line."""
    return {m.group(2): (m.group(1), m.group(3))
            for m in re.finditer(r"^  \d+\. \[(\w+)\] ([\w-]+) \(([\w-]+)\): ", text, re.M)}


def _replay_numbers(replay: dict) -> tuple[float | None, float | None, dict[str, dict]]:
    ws = {w["label"] + ("|served" if w.get("served_without") else ""): w for w in replay["wirings"]}
    trained = next((w for w in replay["wirings"] if w["label"] == replay["trained"] and not w.get("served_without")),
                   None)
    return (None if trained is None else trained["accept_length"]), (None if trained is None else
                                                                      C.accept_se(trained)), ws


def check_one_voice(report) -> None:  # noqa: ANN001
    """The whole contract on one doctor report (used on every planted case)."""
    text, doc = report.to_text(), json.loads(report.to_json())
    causes = doc["causes"]
    # one cause per root cause, grouped by the table: every code's key is its cause's key
    assert len({c["key"] for c in causes}) == len(causes)
    for c in causes:
        for f in c["findings"]:
            want = C.cause_key(f["code"], f["check"])
            assert want == c["key"] or f["code"] in C.SYMPTOMS, (f["code"], c["key"])
    # the verdict counts causes
    n = len(causes)
    if n:
        assert f"{n} likely cause{'s' if n > 1 else ''} of low acceptance" in doc["verdict"]
    # text and JSON: same causes, severities, labels, level
    assert _text_causes(text) == {c["key"]: (c["severity"], c["impact"]) for c in causes}, text
    assert text.splitlines()[2] == f"VERDICT: {doc['verdict']}" and doc["level"] == report.level
    worst = min((LEVEL_OF_SEVERITY[c["severity"]] for c in causes), key=["PROBLEM", "ACTION", "OK"].index,
                default="OK")
    assert worst == doc["level"] or (worst == "OK" and doc["level"] != "PROBLEM")
    # every flagged finding carries its cause's label as its impact
    label = {c["key"]: c["impact"] for c in causes}
    order = [f["cause"] for f in doc["findings"] if "cause" in f]  # the findings follow their causes' ranking
    assert order == sorted(order, key=[c["key"] for c in causes].index)
    for f in doc["findings"]:
        if "cause" in f:
            assert f["impact"] == label[f["cause"]], f
    # the report's tables (what the HTML renders): the same causes, and each check row takes its worst cause
    ct = causes_table(report)
    assert list(zip(ct["cause"], ct["severity"], ct["impact"])) == [(c["key"], c["severity"], c["impact"] or "-")
                                                                    for c in causes]
    rows = checks_table(report).set_index("check")
    for c in causes:
        for check in c["checks"]:
            first = next(x for x in causes if check in x["checks"])
            assert (rows.loc[check, "severity"], rows.loc[check, "impact"]) == (first["severity"], first["impact"])
    # align's own verdict on the same record and capture is the wiring cause's level
    wiring = next((c for c in causes if "wiring" in c["checks"]), None)
    if doc["align"] is not None and doc["align"]["level"] != "OK":
        assert wiring is not None and LEVEL_OF_SEVERITY[wiring["severity"]] == doc["align"]["level"]
    # no cost label contradicted by replay on the same page
    if doc["replay"] is not None:
        t, se_t, _ = _replay_numbers(doc["replay"])
        for c in causes:
            cost = c["cost"]
            if cost["measured"]:
                assert cost["trained"] == pytest.approx(t, abs=1e-3)
                assert cost["label"] == C.label_of(cost["trained"] - cost["served"], cost["trained"] - 1.0)
            elif cost["label"] == "collapse" and t is not None and c["key"] in C.CAUSES \
                    and C.CAUSES[c["key"]].replay == C.CARRIED:
                steps = doc["replay"]["steps"]
                assert t - 1.0 - C.Z * (se_t or 0.0) <= C.COLLAPSE_GAIN * steps, (c["key"], t)
            if cost["label"] != "collapse":  # no message beneath it claims a collapse
                for f in c["findings"]:
                    assert not re.search(r"collaps|loses most of its", f["message"]), f["message"]


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_every_planted_case_speaks_with_one_voice(planted: dict, defect) -> None:  # noqa: ANN001
    report = _doctor(planted[defect.name])
    check_one_voice(report)
    keys = [c.key for c in report.causes]
    own = C.cause_key(defect.code)
    assert own in keys and defect.code in next(c for c in report.causes if c.key == own).codes
    # the record holds p3, p7, p10, one deeper than every engine's default: where align does not judge it served as
    # trained, one wiring cause, whatever codes it holds
    assert keys.count("aux-wiring") == (report.align["level"] != "OK")


@pytest.fixture(scope="module")
def vllm_case(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The issue's run: the clean sample drafter served by vLLM 0.14.0 with its nested-only ids."""
    root = tmp_path_factory.mktemp("vllm-case")
    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}
    log = vllm_log(root / "server.log", "0.14.0", SAMPLES / "target", spec, max_model_len=512)
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                                   train=str(RECORD), capture=str(CAPTURE), log=str(log)))
    return report, log


def test_one_wiring_defect_is_one_cause_with_its_codes_beneath(vllm_case) -> None:  # noqa: ANN001
    report, _ = vllm_case
    check_one_voice(report)
    wiring = [c for c in report.causes if c.key == "aux-wiring"]
    assert len(wiring) == 1 and set(WIRING_CODES) <= set(wiring[0].codes)
    assert "4 likely causes" not in report.verdict and "5 likely causes" not in report.verdict
    assert report.verdict.count("likely cause") == 1 and len(report.causes) == 2  # the wiring, the short records


def test_the_measured_cost_decides_the_wiring_label(vllm_case) -> None:  # noqa: ANN001
    """Replay measures 2.92 as trained and 2.43 on vLLM's default: a quarter of the gain, so medium, not collapse."""
    report, _ = vllm_case
    wiring = next(c for c in report.causes if c.key == "aux-wiring")
    cost = wiring.cost
    assert cost.measured and cost.trained > 2.5 and 2.0 < cost.served < cost.trained and cost.se > 0
    assert cost.label == "medium" and f"{cost.served:.2f} against {cost.trained:.2f}" in report.to_text()
    # the SE is paired on the same start rows (replay's per-row counts), far tighter than the two combined
    engine = next(w for w in report.replay["wirings"] if "engine default" in w["source"])
    assert cost.se == pytest.approx(engine["se_vs_trained"]) and cost.se < C.accept_se(engine)
    assert not cost.weak and cost.lost > C.Z * cost.se
    text = report.to_text()
    assert "(collapse)" not in text and "loses most of its acceptance" not in text
    assert all(r.finding.impact == "medium" for r in report.findings if r.cause == "aux-wiring")


def test_align_and_doctor_give_the_same_level_on_the_same_inputs(vllm_case) -> None:  # noqa: ANN001
    """align RECORD CAPTURE --engine vllm says ACTION (a snippet fixes it); the doctor on the same inputs too."""
    report, _ = vllm_case
    res = subprocess.run([sys.executable, "-m", "eagleforensics", "align", str(RECORD), str(CAPTURE), "--engine",
                          "vllm", "--engine-version", "0.14.0", "--draft-config", str(SAMPLES / "drafter"),
                          "--json"], capture_output=True, text=True, timeout=300)
    got = json.loads(res.stdout)
    assert got["level"] == "ACTION" == report.level
    severities = {f["code"]: f["severity"] for f in got["findings"]}
    assert severities["serving-mismatch"] == "warning"  # what align's verdict says: something to write
    wiring = next(c for c in report.causes if c.key == "aux-wiring")
    assert wiring.severity == "warning"


def test_label_rule_thresholds() -> None:
    gain = 2.0
    assert [C.label_of(lost, gain) for lost in (1.9, 1.8, 1.2, 1.0, 0.5, 0.4, 0.1, -0.2)] == [
        "collapse", "collapse", "high", "high", "medium", "medium", "low", "low"]


def test_accept_se_from_reach() -> None:
    # every row accepts exactly 2 of 3: no spread; a 50/50 mix of 0 and 3 accepted: sd 1.5
    assert C.accept_se({"reach": [1.0, 1.0, 0.0], "starts": 100}) == pytest.approx(0.0)
    assert C.accept_se({"reach": [0.5, 0.5, 0.5], "starts": 100}) == pytest.approx(0.15)


def test_paired_se_counts_only_rows_both_wirings_start() -> None:
    import numpy as np

    a = np.array([3, 2, np.nan, 3, 1], dtype=np.float32)
    b = np.array([2, 2, 1, np.nan, 0], dtype=np.float32)
    d = np.array([1.0, 0.0, 1.0])
    assert C.paired_se(a, b) == pytest.approx(d.std(ddof=1) / np.sqrt(3))
    assert C.paired_se(np.array([1.0, np.nan]), None) is None


def test_a_new_code_joins_a_cause_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(C.ROOT_CAUSE, "embedding-some-new-kind", "draft-embedding")
    items = [("embedding", Finding("embedding-random", "error", "m", impact="collapse")),
             ("embedding", Finding("embedding-some-new-kind", "warning", "n", impact="high")),
             ("launch", Finding("accept-len-one", "error", "o", impact="collapse")),
             ("replay", Finding("drafter-no-better-than-baseline", "warning", "p", impact="high"))]
    got = C.build(items)
    assert [(c.key, c.codes) for c in got] == [("draft-embedding", ["embedding-random", "embedding-some-new-kind",
                                                                    "accept-len-one",
                                                                    "drafter-no-better-than-baseline"])]
    assert C.cause_key("some-new-code") == "some-new-code"
    assert C.cause_key("off-by-default", "wiring") == "aux-wiring"
    assert C.cause_key("an-evidence-note", "wiring") == "wiring-unjudged"
    # a symptom with nothing beside it that explains it stands alone
    assert [c.key for c in C.build([("launch", Finding("accept-len-one", "error", "o", impact="collapse")),
                                    ("data-shape", Finding("train-shorter-than-served", "warning", "q"))])] == [
        "accept-len-one", "train-shorter-than-served"]


def test_swapped_record_and_capture_are_refused_with_the_swap_named() -> None:
    """--train CAPTURE --capture RECORD is not a miswired engine, nor a cause at all: the inputs are swapped, and the
    doctor says so in one line (exit 2) naming both paths, before any cause is counted."""
    from click.testing import CliRunner

    from eagleforensics.cli import main

    with pytest.raises(ForensicsError, match="look swapped") as err:
        diagnose(DoctorInputs(train=str(CAPTURE), capture=str(RECORD)))
    assert str(CAPTURE.name) in str(err.value) and str(RECORD.name) in str(err.value)
    res = CliRunner().invoke(main, ["doctor", "--train", str(CAPTURE), "--capture", str(RECORD)])
    assert res.exit_code == 2 and "look swapped" in res.output and len(res.output.strip().splitlines()) == 1


def test_the_replay_row_is_not_clean_beside_an_accept_length_near_one(planted: dict) -> None:
    """report.sh's doctor example (a random embedding) replays at accept length ~1.03 even as trained: the row says so as
    an info symptom (found, not clean) and adds no cause; the clean sample drafter's row stays clean."""
    report = _doctor(planted["embedding-random"])
    row = next(o for o in report.outcomes if o.name == "replay")
    t, _, _ = _replay_numbers(report.replay)
    assert t is not None and t - 1.0 <= C.COLLAPSE_GAIN * report.replay["steps"]
    assert row.status == "found" and {f.severity for f in row.findings if f.code == "replay-accepts-nothing"} == {"info"}
    assert "replay-accepts-nothing" not in {code for c in report.causes for code in c.codes}
    clean = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"), train=str(RECORD),
                                  capture=str(CAPTURE)))
    assert next(o for o in clean.outcomes if o.name == "replay").status == "clean"
