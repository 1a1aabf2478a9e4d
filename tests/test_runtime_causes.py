"""Issue 44: drafter caches (row 31), depth (32), block drafters (33), speculation switched off (34) and
acceptance falling with batch size (35).

Each code is planted into a server log written in the release's own format (SGLang 0.5.23's ``server_args={...}``
line from entrypoints/engine.py and its ``Prefill batch`` / ``Decode batch`` lines from
managers/scheduler_components/metrics_reporter.py; vLLM's ``non-default args`` line) or into a drafter config
written the way the trainers write it, and found by the doctor with its code; the clean variant of each raises
none. Every fixture log of both engines raises none of the new codes as a warning or error.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.doctor import diagnose
from eagleforensics.testing.defects import SAMPLES, SGLANG_ARGS, vllm_log

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
NEW_CODES = ("drafter-cache-lost", "depth-past-trained", "block-drafter-settings", "spec-switched-off",
             "accept-falls-with-batch", "aux-id-past-layers", "default-temperature", "cumulative-accept-length",
             "ar-fusion-partial-aux")
NEW_CHECKS = ("launch", "drafter-cache", "spec-off", "batch-dependence", "depth", "block-drafter", "aux-range",
              "default-temperature", "cumulative-average", "ar-fusion")
FLAGGED = ("error", "warning")
T0 = datetime(2026, 11, 29, 12, 0, 0)


def sglang_run(path: Path, lines: list[tuple[float, int, float, int, int]], **fields: object) -> Path:
    """A SGLang 0.5.23 log: the arguments line, then per (minutes, running, accept len, new, cached) a Prefill
    line (when new + cached > 0) and a Decode line, as metrics_reporter.py prints them."""
    args = {"model_path": str(SAMPLES / "target"), "tokenizer_path": str(SAMPLES / "target"), **SGLANG_ARGS,
            "speculative_draft_model_path": str(SAMPLES / "drafter"), **fields}
    out = [f"[2026-11-29 11:58:30] server_args={args!r}",
           "[2026-11-29 11:59:02] The server is fired up and ready to roll!"]
    for i, (minute, running, acc, new, cached) in enumerate(lines):
        t = T0 + timedelta(minutes=minute)
        stamp = t.strftime("%Y-%m-%d %H:%M:%S")
        if new + cached:
            out.append(f"[{stamp}.000 TP0] Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, "
                       f"token usage: 0.05, #running-req: {running}, #queue-req: 0, #pending-token: 0, ")
        rate = (acc - 1) / 3
        out.append(f"[{stamp}.500 TP0] Decode batch, #running-req: {running}, #token: {640 + 64 * i}, token usage: "
                   f"0.05, accept len: {acc:.2f}, accept rate: {rate:.2f}, cuda graph: True, gen throughput "
                   f"(token/s): {40 * acc * running:.2f}, #queue-req: 0")
    path.write_text("\n".join(out) + "\n")
    return path


def doctor(only: tuple[str, ...] | None = None, **inputs: object):  # noqa: ANN201
    given = {k: str(v) if isinstance(v, Path) else v for k, v in inputs.items()}
    return diagnose(DoctorInputs(**given, only=only or ()))


def codes(report, severities=FLAGGED) -> list[tuple[str, str]]:  # noqa: ANN001
    return [(r.finding.code, r.finding.severity) for r in report.findings if r.finding.severity in severities]


def finding(report, code: str):  # noqa: ANN001, ANN201
    return next(r.finding for r in report.findings if r.finding.code == code)


# ---------------------------------------------------------------- clean controls
@pytest.mark.parametrize("log", sorted((FIXTURES / "serverargs").glob("*.log")) + sorted(FIXTURES.glob("*.log")),
                         ids=lambda p: p.name)
def test_fixture_logs_raise_none_of_the_new_codes(log: Path) -> None:
    report = doctor(NEW_CHECKS, log=log, drafter=SAMPLES / "drafter", target=SAMPLES / "target")
    assert not [c for c, _ in codes(report) if c in NEW_CODES], report.to_text()


# ---------------------------------------------------------------- row 34: speculation switched off at run time
BUSY = [(i * 0.5, 48, 1.0, 0, 0) for i in range(12)]


def test_undrafted_lines_are_not_blamed_on_the_drafter(tmp_path: Path) -> None:
    planted = doctor(("launch", "spec-off"), log=sglang_run(tmp_path / "a.log", BUSY, speculative_adaptive=True))
    assert ("spec-switched-off", "warning") in codes(planted)
    assert "accept-len-one" not in [c for c, _ in codes(planted)], planted.to_text()
    msg = finding(planted, "spec-switched-off").message
    assert "12 of 12" in msg and "48" in msg and "adaptive_spec_params.py" in finding(planted,
                                                                                      "spec-switched-off").source
    # the same lines without the switch are the drafter's: accept-len-one, as on main
    control = doctor(("launch", "spec-off"), log=sglang_run(tmp_path / "b.log", BUSY))
    assert ("accept-len-one", "error") in codes(control)
    assert "spec-switched-off" not in [r.finding.code for r in control.findings]


def test_adaptive_on_a_quiet_server_is_context_only(tmp_path: Path) -> None:
    quiet = [(i * 0.5, 1, 2.8, 0, 0) for i in range(10)]
    report = doctor(("spec-off",), log=sglang_run(tmp_path / "a.log", quiet, speculative_adaptive=True))
    assert codes(report) == [] and finding(report, "spec-switched-off").severity == "info"


def test_vllm_disable_by_batch_size_on_v1_is_said_to_be_unused(tmp_path: Path) -> None:
    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3,
            "disable_by_batch_size": 4}
    report = doctor(("spec-off",), log=vllm_log(tmp_path / "v.log", "0.14.0", SAMPLES / "target", spec))
    f = finding(report, "spec-switched-off")
    assert f.severity == "info" and "never reads it" in f.message and "0.14.1" in f.message


def test_plan_leaves_undrafted_lines_out(tmp_path: Path) -> None:
    from eagleforensics.plan import PlanInputs, read_runs

    mixed = [(i * 0.5, 4, 3.0, 0, 0) for i in range(8)] + [(5 + i * 0.5, 64, 1.0, 0, 0) for i in range(8)]
    log = sglang_run(tmp_path / "a.log", mixed, speculative_adaptive=True)
    (run,) = read_runs(PlanInputs(logs={"a": str(log)}))
    assert run.accept_length == pytest.approx(3.0, abs=0.01) and run.lines == 8
    plain = sglang_run(tmp_path / "b.log", mixed)
    (run,) = read_runs(PlanInputs(logs={"b": str(plain)}))
    assert run.accept_length < 2.0 and run.lines == 16


# ---------------------------------------------------------------- row 35: acceptance falling with batch size
def _batches(accepts: list[float]) -> list[tuple[float, int, float, int, int]]:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return [(i * 0.2, sizes[i % 7], accepts[i % 7] + 0.01 * (i // 7), 0, 0) for i in range(21)]


def test_acceptance_falling_with_batch_is_found(tmp_path: Path) -> None:
    report = doctor(("batch-dependence",), log=sglang_run(tmp_path / "a.log",
                                                         _batches([3.2, 3.0, 2.7, 2.4, 2.0, 1.7, 1.5])))
    f = finding(report, "accept-falls-with-batch")
    assert f.severity == "warning" and f.impact == "high" and "1.47 at 64" in f.message


def test_flat_acceptance_in_batch_is_healthy(tmp_path: Path) -> None:
    report = doctor(("batch-dependence",), log=sglang_run(tmp_path / "a.log",
                                                         _batches([3.0, 3.05, 2.98, 3.02, 2.97, 3.01, 2.99])))
    assert codes(report) == [] and finding(report, "accept-falls-with-batch").severity == "info"


# ---------------------------------------------------------------- row 31: drafter cache lost on restored prefixes
def _filling(fall: bool) -> list[tuple[float, int, float, int, int]]:
    """Two hours of traffic whose cached share of prompt tokens grows; with ``fall`` accept length follows it down
    (4.49 -> 1.59, sgl-project/sglang#32176) and comes back after a flush at the end."""
    out = []
    for i in range(24):
        share = min(0.9, i / 20)
        acc = 4.49 - 2.9 * share if fall else 4.45 + 0.02 * (i % 3)
        out.append((i * 5, 4, acc, int(2000 * (1 - share)) + 10, int(2000 * share)))
    if fall:
        out += [(120 + i, 4, 4.33, 2000, 0) for i in range(4)]
    return out


def test_hicache_on_an_unfixed_release_with_the_fall_is_an_error(tmp_path: Path) -> None:
    log = sglang_run(tmp_path / "a.log", _filling(True), enable_hierarchical_cache=True,
                     hicache_storage_backend="mooncake")
    report = doctor(("drafter-cache",), log=log, engine_version="0.5.9")
    f = finding(report, "drafter-cache-lost")
    assert f.severity == "error" and f.impact == "high"
    assert "cache_controller.py" in f.source and "sgl-project/sglang#21125" in f.source
    assert "back near the start" in f.message and "cached share" in f.message


def test_hicache_on_an_unfixed_release_without_lines_is_a_warning(tmp_path: Path) -> None:
    log = sglang_run(tmp_path / "a.log", [], enable_hierarchical_cache=True)
    f = finding(doctor(("drafter-cache",), log=log, engine_version="0.5.10"), "drafter-cache-lost")
    assert f.severity == "warning"


def test_hicache_on_a_fixed_release_stays_context_when_flat(tmp_path: Path) -> None:
    log = sglang_run(tmp_path / "a.log", _filling(False), enable_hierarchical_cache=True)
    report = doctor(("drafter-cache",), log=log, engine_version="0.5.23")
    assert codes(report) == [] and finding(report, "drafter-cache-lost").severity == "info"
    # the fixed release with the fall still warns: some draft state is not restored
    fell = doctor(("drafter-cache",), log=sglang_run(tmp_path / "b.log", _filling(True),
                                                     enable_hierarchical_cache=True), engine_version="0.5.23")
    assert ("drafter-cache-lost", "warning") in codes(fell)


def test_no_cache_and_a_flat_log_is_clean(tmp_path: Path) -> None:
    report = doctor(("drafter-cache",), log=sglang_run(tmp_path / "a.log", _filling(False)))
    assert [r.finding.code for r in report.findings] == []


def test_vllm_kv_connector_with_speculation_is_said(tmp_path: Path) -> None:
    spec = {"method": "eagle3", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 3}
    log = vllm_log(tmp_path / "v.log", "0.14.0", SAMPLES / "target", spec,
                   kv_transfer_config={"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    f = finding(doctor(("drafter-cache",), log=log), "drafter-cache-lost")
    assert f.severity == "info" and "LMCacheConnectorV1" in f.message and "not read" in f.message


def test_vllm_prefix_caching_with_a_context_cache_drafter_is_said(tmp_path: Path) -> None:
    spec = {"method": "dflash", "model": str(SAMPLES / "drafter"), "num_speculative_tokens": 7}
    log = vllm_log(tmp_path / "v.log", "0.14.0", SAMPLES / "target", spec)
    f = finding(doctor(("drafter-cache",), log=log), "drafter-cache-lost")
    assert f.severity == "info" and "vllm-project/vllm#47930" in f.message
    off = vllm_log(tmp_path / "w.log", "0.14.0", SAMPLES / "target", spec, enable_prefix_caching=False)
    assert doctor(("drafter-cache",), log=off).findings == []


# ---------------------------------------------------------------- row 32: deeper than trained
def _drafter_with(tmp_path: Path, **keys: object) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    cfg = json.loads((SAMPLES / "drafter" / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **keys}))
    return d / "config.json"


@pytest.mark.parametrize("steps, found", [(6, True), (3, False)])
def test_depth_past_the_trained_horizon(tmp_path: Path, steps: int, found: bool) -> None:
    cfg = _drafter_with(tmp_path, ttt_length=4)
    log = sglang_run(tmp_path / "a.log", [], speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1)
    report = doctor(("depth",), log=log, draft_config=cfg)
    if found:
        f = finding(report, "depth-past-trained")
        assert f.severity == "warning" and "positions 5-6" in f.message and "ttt_length" in f.message
    else:
        assert [r.finding.code for r in report.findings] == []


def test_depth_from_a_trainer_arguments_file(tmp_path: Path) -> None:
    cfg = _drafter_with(tmp_path)
    (cfg.parent / "training_args.json").write_text(json.dumps({"ttt_length": 2, "lr": 1e-4}))
    log = sglang_run(tmp_path / "a.log", [])
    report = doctor(("depth",), log=log, drafter=cfg.parent)
    assert ("depth-past-trained", "warning") in codes(report)


def test_mtp_served_past_its_layers_is_context(tmp_path: Path) -> None:
    t = tmp_path / "target"
    t.mkdir()
    tcfg = json.loads((SAMPLES / "target" / "config.json").read_text())
    (t / "config.json").write_text(json.dumps({**tcfg, "num_nextn_predict_layers": 1}))
    log = sglang_run(tmp_path / "a.log", [], speculative_algorithm="NEXTN", speculative_draft_model_path=None)
    f = finding(doctor(("depth",), log=log, target=t), "depth-past-trained")
    assert f.severity == "info" and "1 layer(s)" in f.message


# ---------------------------------------------------------------- row 33: block drafters
def _dflash(tmp_path: Path, **dflash: object) -> Path:
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 128, "vocab_size": 512,
           "num_hidden_layers": 1, "block_size": dflash.pop("top_block_size", None),
           "dflash_config": {"target_layer_ids": [1, 4, 7], **dflash}}
    p = tmp_path / "dflash.json"
    p.write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return p


def test_block_drafter_disagreements_are_found(tmp_path: Path) -> None:
    cfg = _dflash(tmp_path, block_size=16, mask_token_id=2, top_block_size=8)
    spec = {"method": "dflash", "model": str(cfg.parent), "num_speculative_tokens": 16}
    log = vllm_log(tmp_path / "v.log", "0.14.0", SAMPLES / "target", spec)
    report = doctor(("block-drafter",), draft_config=cfg, target=SAMPLES / "target", log=log)
    msgs = [r.finding.message for r in report.findings if r.finding.code == "block-drafter-settings"]
    assert len(msgs) == 3 and all(r.finding.severity == "warning" for r in report.findings)
    assert any("EOS id" in m for m in msgs) and any("16 nested and 8 top-level" in m for m in msgs)
    assert any("num_speculative_tokens=15" in m for m in msgs)


def test_block_size_means_the_verify_window_on_sglang(tmp_path: Path) -> None:
    cfg = _dflash(tmp_path, block_size=16, mask_token_id=300)
    bad = sglang_run(tmp_path / "a.log", [], speculative_algorithm="DFLASH", speculative_num_draft_tokens=15)
    report = doctor(("block-drafter",), draft_config=cfg, target=SAMPLES / "target", log=bad)
    assert any("speculative_num_draft_tokens=16" in r.finding.message for r in report.findings)
    good = sglang_run(tmp_path / "b.log", [], speculative_algorithm="DFLASH", speculative_num_draft_tokens=16)
    assert doctor(("block-drafter",), draft_config=cfg, target=SAMPLES / "target", log=good).findings == []


def test_block_drafter_without_mask_id_is_found(tmp_path: Path) -> None:
    report = doctor(("block-drafter",), draft_config=_dflash(tmp_path, block_size=16))
    assert ("block-drafter-settings", "warning") in codes(report)
    assert "no mask_token_id" in finding(report, "block-drafter-settings").message


def test_an_eagle3_drafter_is_not_a_block_drafter() -> None:
    report = doctor(("block-drafter",), drafter=SAMPLES / "drafter")
    assert not [r for r in report.findings if r.finding.code == "block-drafter-settings"]


# ---------------------------------------------------------------- sub-mechanisms of rows 1, 8, 15, 20
def _target_with(tmp_path: Path, gen: dict | None = None, **cfg_keys: object) -> Path:
    t = tmp_path / "target"
    t.mkdir()
    cfg = json.loads((SAMPLES / "target" / "config.json").read_text())
    (t / "config.json").write_text(json.dumps({**cfg, **cfg_keys}))
    if gen is not None:
        (t / "generation_config.json").write_text(json.dumps(gen))
    return t


@pytest.mark.parametrize("version, severity", [("0.14.1", "error"), (None, "warning"), ("0.25.0", None)])
def test_aux_id_equal_to_the_layer_count_on_deepseek(tmp_path: Path, version: str | None, severity: str | None
                                                      ) -> None:
    t = _target_with(tmp_path, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    n = json.loads((t / "config.json").read_text())["num_hidden_layers"]
    cfg = tmp_path / "draft.json"
    cfg.write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [2, n // 2, n]}))
    report = doctor(("aux-range",), draft_config=cfg, target=t, engine="vllm", engine_version=version)
    if severity is None:
        assert [r.finding.code for r in report.findings] == []
    else:
        f = finding(report, "aux-id-past-layers")
        assert f.severity == severity and f"include {n}" in f.message and "deepseek_v2.py" in f.source


def test_aux_ids_inside_the_layers_are_clean(tmp_path: Path) -> None:
    t = _target_with(tmp_path, model_type="deepseek_v3")
    cfg = tmp_path / "draft.json"
    cfg.write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}))
    assert doctor(("aux-range",), draft_config=cfg, target=t, engine="vllm").findings == []


def test_default_temperature_from_generation_config(tmp_path: Path) -> None:
    t = _target_with(tmp_path, gen={"temperature": 0.6, "top_p": 0.95, "do_sample": True})
    log = sglang_run(tmp_path / "a.log", [], sampling_defaults="model")
    f = finding(doctor(("default-temperature",), log=log, target=t), "default-temperature")
    assert f.severity == "info" and "sampled at 0.6" in f.message and "replay --temperature 0.6" in f.fix
    off = sglang_run(tmp_path / "b.log", [], sampling_defaults="openai")
    assert doctor(("default-temperature",), log=off, target=t).findings == []


def test_sglang_cumulative_average_is_said(tmp_path: Path) -> None:
    log = sglang_run(tmp_path / "a.log", [(i, 4, 2.0, 0, 0) for i in range(8)])
    with log.open("a") as fh:  # the line set_internal_state prints (sglang 0.5.9 scheduler.py)
        fh.write("[2026-11-29 12:10:00] avg_spec_accept_length=3.41\n")
    f = finding(doctor(("cumulative-average",), log=log), "cumulative-accept-length")
    assert f.severity == "info" and "3.41" in f.message and "median of 2.00" in f.message


# without --engine-version the 0.5.23 dict format's own range (0.5.19 on) is past the fix
@pytest.mark.parametrize("version, severity", [("0.5.12", "error"), (None, "info"), ("0.5.14", "info")])
def test_ar_fusion_with_tp_reads_partial_sums_on_old_releases(tmp_path: Path, version: str | None,
                                                              severity: str) -> None:
    log = sglang_run(tmp_path / "a.log", [], tp_size=8, enable_flashinfer_allreduce_fusion=True)
    report = doctor(("ar-fusion",), log=log, engine_version=version, model_type="deepseek_v3")
    f = finding(report, "ar-fusion-partial-aux")
    assert f.severity == severity
    if severity != "info":
        assert "sgl-project/sglang#28343" in f.source and "partial sum" in f.message


def test_ar_fusion_off_or_tp_one_is_clean(tmp_path: Path) -> None:
    for i, fields in enumerate(({"tp_size": 8, "enable_flashinfer_allreduce_fusion": False},
                                {"tp_size": 1, "enable_flashinfer_allreduce_fusion": True})):
        log = sglang_run(tmp_path / f"{i}.log", [], **fields)
        assert doctor(("ar-fusion",), log=log, engine_version="0.5.12", model_type="deepseek_v3").findings == []


def test_ar_fusion_on_a_format_spanning_the_fix_asks_for_the_release(tmp_path: Path) -> None:
    """SGLang's ServerArgs(...) repr spans 0.4.7 - 0.5.18: the finding says which releases and names the option."""
    line = (FIXTURES / "serverargs" / "sglang_0.5.9_args.log").read_text().splitlines()
    args = next(x for x in line if "server_args=ServerArgs(" in x)
    assert "tp_size=2," in args and "speculative_algorithm='EAGLE3'" in args  # the fixture's own launch
    args = args.replace("enable_flashinfer_allreduce_fusion=False", "enable_flashinfer_allreduce_fusion=True")
    log = tmp_path / "a.log"
    log.write_text(args + "\n")
    f = finding(doctor(("ar-fusion",), log=log, model_type="deepseek_v3"), "ar-fusion-partial-aux")
    assert f.severity == "warning" and "--engine-version" in f.message and "0.5.8 - 0.5.12" in f.message
