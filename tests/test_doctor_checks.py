"""The doctor's checks on planted defects and on clean drafters of other seeds and families.

Every defect of ``testing.defects`` is planted, one at a time, into copies of the sample drafter
and target: the doctor must find it with its code and flag nothing else. The clean sample is OK on
every check. Clean drafters built by ``testing.drafterbuild`` for tiny Llama / Qwen3 / DeepSeek-V3
targets (other seeds, other RoPE) must raise no PROBLEM and no ACTION.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.draftvocab import VocabMap, diagnose_map
from eagleforensics.checks.rope import rope_differences, rope_of
from eagleforensics.checks.rowcompare import compare_rows, init_signature
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import DEFECTS, SAMPLES, plant

from .torchthreads import one_thread  # noqa: F401  (autouse: the tiny drafters train on one torch thread)

FLAGGED = ("error", "warning")


def flagged(report) -> list[str]:  # noqa: ANN001
    return [r.finding.code for r in report.findings if r.finding.severity in FLAGGED]


@pytest.fixture(scope="session")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("planted")
    return {d.name: plant(d, out) for d in DEFECTS}


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_each_planted_defect_is_found_with_its_code_and_nothing_else(planted: dict, defect) -> None:  # noqa: ANN001
    case = planted[defect.name]
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), **case.inputs))
    assert flagged(report) == [defect.code], report.to_text()
    f = report.findings[0].finding
    assert f.code == defect.code and f.fix and f.source and f.impact
    assert report.exit_code == 1


def test_the_clean_sample_is_ok_on_every_check() -> None:
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                                   capture=str(SAMPLES / "capture_sweep.safetensors"), served_len=512))
    assert report.level == "OK", report.to_text()
    rows = {o.name: o.status for o in report.outcomes}
    ran = [name for name, status in rows.items() if status != "not-run"]
    assert {"sizes", "vocab-map", "vocab-coverage", "embedding", "rope", "max-positions"} <= set(ran)
    assert all(rows[name] == "clean" for name in ran)


def test_coverage_states_the_ceiling_on_the_targets_own_tokens() -> None:
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"),
                                   train=str(SAMPLES / "data_0.ckpt"), capture=str(SAMPLES / "capture.pt")))
    row = next(o for o in report.outcomes if o.name == "vocab-coverage")
    sources = row.data["sources"]
    assert sources["capture"]["exact"] and sources["records"]["exact"]
    assert 0.5 < sources["capture"]["share"] < 1.0  # the tiny drafter's 256 of 512 ids: a real ceiling, stated
    info = [f for f in row.findings if f.code == "vocab-coverage"]
    assert info and info[0].severity == "info" and "at most" in info[0].message


# ---------------------------------------------------------------- the d2t rules, case by case
def _vm(d2t: np.ndarray | None, *, vocab: int = 64, n: int = 16, t2d: np.ndarray | None = None,
        dtype: str = "I64") -> VocabMap:
    return VocabMap(vocab, n, True, "d2t" if d2t is not None else None, "t2d" if t2d is not None else None,
                    dtype if d2t is not None else None, d2t, t2d, None if d2t is None else d2t.shape)


def _offsets(ids: np.ndarray) -> np.ndarray:
    return ids - np.arange(ids.size)


KEPT = np.array([0, 1, 2, 3, 5, 6, 9, 10, 11, 20, 21, 30, 31, 40, 50, 63])


@pytest.mark.parametrize("d2t, t2d, kind", [
    (_offsets(KEPT), None, "ok"),
    (KEPT.copy(), None, "absolute"),  # strictly increasing target ids: no repeated offset
    (np.arange(16), None, "absolute"),  # arange written as the map
    (np.zeros(16, np.int64), None, "placeholder"),
    (None, None, "missing"),
    (_offsets(KEPT)[:-1], None, "invalid"),  # one short
    (np.concatenate([_offsets(KEPT)[:1], _offsets(KEPT)[:1] - 1, _offsets(KEPT)[2:]]), None, "invalid"),  # duplicate
    (_offsets(KEPT) + 10, None, "invalid"),  # past the vocabulary
])
def test_map_diagnosis(d2t: np.ndarray | None, t2d: np.ndarray | None, kind: str) -> None:
    assert diagnose_map(_vm(d2t, t2d=t2d)).kind == kind


def test_t2d_decides_the_convention_and_a_disagreeing_t2d_is_invalid() -> None:
    mask = np.zeros(64, bool)
    mask[KEPT] = True
    assert diagnose_map(_vm(_offsets(KEPT), t2d=mask)).kind == "ok"
    assert diagnose_map(_vm(KEPT.copy(), t2d=mask)).kind == "absolute"
    other = mask.copy()
    other[[0, 62]] = [False, True]
    assert diagnose_map(_vm(_offsets(KEPT), t2d=other)).kind == "invalid"
    assert diagnose_map(_vm(_offsets(KEPT).astype(np.float32), dtype="F32")).kind == "invalid"


def test_a_full_vocabulary_needs_no_map() -> None:
    assert diagnose_map(_vm(None, vocab=64, n=64)).kind == "full"


# ---------------------------------------------------------------- rows and RoPE
def test_row_signatures_tell_a_copy_a_fresh_init_and_another_models_embedding() -> None:
    from eagleforensics.testing.tinymodels import build_model

    target = build_model("llama", num_layers=2, seed=0).get_input_embeddings().weight.detach().numpy()
    other = build_model("qwen3", num_layers=2, seed=4).get_input_embeddings().weight.detach().numpy()
    fresh = np.random.default_rng(0).normal(0, 0.02, target.shape).astype(np.float32)
    assert compare_rows(target, target).copy
    assert not compare_rows(other, target).copy and not init_signature(other).fresh
    assert abs(compare_rows(fresh, target).median_cos) < 0.05 and init_signature(fresh).fresh
    assert init_signature(fresh).known_std == 0.02


def test_rope_reads_transformers_4_and_5_keys_alike() -> None:
    t5 = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                              "original_max_position_embeddings": 128}}
    t4 = {"rope_theta": 1000000, "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 128}}
    assert rope_differences(rope_of(t4), rope_of(t5)) == []
    dropped = {"rope_theta": 1000000}  # a converter that drops rope_scaling
    assert rope_differences(rope_of(dropped), rope_of(t5)) == ["rope type default against the target's yarn"]


# ---------------------------------------------------------------- false alarms


@pytest.mark.parametrize("family, layout, engine", [("llama", "specforge", "sglang"), ("qwen3", "speculators", "vllm"),
                                                    ("deepseek_v3", "specforge", "vllm")])
def test_clean_drafters_of_other_families_raise_nothing(tmp_path: Path, family: str, layout: str, engine: str) -> None:
    from eagleforensics.testing.drafterbuild import export_drafter, export_target, write_capture, write_record
    from eagleforensics.testing.tinymodels import SCALED_ROPE, build_model

    model = build_model(family, num_layers=8, seed=3, rope=SCALED_ROPE[family])
    export_target(model, tmp_path / "target")
    export_drafter(model, tmp_path / "drafter", layout=layout, prompts=8)
    write_record(model, tmp_path / "data_0.ckpt", length=48, prompt=40)
    write_capture(model, tmp_path / "capture.safetensors")
    report = diagnose(DoctorInputs(drafter=str(tmp_path / "drafter"), target=str(tmp_path / "target"),
                                   train=str(tmp_path / "data_0.ckpt"), capture=str(tmp_path / "capture.safetensors"),
                                   engine=engine))
    assert report.level == "OK", report.to_text()
    rows = {o.name: o.status for o in report.outcomes}
    ran = {name for name, status in rows.items() if status != "not-run"}
    assert {"sizes", "vocab-map", "vocab-coverage", "embedding", "flags", "rope", "max-positions", "wiring",
            "replay"} <= ran, rows
    assert all(rows[name] == "clean" for name in ran), rows
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert (cfg.get("rope_scaling") or cfg.get("transformer_layer_config", {}).get("rope_scaling"))  # RoPE compared


def test_a_planted_defect_on_another_family_is_still_found(tmp_path: Path) -> None:
    """The rules are not tuned to the sample: a random embedding on a clean Qwen3 drafter is found as such."""
    from eagleforensics.testing.defects import DEFECTS as ALL, plant as plant_one
    from eagleforensics.testing.drafterbuild import export_drafter, export_target
    from eagleforensics.testing.tinymodels import build_model

    model = build_model("qwen3", num_layers=4, seed=5)
    export_target(model, tmp_path / "clean" / "target")
    export_drafter(model, tmp_path / "clean" / "drafter", prompts=8)
    random_embedding = next(d for d in ALL if d.name == "embedding-random")
    case = plant_one(random_embedding, tmp_path / "cases", drafter=tmp_path / "clean" / "drafter",
                     target=tmp_path / "clean" / "target")
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target)))
    assert flagged(report) == ["embedding-random"], report.to_text()


# ---------------------------------------------------------------- engine rules decide severities
@pytest.mark.parametrize("engine, version, runner, severity", [
    ("vllm", "0.33.0", "v1", "error"),  # keeps the drafter's own embedding (vllm-project/vllm#28549)
    ("vllm", "0.11.0", "v1", "info"),  # shared the target's whenever the shapes agreed
    ("sglang", "0.5.23", None, "info"),  # set_embed always replaces it
    (None, None, None, "warning"),  # engine unknown: said, not guessed
])
def test_a_random_embedding_is_an_error_only_where_the_engine_uses_it(planted: dict, engine: str | None,
                                                                      version: str | None, runner: str | None,
                                                                      severity: str) -> None:
    case = planted["embedding-random"]
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), engine=engine,
                                   engine_version=version, vllm_runner=runner))
    found = [r.finding for r in report.findings if r.finding.code == "embedding-random"]
    assert [f.severity for f in found] == [severity]
    if engine is not None:
        assert "embedrules" not in found[0].source and ("vllm" in found[0].source or "sglang" in found[0].source)


@pytest.mark.parametrize("engine, version, runner, severity", [
    ("vllm", "0.33.0", "v1", "warning"),  # no drafts past the drafter's max length
    ("vllm", "0.33.0", "v2", "info"),  # raised to the target's max_model_len (default rope)
    ("sglang", "0.5.23", None, "warning"),  # refuses to start
])
def test_short_max_positions_follow_the_engine_rule(planted: dict, engine: str, version: str, runner: str | None,
                                                    severity: str) -> None:
    case = planted["max-positions-short"]
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), engine=engine,
                                   engine_version=version, vllm_runner=runner))
    found = [r.finding for r in report.findings if r.finding.code == "max-positions-short"]
    assert [f.severity for f in found] == [severity], report.to_text()


@pytest.mark.parametrize("version, flagged_codes", [("0.5.12", ["flag-ignored"]), ("0.5.17", [])])
def test_an_ignored_flag_is_found_only_on_the_versions_that_ignore_it(planted: dict, version: str,
                                                                      flagged_codes: list[str]) -> None:
    case = planted["flag-ignored"]
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target), engine="sglang",
                                   engine_version=version))
    assert flagged(report) == flagged_codes, report.to_text()


def test_a_speculators_drafter_is_refused_by_sglang(tmp_path: Path) -> None:
    from eagleforensics.testing.defects import to_speculators_layout
    import shutil

    d = tmp_path / "drafter"
    shutil.copytree(SAMPLES / "drafter", d)
    to_speculators_layout(d)
    report = diagnose(DoctorInputs(draft_config=str(d / "config.json"), engine="sglang"))
    found = [r.finding for r in report.findings if r.finding.code == "flag-ignored"]
    assert [f.severity for f in found] == ["error"] and "speculators" in found[0].message


# ---------------------------------------------------------------- the server log
def test_a_clean_launch_and_the_fixture_logs_raise_no_launch_finding(tmp_path: Path) -> None:
    from eagleforensics.testing.defects import sglang_log

    clean = sglang_log(tmp_path / "server.log", SAMPLES / "target", SAMPLES / "drafter", accept_lens=(2.4, 2.9, 2.6))
    fixtures = Path(__file__).parent / "fixtures" / "logs"
    for log in [clean, fixtures / "sglang_0.5.23_fixed.log", fixtures / "sglang_0.5.5_broken.log",
                fixtures / "vllm_0.33.log", fixtures / "sglang_0.5.23_started.log"]:
        report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"), log=str(log)))
        assert report.level == "OK", report.to_text()
        assert {o.name: o.status for o in report.outcomes}["launch"] == "clean"


def test_the_log_gives_the_engine_version_and_served_length(tmp_path: Path) -> None:
    from eagleforensics.testing.defects import vllm_log

    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "server.log", "0.14.0", SAMPLES / "target", spec, max_model_len=4096)
    report = diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), target=str(SAMPLES / "target"), log=str(log)))
    rows = {o.name: o for o in report.outcomes}
    assert rows["flags"].status == "clean" and rows["flags"].data["engine"] == "vllm"
    assert rows["flags"].data["version"] == "0.14.0"
    mp = rows["max-positions"]
    assert mp.status == "found" and mp.data["served_len"] == 4096  # the draft's 512 against the served 4096
    assert [f.severity for f in mp.findings] == ["warning"]  # vLLM 0.14.0 V1: no drafts past the drafter's length


def test_an_engine_unlike_the_logs_is_bad_input(tmp_path: Path) -> None:
    from eagleforensics.errors import ForensicsError
    from eagleforensics.testing.defects import sglang_log

    log = sglang_log(tmp_path / "server.log", SAMPLES / "target", SAMPLES / "drafter")
    with pytest.raises(ForensicsError, match="SGLang server"):
        diagnose(DoctorInputs(drafter=str(SAMPLES / "drafter"), log=str(log), engine="vllm"))


def test_one_decode_line_at_1_00_is_not_yet_structural(tmp_path: Path) -> None:
    from eagleforensics.testing.defects import sglang_log

    log = sglang_log(tmp_path / "server.log", SAMPLES / "target", SAMPLES / "drafter", accept_lens=(1.0, 1.0))
    report = diagnose(DoctorInputs(log=str(log)))
    assert flagged(report) == []
    log = sglang_log(tmp_path / "server.log", SAMPLES / "target", SAMPLES / "drafter", accept_lens=(1.0,) * 9 + (1.25,))
    assert flagged(diagnose(DoctorInputs(log=str(log)))) == []  # a weak drafter accepts sometimes


# ---------------------------------------------------------------- replay puts a number on the cost
def _replayed(drafter: Path, target: Path, **inputs: object) -> dict:
    inputs = {k: v for k, v in inputs.items() if k != "capture"}
    report = diagnose(DoctorInputs(drafter=str(drafter), target=str(target), capture=str(SAMPLES / "capture.pt"),
                                   train=str(SAMPLES / "record_layer_outputs.pt"), **inputs))
    row = next(o for o in report.outcomes if o.name == "replay")
    assert row.status != "not-run", row.reason  # it ran (found: the drafter accepts almost nothing as trained)
    rep = report.replay
    by = {("served" if w.get("served_without") else w["source"].split(";")[0]): w["accept_length"]
          for w in rep["wirings"]}
    return {"trained": by["trained"], "served": by.get("served"), "report": report}


@pytest.fixture(scope="session")
def clean_replay() -> float:
    return _replayed(SAMPLES / "drafter", SAMPLES / "target")["trained"]


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.priced], ids=[d.name for d in DEFECTS if d.priced])
def test_replay_puts_a_number_on_each_priced_defect(planted: dict, defect, clean_replay: float) -> None:  # noqa: ANN001
    case = planted[defect.name]
    got = _replayed(case.drafter, case.target, **case.inputs)
    assert clean_replay > 2.5  # the sample drafter, as trained, on its own capture
    cost = (got["served"] if got["served"] is not None else got["trained"]) - clean_replay
    assert cost < -0.3, (defect.name, got)
    if defect.code == "flag-ignored":  # the finding carries the number too
        f = next(r.finding for r in got["report"].findings if r.finding.code == "flag-ignored")
        assert f"{got['served']:.2f} as served" in f.message and abs(got["trained"] - clean_replay) < 0.05


def test_replay_as_served_on_sglang_drops_the_random_embedding(planted: dict, clean_replay: float) -> None:
    """SGLang replaces the drafter's embedding with the target's: served there, the random init costs nothing."""
    case = planted["embedding-random"]
    got = _replayed(case.drafter, case.target, engine="sglang")
    assert got["trained"] < 1.5 and abs(got["served"] - clean_replay) < 0.05
    severities = {r.finding.code: r.finding.severity for r in got["report"].findings}
    assert severities["embedding-random"] == "info"


def test_replay_refusing_a_drafter_is_a_not_run_row_with_its_reason(planted: dict) -> None:
    case = planted["d2t-missing"]
    report = diagnose(DoctorInputs(drafter=str(case.drafter), target=str(case.target),
                                   capture=str(SAMPLES / "capture.pt")))
    row = next(o for o in report.outcomes if o.name == "replay")
    assert row.status == "not-run" and "no d2t" in row.reason and flagged(report) == ["d2t-missing"]
