"""The facts checks read from a drafter's and a target's config.json, tolerant of each trainer's layout.

Replay's ``read_spec`` refuses a config it cannot run; a check must instead report what is wrong,
so here every field is read as "the value, or None when absent or not a number". SpecForge writes
a flat Llama config; speculators nests the decoder layer's config under ``transformer_layer_config``
(speculators 0.9.0 ``speculators/models/eagle3/config.py``); multimodal targets nest ``text_config``.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..io.modeldir import ModelDir, TensorInfo, text_config

FLOAT_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
_CONFIG_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                  "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}


def positive_int(value: Any) -> int | None:
    """``value`` when it is a positive integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def config_dtype(cfg: dict[str, Any]) -> str | None:
    """The dtype a config declares (``torch_dtype`` in transformers 4, ``dtype`` in 5), normalised, or None."""
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if isinstance(value, str) and value.lower() in _CONFIG_DTYPES:
            return _CONFIG_DTYPES[value.lower()]
    return None


def aux_ids(cfg: dict[str, Any]) -> list[int] | None:
    """The draft's aux layer ids: the top-level key (speculators), else ``eagle_config``'s (SpecForge)."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    nested = cfg.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return list(ids)
    return None


@dataclass(frozen=True)
class DraftFacts:
    """A drafter config's sizes and switches; None where the config does not say."""

    layout: str  # specforge | speculators
    hidden_size: int | None
    target_hidden_size: int | None  # the width of each aux state the fc expects (defaults to hidden_size)
    vocab_size: int | None
    draft_vocab_size: int | None
    num_layers: int | None
    num_aux: int  # ids given, else EAGLE-3's three
    dtype: str | None
    architectures: tuple[str, ...]
    layer: dict[str, Any]  # the decoder layer's config (flat config for SpecForge)
    raw: dict[str, Any]


def draft_facts(cfg: dict[str, Any]) -> DraftFacts:
    """Read ``DraftFacts`` from a drafter's config.json dict."""
    layout = "speculators" if isinstance(cfg.get("transformer_layer_config"), dict) else "specforge"
    layer = cfg["transformer_layer_config"] if layout == "speculators" else cfg
    hidden = positive_int(layer.get("hidden_size"))
    vocab = positive_int(layer.get("vocab_size")) or positive_int(cfg.get("vocab_size"))
    draft_vocab = positive_int(cfg.get("draft_vocab_size")) or positive_int(layer.get("draft_vocab_size")) or vocab
    ids = aux_ids(cfg)
    archs = cfg.get("architectures")
    return DraftFacts(
        layout=layout, hidden_size=hidden,
        target_hidden_size=positive_int(cfg.get("target_hidden_size")) or hidden,
        vocab_size=vocab, draft_vocab_size=draft_vocab,
        num_layers=positive_int(layer.get("num_hidden_layers")), num_aux=len(ids) if ids else 3,
        dtype=config_dtype(cfg) or config_dtype(layer),
        architectures=tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        layer=layer, raw=cfg)


@dataclass(frozen=True)
class TargetFacts:
    """A target config's sizes; None where the config does not say."""

    hidden_size: int | None
    vocab_size: int | None
    num_layers: int | None
    dtype: str | None
    model_type: str | None
    max_positions: int | None
    raw: dict[str, Any]


def target_facts(cfg: dict[str, Any]) -> TargetFacts:
    """Read ``TargetFacts`` from a target's config.json dict (``text_config`` when nested)."""
    text = text_config(cfg)
    mtype = text.get("model_type", cfg.get("model_type"))
    return TargetFacts(
        hidden_size=positive_int(text.get("hidden_size")), vocab_size=positive_int(text.get("vocab_size")),
        num_layers=positive_int(text.get("num_hidden_layers")), dtype=config_dtype(text) or config_dtype(cfg),
        model_type=mtype if isinstance(mtype, str) else None,
        max_positions=positive_int(text.get("max_position_embeddings")), raw=cfg)


class Listed(Mapping[str, TensorInfo]):
    """Every tensor a model directory lists (its shard index's names, else its headers), each one's dtype and
    shape read from its shard's header when asked: a partial download's absent shard is not a missing tensor
    (looking one up raises ``io.modeldir.MissingShard``, and the doctor says the row is not run, naming the file)."""

    def __init__(self, md: ModelDir) -> None:
        self.md = md

    def __getitem__(self, name: str) -> TensorInfo:
        if name not in self.md.names:
            raise KeyError(name)
        return self.md.info(name)

    def __contains__(self, name: object) -> bool:
        return name in self.md.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.md.names)

    def __len__(self) -> int:
        return len(self.md.names)


def drafter_tensor(names: Any, canon: str) -> str | None:
    """The stored name of a drafter tensor (``fc.weight``, ``lm_head.weight``, ``embed_tokens.weight``, ``d2t``,
    ``t2d``) under the prefixes trainers use (none, ``model.``), or None."""
    for name in (canon, f"model.{canon}"):
        if name in names:
            return name
    return None
