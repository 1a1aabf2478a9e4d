"""Published configs and shard indexes as partial downloads: ``doctor --target`` clean on each, planted defects found.

The corpus (``tests/fixtures/published``, README there cites every file) holds real configs and indexes
copied from public mirrors of Hugging Face repositories (Llama-3.1/3.2, Mixtral, Qwen2-VL, Qwen3-VL,
Qwen3.5-MoE, MiMo, Gemma-3, Mistral, Qwen2.5, Falcon, Molmo, DeepSeek-OCR-2, Qwen3 MLX, Granite, GLM-4.5-Air MLX,
DeepSeek-V3-Base) and four
rebuilt from published name lists and configs (DeepSeek-R1's 91,991 names with MTP layer 61, Kimi-K2's
139,644, DeepSeek-R1 NVFP4 with ModelOpt's hf_quant_config.json, gpt-oss-20b). Each entry is checked with
no shard on disk, as the issue's user had it; then each variant that fits it is planted and must add
exactly its finding (the same engine's clean run subtracted). ``scripts/published_corpus.py`` prints the table.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from eagleforensics.checks.base import DoctorInputs
from eagleforensics.checks.registry import get_check
from eagleforensics.doctor import diagnose
from eagleforensics.testing.published import CORPUS, INDEX, entries, materialise

_SPEC = importlib.util.spec_from_file_location("published_corpus", Path(__file__).resolve().parents[1] / "scripts" /
                                               "published_corpus.py")
assert _SPEC is not None and _SPEC.loader is not None
corpus = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(corpus)

ENTRIES = {e.name: e for e in entries()}


def test_the_corpus_has_twenty_entries_each_cited() -> None:
    readme = (CORPUS / "README.md").read_text()
    assert len(ENTRIES) >= 20
    for e in ENTRIES.values():
        assert f"`{e.name}`" in readme, e.name
        assert e.status in ("published", "reconstructed")
        if e.status == "published":
            assert e.meta["repo"] in readme and e.meta["commit"] in readme


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_is_clean_and_each_planted_defect_is_found(name: str, tmp_path: Path) -> None:
    entry = ENTRIES[name]
    rows = [corpus.run_case(entry, None, tmp_path / "clean")]
    for variant in corpus.cases(entry, tmp_path):
        rows.append(corpus.run_case(entry, variant, tmp_path / variant.name))
    bad = [(r["case"], r["expect"], r["added"]) for r in rows if not r["ok"]]
    assert bad == [], bad
    assert len(rows) >= 3  # every entry gets at least the rotation plant and the QuIP near miss


# ---------------------------------------------------------------- issue 41: the partial download's MTP layer
def _mtp(target: Path, **inputs: object):  # noqa: ANN202
    report = diagnose(DoctorInputs(target=str(target), **inputs), checks=[get_check("mtp-weights")], pipelines=())
    return report.outcomes[0], [r.finding for r in report.findings]


def test_deepseek_partial_download_counts_the_names_the_index_lists(tmp_path: Path) -> None:
    """The issue's case: DeepSeek-V3/R1's index lists 91,991 names, 1,564 in layer 61; no shard is there (today's
    main read the absent shards' tensors: "none of its 0 stored tensors", a false warning)."""
    t = materialise(ENTRIES["deepseek-r1"], tmp_path / "ds")
    outcome, found = _mtp(t)
    assert found == [] and outcome.status == "clean"
    assert outcome.data["tensors_listed"] == 91_991 and outcome.data["mtp_tensors"] == 1_564
    assert "of the 91,991 names the shard index lists, 1,564 belong to the MTP layer (layer 61" in outcome.note


def test_one_small_shard_present_still_reads_the_index(tmp_path: Path) -> None:
    """With one shard downloaded (the final norm's), the check still reads every name the index lists."""
    from safetensors.numpy import save_file
    import numpy as np

    t = materialise(ENTRIES["deepseek-r1"], tmp_path / "ds")
    shard = json.loads((t / INDEX).read_text())["weight_map"]["model.norm.weight"]
    save_file({"model.norm.weight": np.ones(8, np.float32)}, str(t / shard))
    outcome, found = _mtp(t)
    assert found == [] and outcome.data["mtp_tensors"] == 1_564


def test_a_reexport_without_the_mtp_layer_counts_the_index_names(tmp_path: Path) -> None:
    """A W4A16 re-export (compressed-tensors' pack-quantized block) whose index drops layer 61: the message counts
    the 90,427 names the index lists, not the 0 tensors of absent shards; served as NEXTN it is an error."""
    from eagleforensics.testing.defects import sglang_log
    from eagleforensics.testing.published import VARIANTS

    t = materialise(ENTRIES["deepseek-r1"], tmp_path / "awq")
    next(v for v in VARIANTS if v.name == "w4a16-without-mtp").plant(t)
    outcome, found = _mtp(t)
    assert [(f.code, f.severity) for f in found] == [("mtp-weights-missing", "warning")]
    assert "none of the 90,427 names the shard index lists belongs to an MTP layer (layer 61" in found[0].message
    assert "stored tensors" not in found[0].message and outcome.data["names_from"] == "index"
    log = sglang_log(tmp_path / "nextn.log", t, t, speculative_algorithm="EAGLE")  # SGLang logs NEXTN so
    _, found = _mtp(t, log=str(log))
    assert [(f.code, f.severity) for f in found] == [("mtp-weights-missing", "error")]


def test_a_log_that_accepts_contradicts_a_random_mtp_head(tmp_path: Path) -> None:
    """The issue's run said accept length 1.00 while its own log showed 2.4: with the MTP layer missing from the
    --target index but a NEXTN log accepting 2.4 tokens a step, the served checkpoint has the layer; the finding
    says the directory is not the one served (warning), not that every draft is rejected. A log at 1.00 stays an
    error."""
    from eagleforensics.testing.defects import sglang_log

    t = materialise(ENTRIES["deepseek-r1"], tmp_path / "ds")
    from eagleforensics.testing.published import drop_mtp

    assert drop_mtp(t) == 1_564
    log = sglang_log(tmp_path / "ok.log", t, t, accept_lens=(2.4, 2.41, 2.38, 2.42), speculative_algorithm="EAGLE")
    outcome, found = _mtp(t, log=str(log))
    assert [(f.code, f.severity) for f in found] == [("mtp-weights-missing", "warning")]
    assert "accept 2.40 tokens a step" in found[0].message and "accept length 1.00" not in found[0].message
    log = sglang_log(tmp_path / "one.log", t, t, accept_lens=(1.0, 1.0, 1.0, 1.0), speculative_algorithm="EAGLE")
    _, found = _mtp(t, log=str(log))
    assert [(f.code, f.severity) for f in found] == [("mtp-weights-missing", "error")]
    assert "accept length 1.00" in found[0].message
