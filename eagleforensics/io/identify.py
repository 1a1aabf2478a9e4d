"""What a model directory is, by content: an EAGLE-3 drafter (an ``fc`` over the aux states, one or a few decoder
layers, a trainer's config keys) or a target (many decoder layers, no ``fc``), before any check trusts the option
it came in.

A drafter given as ``--target`` and a target as ``--drafter`` pass every shape check that compares the two with
each other (the widths agree both ways), so the swap is caught here, from the headers and config alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ForensicsError, printable
from .modeldir import ModelDir, text_config

DRAFTER, TARGET = "drafter", "target"
_MARKERS = ("speculators_model_type", "eagle_config", "draft_vocab_size", "target_hidden_size",
            "eagle_aux_hidden_state_layer_ids", "transformer_layer_config")


@dataclass(frozen=True)
class ModelKind:
    """``kind`` (drafter, target or None when the content does not decide) and the evidence, in words."""

    kind: str | None
    why: str


def _layers(cfg: dict[str, Any]) -> int | None:
    n = text_config(cfg).get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _hidden(cfg: dict[str, Any]) -> int | None:
    h = text_config(cfg).get("hidden_size")
    return h if isinstance(h, int) and not isinstance(h, bool) and h > 0 else None


def _fc_width(md: ModelDir, names: Any) -> tuple[str, int | None] | None:
    """(name, in-features) of a top-level ``fc.weight`` (in-features None when its shard is absent), else None."""
    name = next((n for n in ("fc.weight", "model.fc.weight") if n in names), None)
    if name is None:
        return None
    try:
        shape = md.info(name).shape
    except (ForensicsError, OSError):
        return name, None
    return name, shape[1] if len(shape) == 2 else None


def model_kind(path: str | Path) -> ModelKind:
    """Recognise a model directory from its config.json and tensor names (nothing else is read).

    From structure, never from a word in the architecture's name (NVIDIA's ``Eagle2_5_VLForConditionalGeneration``
    is a vision-language target): a drafter has an ``fc`` reading k x H features (k >= 2: the aux states, or
    EAGLE-1's embedding and state), SpecForge's ``midlayer`` weights, or a trainer's config keys (aux ids,
    ``eagle_config``, ``draft_vocab_size``, ...); a target has two or more decoder layers and none of these.
    """
    try:
        md = ModelDir(path, "model directory")
        cfg, names = md.config, md.names
    except (ForensicsError, OSError):
        return ModelKind(None, "")
    hidden = _hidden(cfg)
    fc = _fc_width(md, names)
    fc_aux = fc is not None and (fc[1] is None or hidden is None or (fc[1] >= 2 * hidden and fc[1] % hidden == 0))
    midlayer = any(n.startswith(("midlayer.", "model.midlayer.")) for n in names)
    markers = [k for k in _MARKERS if k in cfg]
    layers = _layers(cfg)
    if fc_aux or midlayer or markers:
        why = ", ".join((["an fc over the aux states"] if fc_aux else []) + (["midlayer weights"] if midlayer else [])
                        + markers[:2] + ([f"{layers} decoder layer{'s' if layers != 1 else ''}"] if layers else []))
        return ModelKind(DRAFTER, why)
    if layers is not None and layers >= 2:
        return ModelKind(TARGET, f"{layers} decoder layers and no fc")
    return ModelKind(None, "")


def check_models(drafter: str | None, target: str | None) -> None:
    """One line (exit 2) when ``--drafter`` holds a target or ``--target`` a drafter, naming both paths and the swap."""
    d = model_kind(drafter) if drafter is not None else ModelKind(None, "")
    t = model_kind(target) if target is not None else ModelKind(None, "")
    if d.kind == TARGET and t.kind == DRAFTER:
        raise ForensicsError(f"--drafter {printable(drafter)} holds a target model ({d.why}) and --target "
                             f"{printable(target)} an EAGLE-3 drafter ({t.why}): the two look swapped; pass "
                             f"--drafter {printable(target)} --target {printable(drafter)}")
    if d.kind == TARGET:
        raise ForensicsError(f"--drafter {printable(drafter)} holds a target model ({d.why}), not an EAGLE-3 drafter"
                             + (f" (and --target {printable(target)} is not one either)" if target else "")
                             + ": pass the drafter's directory as --drafter")
    if t.kind == DRAFTER:
        raise ForensicsError(f"--target {printable(target)} holds an EAGLE-3 drafter ({t.why}), not the target model"
                             + (f" (and --drafter {printable(drafter)} is one too)" if d.kind == DRAFTER else "")
                             + ": pass the target model's directory as --target")


def is_model_dir(path: str | Path) -> bool:
    """A directory holding a model (config.json beside weights): never a directory of training records."""
    p = Path(path)
    return (p / "config.json").is_file() and any(
        p.glob("*.safetensors")) or (p / "config.json").is_file() and any(p.glob("pytorch_model*.bin"))
