"""Read an EAGLE-3 drafter checkpoint (SpecForge or speculators layout) and the few target tensors replay needs.

Only the tensors the forward pass uses are read, one at a time through ``safeload``'s own
safetensors reader (no pickle anywhere), then handed to torch over the same memory: replay runs
the drafter in torch, so this module (not on the align path) imports it. Key names as the trainers write them (SpecForge 0.2.0
``specforge/modeling/draft/llama3_eagle.py`` ``LlamaForCausalLMEagle3``: ``fc``, ``midlayer.*``,
``norm``, ``lm_head``, ``embed_tokens``, buffers ``d2t``/``t2d``; speculators 0.9.0
``speculators/models/eagle3/core.py`` ``Eagle3DraftModel``: the same names with the decoder layer
under ``layers.0.*`` and optional ``input_norm`` / ``fc_norm.{i}``). They are renamed to one
canonical set (``layer.*``) so the replay does not care which trainer wrote the file.
A drafter without ``embed_tokens`` (speculators does not require it, and the target's lm_head is
never in a drafter) gets them from the target's safetensors shards via
``model.safetensors.index.json``, reading just those tensors.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..arrays import to_torch
from ..errors import ForensicsError
from .guards import parse_json, read_regular
from .safeload import open_safetensors, read_safetensors_header, read_tensor

MAX_CONFIG_BYTES = 4 * 1024 * 1024
LAYER_PARTS = (
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
OPTIONAL_LAYER_PARTS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class DrafterSpec:
    """The shape and switches of a drafter's forward, read from its config.json."""

    path: str
    layout: str  # specforge | speculators
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    vocab_size: int
    draft_vocab_size: int
    num_aux: int
    norm_before_residual: bool = False  # speculators: residual is the normed fc output
    norm_before_head: bool = True  # SpecForge ``norm_output``: lm_head reads norm(h)
    feed_back_normed: bool = False  # speculators ``norm_output``: norm(h) is fed to the next step
    aux_layer_ids: list[int] | None = None
    target_hint: str | None = None  # speculators verifier name_or_path


@dataclass
class Drafter:
    """Config and canonical weights (``fc``, ``layer.*``, ``norm``, ``lm_head``, ``embed``, ``d2t``, ``t2d``)."""

    spec: DrafterSpec
    weights: dict[str, torch.Tensor]
    sources: dict[str, str] = field(default_factory=dict)  # canonical name -> file it came from

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target-vocab ids (``d2t`` holds offsets; absent = identity)."""
        d2t = self.weights.get("d2t")
        return draft_ids if d2t is None else draft_ids + d2t.to(draft_ids.device)[draft_ids]


@dataclass
class TargetHead:
    """The target's tensors replay may need: ``lm_head`` [V, H], final ``norm`` [H], ``embed`` [V, H]."""

    path: str
    lm_head: torch.Tensor | None
    norm: torch.Tensor | None
    embed: torch.Tensor | None
    rms_norm_eps: float
    sources: dict[str, str] = field(default_factory=dict)
    num_layers: int | None = None  # the target's num_hidden_layers, when its config says


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from ``path`` or ForensicsError naming it."""
    if not path.exists():
        raise ForensicsError(f"no {what} here", path=path)
    raw = read_regular(path, MAX_CONFIG_BYTES, what)  # FIFOs and devices refused, size bounded
    try:
        obj = parse_json(raw, path, what)  # nesting bounded
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ForensicsError(f"{what} is not valid JSON ({exc})", path=path) from None
    if not isinstance(obj, dict):
        raise ForensicsError(f"{what} is not a JSON object", path=path)
    return obj


def _int(cfg: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ForensicsError(f"config key {key!r} must be a positive integer, got {value!r}", path=path)
    return value


def _float(cfg: dict[str, Any], key: str, path: Path, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ForensicsError(f"config key {key!r} must be a positive number, got {value!r}", path=path)
    return float(value)


def _rope(cfg: dict[str, Any], path: Path) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and scaling, from the transformers 4.x keys or the 5.x ``rope_parameters``."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", "default") != "default":
            scaling = params
    theta = _float({"rope_theta": 10000.0 if theta is None else theta}, "rope_theta", path, 10000.0)
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise ForensicsError(f"rope_scaling must be an object, got {scaling!r}", path=path)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise ForensicsError(f"rope scaling {kind!r} is not supported by replay (supported: "
                                 f"{', '.join(ROPE_TYPES)})", path=path)
        if kind == "default":
            scaling = None
    return theta, scaling


def read_spec(directory: str | Path) -> DrafterSpec:
    """Parse the drafter's config.json (SpecForge flat Llama config, or speculators ``transformer_layer_config``)."""
    d = Path(directory)
    cfg_path = d / "config.json" if d.is_dir() else d
    cfg = read_json(cfg_path, "drafter config.json")
    if cfg.get("speculators_model_type") not in (None, "eagle3"):
        raise ForensicsError(f"speculators_model_type {cfg.get('speculators_model_type')!r} is not an EAGLE-3 "
                             "drafter", path=cfg_path)
    layout = "speculators" if "transformer_layer_config" in cfg else "specforge"
    inner = cfg.get("transformer_layer_config", cfg)
    if not isinstance(inner, dict):
        raise ForensicsError("transformer_layer_config is not an object", path=cfg_path)
    layers = inner.get("num_hidden_layers", 1)
    if layers != 1:
        raise ForensicsError(f"drafter has num_hidden_layers={layers!r}; replay supports the one-layer EAGLE-3 "
                             "drafter only", path=cfg_path)
    hidden = _int(inner, "hidden_size", cfg_path)
    heads = _int(inner, "num_attention_heads", cfg_path)
    kv = _int(inner, "num_key_value_heads", cfg_path, heads)
    head_dim = inner.get("head_dim") or hidden // heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", cfg_path)
    if heads % kv:
        raise ForensicsError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}", path=cfg_path)
    if head_dim % 2:
        raise ForensicsError(f"head_dim {head_dim} is odd; rotary embedding needs an even head_dim", path=cfg_path)
    act = inner.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ForensicsError(f"hidden_act {act!r} is not supported by replay (silu only)", path=cfg_path)
    theta, scaling = _rope(inner, cfg_path)
    vocab = _int(inner, "vocab_size", cfg_path)
    draft_vocab = _int(cfg if "draft_vocab_size" in cfg else inner, "draft_vocab_size", cfg_path, vocab)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    nested = cfg.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        raise ForensicsError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, got {ids!r}", path=cfg_path)
    hint = None
    spec_cfg = cfg.get("speculators_config")
    if isinstance(spec_cfg, dict) and isinstance(spec_cfg.get("verifier"), dict):
        hint = spec_cfg["verifier"].get("name_or_path")
    target_hidden = _int({"target_hidden_size": cfg.get("target_hidden_size") or hidden}, "target_hidden_size", cfg_path)
    norm_output = bool(cfg.get("norm_output", layout == "specforge"))
    return DrafterSpec(
        path=str(d), layout=layout, hidden_size=hidden, target_hidden_size=target_hidden, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, intermediate_size=_int(inner, "intermediate_size", cfg_path),
        rms_norm_eps=_float(inner, "rms_norm_eps", cfg_path, 1e-6), rope_theta=theta, rope_scaling=scaling,
        vocab_size=vocab, draft_vocab_size=draft_vocab, num_aux=len(ids) if ids else 3,
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        norm_before_head=norm_output if layout == "specforge" else True,
        feed_back_normed=norm_output if layout == "speculators" else False,
        aux_layer_ids=list(ids) if ids else None, target_hint=hint if isinstance(hint, str) else None,
    )


def _weight_files(d: Path) -> dict[str, Path]:
    """tensor name -> safetensors file, from ``model.safetensors`` or the shard index."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        obj = read_json(index, "safetensors shard index")
        wmap = obj.get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise ForensicsError("shard index has no weight_map object", path=index)
        out: dict[str, Path] = {}
        root = d.resolve()
        for name, shard in wmap.items():
            if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise ForensicsError(f"weight_map entry {name!r} names {shard!r}; expected a .safetensors file in "
                                     "the same directory", path=index)
            f = (root / shard)
            if not f.exists():  # a FIFO or device is refused by the header's guard when read, never skipped
                raise ForensicsError(f"weight_map names shard {shard!r}, which is missing", path=index)
            out[str(name)] = f
        return out
    single = d / "model.safetensors"
    if single.exists():  # not is_file(): a FIFO or device of this name is refused by the header's guard, not skipped
        return {name: single for name in read_safetensors_header(single) if name != "__metadata__"}
    others = sorted(d.glob("*.safetensors"))
    if not others:
        raise ForensicsError("no model.safetensors, shard index or *.safetensors here (only safetensors weights are "
                             "read; convert .bin/.pt checkpoints first)", path=d)
    out = {}
    for f in others:
        out.update({name: f for name in read_safetensors_header(f) if name != "__metadata__"})
    return out


class _Reader:
    """Reads named tensors from a set of safetensors files, opening each file once."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.handles: dict[Path, Any] = {}

    def get(self, name: str) -> torch.Tensor:
        f = self.files[name]
        if f not in self.handles:
            self.handles[f] = open_safetensors(f)
        return to_torch(read_tensor(self.handles[f], name, f))


def _drafter_names(files: dict[str, Path], layout: str, path: Path) -> dict[str, str]:
    """canonical name -> stored name, for every tensor the forward needs (optional ones when present)."""
    prefix = next((p for p in ("midlayer.", "layers.0.", "model.layers.0.") if any(k.startswith(p) for k in files)), None)
    if prefix is None:
        raise ForensicsError("no decoder layer weights (expected midlayer.* as SpecForge writes them or layers.0.* "
                             "as speculators does)", path=path)
    strip = "model." if any(k.startswith("model.fc.") for k in files) else ""
    names = {f"layer.{part}": prefix + part for part in LAYER_PARTS + OPTIONAL_LAYER_PARTS}
    for canon in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "input_norm.weight"):
        names[canon] = strip + canon if canon != "lm_head.weight" else canon
    names["embed"] = next((k for k in ("embed_tokens.weight", "model.embed_tokens.weight") if k in files),
                          "embed_tokens.weight")
    for i in range(8):
        names[f"fc_norm.{i}.weight"] = f"{strip}fc_norm.{i}.weight"
    return names


REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight") + tuple(f"layer.{p}" for p in LAYER_PARTS)


def _check_shapes(spec: DrafterSpec, w: dict[str, torch.Tensor], path: Path) -> None:
    h, th, d = spec.hidden_size, spec.target_hidden_size, spec.head_dim
    want = {
        "fc.weight": (h, spec.num_aux * th), "norm.weight": (h,), "lm_head.weight": (spec.draft_vocab_size, h),
        "layer.input_layernorm.weight": (h,), "layer.hidden_norm.weight": (h,),
        "layer.post_attention_layernorm.weight": (h,),
        "layer.self_attn.q_proj.weight": (spec.num_heads * d, 2 * h),
        "layer.self_attn.k_proj.weight": (spec.num_kv_heads * d, 2 * h),
        "layer.self_attn.v_proj.weight": (spec.num_kv_heads * d, 2 * h),
        "layer.self_attn.o_proj.weight": (h, spec.num_heads * d),
        "layer.mlp.gate_proj.weight": (spec.intermediate_size, h), "layer.mlp.up_proj.weight": (spec.intermediate_size, h),
        "layer.mlp.down_proj.weight": (h, spec.intermediate_size),
        "layer.self_attn.q_norm.weight": (d,), "layer.self_attn.k_norm.weight": (d,),
        "input_norm.weight": (spec.num_aux * th,), "embed": (spec.vocab_size, h),
        "d2t": (spec.draft_vocab_size,), "t2d": (spec.vocab_size,),
    }
    for i in range(spec.num_aux):
        want[f"fc_norm.{i}.weight"] = (th,)
    for name, t in w.items():
        if name in want and tuple(t.shape) != want[name]:
            raise ForensicsError(f"tensor {name} has shape {list(t.shape)}, config implies {list(want[name])}", path=path)
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ForensicsError(f"tensor {name} holds NaN or Inf", path=path)
    if "d2t" in w:
        if w["d2t"].is_floating_point():
            raise ForensicsError("d2t must hold integers (draft id -> target id offsets)", path=path)
        mapped = torch.arange(spec.draft_vocab_size) + w["d2t"].long()
        if int(mapped.min()) < 0 or int(mapped.max()) >= spec.vocab_size:
            raise ForensicsError("d2t maps a draft id outside the target vocabulary", path=path)


def load_drafter(directory: str | Path, *, target: str | Path | None = None) -> Drafter:
    """Load a drafter's config and the tensors replay uses; the embedding from ``target`` when the drafter lacks it."""
    d = Path(directory)
    if not d.is_dir():
        raise ForensicsError("expected the drafter's directory (config.json + safetensors)", path=d)
    spec = read_spec(d)
    files = _weight_files(d)
    names = _drafter_names(files, spec.layout, d)
    missing = [names[c] for c in REQUIRED if names[c] not in files]
    if missing:
        raise ForensicsError(f"drafter lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}", path=d)
    biases = sorted(k for k in files if k.endswith(".bias") and not k.startswith(("verifier", "model.verifier")))
    if biases:
        raise ForensicsError(f"drafter has bias tensors ({', '.join(biases[:3])}); replay supports bias-free "
                             "EAGLE-3 drafters only", path=d)
    reader = _Reader(files)
    weights: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    for canon, stored in names.items():
        if stored in files and (not canon.startswith("fc_norm.") or int(canon.split(".")[1]) < spec.num_aux):
            weights[canon] = reader.get(stored)
            sources[canon] = str(files[stored])
    if "embed" not in weights:
        if target is None:
            raise ForensicsError("the drafter carries no embed_tokens.weight: pass --target with the target model's "
                                 "directory (its embedding is read from the safetensors shards)", path=d)
        head = load_target(target, embed=True, lm_head=False, norm=False)
        if head.embed is None:
            raise ForensicsError("target has no embed_tokens weight", path=target)
        weights["embed"] = head.embed
        sources["embed"] = head.sources["embed"]
    _check_shapes(spec, weights, d)
    return Drafter(spec, weights, sources)


def _find(files: dict[str, Path], suffix: str) -> str | None:
    """The stored name for ``suffix`` (exact HF name first, else the one name ending with it)."""
    exact = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight", "norm": "model.norm.weight"}[suffix]
    if exact in files:
        return exact
    tail = {"embed": "embed_tokens.weight", "lm_head": "lm_head.weight", "norm": "model.norm.weight"}[suffix]
    hits = [k for k in files if k.endswith(tail) and "mtp" not in k and ".layers." not in k]
    return hits[0] if len(hits) == 1 else None


def load_target(directory: str | Path, *, embed: bool = True, lm_head: bool = True, norm: bool = True) -> TargetHead:
    """Read only the target's embedding / lm_head / final norm (as asked) from its safetensors shards."""
    d = Path(directory)
    if not d.is_dir():
        raise ForensicsError("expected the target model's directory (config.json + safetensors shards)", path=d)
    cfg = read_json(d / "config.json", "target config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    eps = _float(text_cfg, "rms_norm_eps", d / "config.json", 1e-6)
    files = _weight_files(d)
    reader = _Reader(files)
    layers = text_cfg.get("num_hidden_layers")
    out = TargetHead(str(d), None, None, None, eps,
                     num_layers=layers if isinstance(layers, int) and not isinstance(layers, bool) else None)
    wanted = [k for k, on in (("embed", embed), ("lm_head", lm_head), ("norm", norm)) if on]
    for what in wanted:
        name = _find(files, what)
        if name is None and what == "lm_head" and text_cfg.get("tie_word_embeddings"):
            name = _find(files, "embed")
        if name is None:
            raise ForensicsError(f"target has no {what} tensor (looked for {what} names in the safetensors index)", path=d)
        t = reader.get(name)
        if t.dim() != (1 if what == "norm" else 2) or not t.is_floating_point():
            raise ForensicsError(f"target tensor {name} has shape {list(t.shape)} {t.dtype}; not a {what}", path=d)
        setattr(out, what, t)
        out.sources[what] = str(files[name])
    return out
