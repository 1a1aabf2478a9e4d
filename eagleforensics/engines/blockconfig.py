"""Drafter configs read far enough for depth and block drafters (docs/causes.md rows 32, 33).

Block drafters (DFlash, DSpark, P-EAGLE) keep their settings either nested (``dflash_config``) or top-level;
both engines read the nested key first and fall back to the top-level one (SGLang 0.5.23
speculative/dflash_utils.py ``parse_dflash_draft_config``; vLLM 0.34.0 config/speculative.py
``_get_nested_config_value``, model_executor/models/qwen3_dflash.py). A DFlash ``block_size`` B is the verify
window with its anchor: B - 1 drafted tokens (B with ``sample_from_anchor``; speculators
models/dflash/core.py), which SGLang takes as ``speculative_num_draft_tokens`` (``--speculative-dflash-block-size``
is its alias: arg_groups/fields/spec.py) and vLLM as ``num_speculative_tokens`` + 1. DSpark's ``block_size`` is
the drafted count (gamma; SGLang verifies gamma + 1; vLLM 0.34.0 requires ``num_speculative_tokens ==
block_size``). ``mask_token_id`` missing: SGLang resolves ``mask_token`` (default ``<|MASK|>``) in the target's
tokenizer and adds it when absent (speculative/dflash_worker_v2.py ``_resolve_mask_token_id``).

The trained horizon of a chain drafter: ``ttt_length`` / ``ttt_steps`` in its config or beside it in a
trainer's arguments file (SpecForge config/schema.py ``ttt_length``, default 7), speculators'
``proposal_methods[].speculative_tokens``, or the MTP layer count (``num_nextn_predict_layers``,
``mtp_num_hidden_layers``) of a target served with its own MTP head.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK_KINDS = ("dflash", "dspark", "peagle")
NESTED = ("dflash_config", "dspark_config", "peagle_config")
TRAINER_FILES = ("training_args.json", "train_args.json", "trainer_args.json", "args.json")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class BlockFacts:
    """A block drafter's settings as each engine reads them."""

    kind: str
    block_size: int | None  # what the engines read (nested first)
    nested_block: int | None
    top_block: int | None
    mask_token_id: int | None
    mask_where: str
    sample_from_anchor: bool

    @property
    def drafted(self) -> int | None:
        """Tokens drafted per round the drafter was trained for."""
        if self.block_size is None:
            return None
        if self.kind == "dflash" and not self.sample_from_anchor:
            return self.block_size - 1
        return self.block_size


def block_kind(cfg: dict[str, Any]) -> str | None:
    """'dflash' / 'dspark' / 'peagle' for a block drafter's config, else None."""
    names = " ".join([str(cfg.get("model_type", "")), str(cfg.get("speculators_model_type", "")),
                      *map(str, cfg.get("architectures") or [])]).lower()
    for kind in BLOCK_KINDS:
        if kind in names or f"{kind}_config" in cfg:
            return kind
    return None


def block_facts(cfg: dict[str, Any]) -> BlockFacts | None:
    kind = block_kind(cfg)
    if kind is None:
        return None
    nested = next((cfg[k] for k in NESTED if isinstance(cfg.get(k), dict)), {})
    nb, tb = _int(nested.get("block_size")), _int(cfg.get("block_size"))
    if kind == "dspark" and nb is None and tb is None:
        tb = _int(cfg.get("dspark_block_size"))
    mask = nested.get("mask_token_id")
    where = "nested" if _int(mask) is not None else ""
    if where == "":
        for key in ("mask_token_id", "dspark_noise_token_id"):
            if _int(cfg.get(key)) is not None:
                mask, where = cfg[key], "top-level"
                break
    anchor = bool(nested.get("sample_from_anchor", cfg.get("sample_from_anchor", False)))
    return BlockFacts(kind, nb if nb is not None else tb, nb, tb, _int(mask) if where else None, where, anchor)


@dataclass(frozen=True)
class Horizon:
    """How many tokens ahead a drafter was trained to draft, and where that was read."""

    steps: int
    where: str
    kind: str  # 'trained' (a training horizon) | 'config' (the count a config names) | 'mtp-layers'


def trained_horizon(cfg: dict[str, Any], drafter_dir: str | None) -> Horizon | None:
    """The chain drafter's trained horizon from its config or a trainer's arguments file beside it."""
    for key in ("ttt_length", "ttt_steps", "num_ttt_steps"):
        if _int(cfg.get(key)):
            return Horizon(cfg[key], f"config {key}", "trained")
    if drafter_dir:
        for name in TRAINER_FILES:
            p = Path(drafter_dir) / name
            if p.is_file() and p.stat().st_size < 1 << 20:
                try:
                    args = json.loads(p.read_text(encoding="utf-8"))
                except (ValueError, UnicodeDecodeError):
                    continue
                if isinstance(args, dict) and _int(args.get("ttt_length")):
                    return Horizon(args["ttt_length"], f"{name} ttt_length", "trained")
    spec = cfg.get("speculators_config")
    if isinstance(spec, dict):
        for method in spec.get("proposal_methods") or []:
            if isinstance(method, dict) and _int(method.get("speculative_tokens")):
                return Horizon(method["speculative_tokens"], "speculators_config proposal_methods speculative_tokens",
                               "config")
    facts = block_facts(cfg)
    if facts is not None and facts.drafted:
        return Horizon(facts.drafted, f"{facts.kind} block_size {facts.block_size}", "trained")
    return None


def mtp_layers(target_cfg: dict[str, Any]) -> int | None:
    """The MTP / next-n layer count a target declares."""
    text = target_cfg.get("text_config") if isinstance(target_cfg.get("text_config"), dict) else {}
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"):
        for source in (target_cfg, text):
            if _int(source.get(key)):
                return source[key]
    return None
