"""Published model configs and shard indexes (``tests/fixtures/published``), laid out as partial downloads.

Each corpus entry is a real ``config.json`` and ``model.safetensors.index.json`` (stored gzipped) of a model
family the target checks meet, copied from a public mirror, or rebuilt from a published name list where no
mirror holds the index (``corpus.json`` says which; the folder's README cites every source). ``materialise``
writes an entry as a user has it after downloading config and index but no shard; ``VARIANTS`` plant one
defect each into such a copy (an MTP layer dropped from the index, a quantization block written by
compressed-tensors' own classes, a SpinQuant rotation, a vision tower) and say what the doctor must find.
Nothing here runs the doctor: ``tests/test_published_corpus.py`` and ``scripts/published_corpus.py`` do.
"""
from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "published"
INDEX = "model.safetensors.index.json"
QUANT = CORPUS / "_quantization"  # blocks written by compressed-tensors 0.20.0's classes (README)
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
Expect = list[tuple[str, str]]  # (code, severity) at error / warning


@dataclass(frozen=True)
class Entry:
    """One corpus entry: its folder name and what ``corpus.json`` says of it."""

    name: str
    status: str  # "published" (the real files) or "reconstructed" (README says from what)
    family: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> Expect:
        """The findings (error / warning) the entry itself must raise: true ones the README explains, else none."""
        return [(str(c), str(s)) for c, s in self.meta.get("clean_findings", [])]


def entries() -> list[Entry]:
    """Every corpus entry, in ``corpus.json`` order."""
    doc = json.loads((CORPUS / "corpus.json").read_text())
    return [Entry(name, m["status"], m["family"], m) for name, m in doc.items()]


def quant_block(name: str) -> dict[str, Any]:
    """A stored quantization / transform block (``_quantization/compressed-tensors-<name>.json``), without the
    version line the README cites."""
    doc = json.loads((QUANT / f"compressed-tensors-{name}.json").read_text())
    doc.pop("version", None)
    return doc


def materialise(entry: Entry, dst: Path) -> Path:
    """``dst`` as a partial download of ``entry``: config.json, the shard index (unzipped), hf_quant_config.json
    where the release has one; no shard."""
    src = CORPUS / entry.name
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".json":
            shutil.copyfile(f, dst / f.name)
    index_src = CORPUS / str(entry.meta.get("index_from", entry.name)) / f"{INDEX}.gz"
    if index_src.is_file():
        with gzip.open(index_src, "rb") as fh:
            (dst / INDEX).write_bytes(fh.read())
    return dst


def _config(d: Path) -> dict[str, Any]:
    return json.loads((d / "config.json").read_text())


def _write_config(d: Path, cfg: dict[str, Any]) -> None:
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def _text(cfg: dict[str, Any]) -> dict[str, Any]:
    inner = cfg.get("text_config")
    return inner if isinstance(inner, dict) else cfg


def declares_mtp(cfg: dict[str, Any]) -> bool:
    return any(isinstance(_text(cfg).get(k) or cfg.get(k), int) and (_text(cfg).get(k) or cfg.get(k)) > 0
               for k in MTP_KEYS)


def is_quantized(d: Path, cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("quantization_config") or _text(cfg).get("quantization_config") or
                cfg.get("quantization") or (d / "hf_quant_config.json").is_file())


def is_multimodal(cfg: dict[str, Any]) -> bool:
    return any(k in cfg for k in ("vision_config", "vision_tower", "audio_config", "vision_backbone"))


def mtp_names(d: Path) -> list[str]:
    """The index's names of the MTP layers (``layers.N..`` past the last decoder layer, or an ``mtp`` prefix)."""
    if not (d / INDEX).is_file():  # a config-only entry: no names to drop
        return []
    cfg = _config(d)
    n = _text(cfg).get("num_hidden_layers")
    wmap = json.loads((d / INDEX).read_text())["weight_map"]
    count = max(int(_text(cfg).get(k) or cfg.get(k) or 0) for k in MTP_KEYS)
    wanted = tuple(f"layers.{i}." for i in range(int(n or 0), int(n or 0) + count))
    return [k for k in wmap if k.startswith("mtp") or ".mtp" in k or any(w in k for w in wanted)]


def drop_mtp(d: Path) -> int:
    """Remove the MTP layers' names from the index (what an export that skips them writes); how many went."""
    doc = json.loads((d / INDEX).read_text())
    gone = set(mtp_names(d))
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if k not in gone}
    (d / INDEX).write_text(json.dumps(doc))
    return len(gone)


@dataclass(frozen=True)
class Variant:
    """One planted defect: applies to an entry when ``fits``; ``plant`` edits the copy and returns doctor inputs."""

    name: str
    what: str
    fits: Callable[[Path, dict[str, Any]], bool]
    plant: Callable[[Path], dict[str, Any]]
    expect: Expect
    message: str = ""  # a phrase the finding's message must hold


def _plant_mtp_dropped(d: Path) -> dict[str, Any]:
    drop_mtp(d)
    return {}


def _plant_w4a16_export(d: Path) -> dict[str, Any]:
    # a W4A16 (compressed-tensors pack-quantized) re-export that drops the MTP layer, as the threads report
    drop_mtp(d)
    cfg = _config(d)
    cfg["quantization_config"] = quant_block("w4a16")
    _write_config(d, cfg)
    (d / "hf_quant_config.json").unlink(missing_ok=True)
    return {}


def _plant_fp8_dynamic(d: Path) -> dict[str, Any]:
    cfg = _config(d)
    cfg["quantization_config"] = quant_block("fp8-dynamic")
    _write_config(d, cfg)
    return {"engine": "vllm", "engine_version": "0.11.0"}


def _transform(name: str) -> Callable[[Path], dict[str, Any]]:
    """Plant compressed-tensors transform ``name`` into the target's quantization block (a W4A16 one where it has
    none), served on vLLM 0.33.0: SpinQuant's R1 rotates the residual stream; QuIP's stays inside layers (a near
    miss, info)."""
    def plant(d: Path) -> dict[str, Any]:
        cfg = _config(d)
        q = dict(cfg.get("quantization_config") or quant_block("w4a16"))
        q["transform_config"] = quant_block(f"transform-{name}")
        cfg["quantization_config"] = q
        _write_config(d, cfg)
        return {"engine": "vllm", "engine_version": "0.33.0"}
    return plant


def _plant_vision_tower(d: Path) -> dict[str, Any]:
    # a Qwen2-VL layout: SGLang 0.5.23 has no EAGLE-3 capture for Qwen2VLForConditionalGeneration
    cfg = _config(d)
    cfg["architectures"] = ["Qwen2VLForConditionalGeneration"]
    cfg["vision_config"] = {"depth": 32, "embed_dim": 1280, "hidden_size": 3584, "patch_size": 14}
    _write_config(d, cfg)
    return {"engine": "sglang", "engine_version": "0.5.23"}


VARIANTS: tuple[Variant, ...] = (
    Variant("mtp-dropped", "the MTP layer's names removed from the index",
            lambda d, c: declares_mtp(c) and bool(mtp_names(d)), _plant_mtp_dropped,
            [("mtp-weights-missing", "warning")], "names the shard index lists"),
    Variant("w4a16-without-mtp", "a W4A16 re-export (compressed-tensors pack-quantized) without the MTP layer",
            lambda d, c: declares_mtp(c) and bool(mtp_names(d)), _plant_w4a16_export,
            [("mtp-weights-missing", "warning")], "names the shard index lists"),
    Variant("fp8-dynamic-vllm-0.11.0", "compressed-tensors FP8-dynamic block, served on vLLM 0.11.0",
            lambda d, c: not is_quantized(d, c), _plant_fp8_dynamic, [("target-quantized", "warning")]),
    Variant("spinquant-r1", "a SpinQuant R1 transform_config (compressed-tensors), served on vLLM 0.33.0",
            lambda d, c: True, _transform("spinquant-r1"), [("target-rotated", "error")]),
    Variant("quip-near-miss", "QuIP transforms inside layers only (no residual rotation), vLLM 0.33.0",
            lambda d, c: True, _transform("quip"), []),
    Variant("vision-tower-sglang", "a Qwen2-VL vision tower, served on SGLang 0.5.23",
            lambda d, c: not is_multimodal(c) and not declares_mtp(c), _plant_vision_tower,
            [("multimodal-target", "error")]),
)
