"""Read an EAGLE-3 drafter checkpoint (SpecForge or speculators layout) and the few target tensors replay needs.

Only the tensors the forward pass uses are read, one at a time through ``safeload``'s own
safetensors reader (no pickle anywhere), then handed to torch over the same memory: replay runs
the drafter in torch, so this module (not on the align path) imports it. Key names as the trainers write them (SpecForge 0.2.0
``specforge/modeling/draft/llama3_eagle.py`` ``LlamaForCausalLMEagle3``: ``fc``, ``midlayer.*``,
``norm``, ``lm_head``, ``embed_tokens``, buffers ``d2t``/``t2d``; speculators 0.9.0
``speculators/models/eagle3/core.py`` ``Eagle3DraftModel``: the same names with the decoder layers
under ``layers.{i}.*`` and optional ``input_norm`` / ``fc_norm.{i}``). They are renamed to one
canonical set (``layer.*`` for the first decoder layer, ``layers.{i}.*`` for later ones) so the
replay does not care which trainer wrote the file. Layers after the first are plain decoder layers
(speculators builds them with the model's own ``LlamaDecoderLayer``/``Qwen3DecoderLayer``: an
``input_layernorm`` on the residual stream and H-wide projections).
Every tensor's shape and dtype is checked against config.json from the safetensors headers before
any tensor is read. A drafter without ``embed_tokens`` (speculators does not require it, and the
target's lm_head is never in a drafter) gets them from the target's safetensors shards via
``model.safetensors.index.json``, reading just those tensors.

``Drafter.features()`` lists which of ``io.served.SERVED_FEATURES`` (the features an engine may ignore when
it serves the drafter) this drafter uses; ``drafter.replay.DraftForward(drop=...)`` runs the forward
without them ("replay as served").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..arrays import to_torch
from ..errors import ForensicsError
from .diskrows import DiskRows, all_finite, disk_rows
from .drafternames import LATER_LAYER_PARTS, LAYER_PARTS, OPTIONAL_LAYER_PARTS
from .modeldir import ModelDir, TensorInfo, open_weights, read_config
from .safeload import read_tensor
from .served import EXTRA_LAYERS, OWN_EMBEDDING, SERVED_FEATURES  # noqa: F401  (SERVED_FEATURES re-exported: the forward's drop names)

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_LAYERS = 64
ROPE_TYPES = ("default", "llama3", "linear", "yarn")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
SIGNED_DTYPES = ("I8", "I16", "I32", "I64")

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
    num_layers: int = 1  # decoder layers; the first reads cat(embedding, state), the rest are plain layers
    sliding_window: int | None = None  # window of the layers in ``sliding_layers``
    sliding_layers: tuple[int, ...] = ()
    max_position_embeddings: int | None = None


@dataclass
class Drafter:
    """Config and canonical weights (``fc``, ``layer.*``, ``layers.{i}.*``, ``norm``, ``lm_head``, ``embed``, ``d2t``, ``t2d``).

    ``target_embed`` holds the target's embedding when one was asked for (``--served-without own_embedding``).
    """

    spec: DrafterSpec
    weights: dict[str, torch.Tensor]
    sources: dict[str, str] = field(default_factory=dict)  # canonical name -> file it came from
    embed_from_target: bool = False  # the drafter has no embed_tokens: ``embed`` is the target's

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target-vocab ids (``d2t`` holds offsets; absent = identity)."""
        d2t = self.weights.get("d2t")
        return draft_ids if d2t is None else draft_ids + d2t.to(draft_ids.device)[draft_ids]

    @property
    def own_embedding(self) -> bool:
        """True when the embedding came from the drafter's own file (not from the target)."""
        return "embed" in self.weights and not self.embed_from_target

    def features(self) -> set[str]:
        """The ``SERVED_FEATURES`` this drafter uses (an engine that ignores one of them serves it differently)."""
        s, w = self.spec, self.weights
        out = set()
        if "input_norm.weight" in w:
            out.add("norm_before_fc")
        if "fc_norm.0.weight" in w:
            out.add("fc_norm")
        if not s.norm_before_head or s.feed_back_normed:
            out.add("norm_output")
        if s.norm_before_residual:
            out.add("norm_before_residual")
        if self.own_embedding:
            out.add(OWN_EMBEDDING)
        if s.num_layers > 1:
            out.add(EXTRA_LAYERS)
        if s.sliding_layers:
            out.add("sliding_window")
        return out


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


def _int(cfg: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ForensicsError(f"config key {key!r} must be a positive integer, got {_short(value)}", path=path)
    return value


def _float(cfg: dict[str, Any], key: str, path: Path, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ForensicsError(f"config key {key!r} must be a positive number, got {_short(value)}", path=path)
    return float(value)


def _short(value: Any) -> str:
    """repr of a config value, cut short (a hostile config may hold a huge string)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _rope_number(sc: dict[str, Any], key: str, path: Path, default: float | None, *, minimum: float = 0.0,
                 allow_zero: bool = False) -> float | None:
    """A finite rope_scaling number above ``minimum`` (or ``default`` when absent); one line otherwise."""
    value = sc.get(key)
    if value is None:
        return default
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and (
        value > minimum or (allow_zero and value == minimum))
    if not ok:
        raise ForensicsError(f"rope_scaling {key} must be a finite number {'>=' if allow_zero else '>'} {minimum:g}, "
                             f"got {_short(value)}", path=path)
    return float(value)


def _rope(cfg: dict[str, Any], path: Path) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and validated scaling, from the transformers 4.x keys or the 5.x ``rope_parameters``.

    The scaling comes back normalised (``rope_type`` plus float parameters) so the forward never meets
    a value it cannot use: bad values are one line here, not a crash in the rotary tables.
    """
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
    elif params is not None:
        raise ForensicsError(f"rope_parameters must be an object, got {_short(params)}", path=path)
    theta = _float({"rope_theta": 10000.0 if theta is None else theta}, "rope_theta", path, 10000.0)
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise ForensicsError(f"rope_scaling must be an object, got {_short(scaling)}", path=path)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise ForensicsError(f"rope scaling {_short(kind)} is not supported by replay (supported: "
                             f"{', '.join(ROPE_TYPES)})", path=path)
    partial = _rope_number(scaling, "partial_rotary_factor", path, 1.0)
    if partial != 1.0 or cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ForensicsError("partial rotary embedding (partial_rotary_factor < 1) is not supported by replay",
                             path=path)
    if kind == "default":
        return theta, None
    out: dict[str, Any] = {"rope_type": kind}
    if kind == "linear":
        out["factor"] = _rope_number(scaling, "factor", path, None)
        if out["factor"] is None:
            raise ForensicsError("rope_scaling linear needs a factor", path=path)
    elif kind == "llama3":
        # transformers 5.24 (modeling_rope_utils.py _validate_llama3_rope_parameters) and vLLM 0.33.0, 0.34.0
        # (model_executor/layers/rotary_embedding/__init__.py get_rope) fail to load a llama3 scaling without
        # these three (KeyError); only SGLang 0.5.23 defaults them, with a warning
        out["factor"] = _rope_number(scaling, "factor", path, None)
        low = _rope_number(scaling, "low_freq_factor", path, None)
        high = _rope_number(scaling, "high_freq_factor", path, None)
        missing = [k for k, v in (("factor", out["factor"]), ("low_freq_factor", low), ("high_freq_factor", high))
                   if v is None]
        if missing:
            raise ForensicsError(f"rope_scaling llama3 has no {', '.join(missing)}: transformers and vLLM fail to "
                                 "load it (KeyError); write the values the drafter was trained with", path=path)
        if not high > low:  # type: ignore[operator]
            raise ForensicsError(f"rope_scaling llama3 needs high_freq_factor > low_freq_factor, got {high:g} and "
                                 f"{low:g}", path=path)
        original = _rope_number(scaling, "original_max_position_embeddings", path, None)
        if original is None:
            # transformers 5.24 (standardize_rope_params) and SGLang 0.5.23 (rotary_embedding/factory.py) take the
            # config's max_position_embeddings; vLLM 0.10.0 with transformers 4 fails (KeyError in get_rope)
            most = cfg.get("max_position_embeddings")
            if isinstance(most, bool) or not isinstance(most, int) or most <= 0:
                raise ForensicsError("rope_scaling llama3 has no original_max_position_embeddings and the config no "
                                     "max_position_embeddings to take it from (as transformers and SGLang do)",
                                     path=path)
            original = float(most)
            out["original_assumed"] = True
        out.update(low_freq_factor=low, high_freq_factor=high, original_max_position_embeddings=original)
    else:  # yarn, as transformers' _compute_yarn_parameters reads it
        original = _rope_number(scaling, "original_max_position_embeddings", path, None)
        if original is None:
            raise ForensicsError("rope_scaling yarn needs original_max_position_embeddings", path=path)
        factor = _rope_number(scaling, "factor", path, None)
        if factor is None:
            most = cfg.get("max_position_embeddings")
            if isinstance(most, bool) or not isinstance(most, int) or most <= 0:
                raise ForensicsError("rope_scaling yarn has no factor and no max_position_embeddings to derive it",
                                     path=path)
            factor = most / original
        out.update(factor=factor, original_max_position_embeddings=original,
                   beta_fast=_rope_number(scaling, "beta_fast", path, 32.0),
                   beta_slow=_rope_number(scaling, "beta_slow", path, 1.0),
                   mscale=_rope_number(scaling, "mscale", path, None, allow_zero=True),
                   mscale_all_dim=_rope_number(scaling, "mscale_all_dim", path, None, allow_zero=True),
                   attention_factor=_rope_number(scaling, "attention_factor", path, None))
        truncate = scaling.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ForensicsError(f"rope_scaling truncate must be true or false, got {_short(truncate)}", path=path)
        out["truncate"] = truncate
    return theta, out


def _sliding(inner: dict[str, Any], layers: int, path: Path) -> tuple[int | None, tuple[int, ...]]:
    """(window, sliding layer indices) from ``layer_types`` or ``use_sliding_window`` (speculators reads layer_types)."""
    types = inner.get("layer_types")
    sliding: tuple[int, ...] = ()
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            raise ForensicsError(f"layer_types must list one string per decoder layer ({layers}), got "
                                 f"{_short(types)}", path=path)
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif inner.get("use_sliding_window") is True:
        first = inner.get("max_window_layers", 0)
        first = first if isinstance(first, int) and not isinstance(first, bool) and first >= 0 else 0
        sliding = tuple(range(min(first, layers), layers))
    if not sliding:
        return None, ()
    return _int(inner, "sliding_window", path), sliding


def read_spec(directory: str | Path) -> DrafterSpec:
    """Parse the drafter's config.json (SpecForge flat Llama config, or speculators ``transformer_layer_config``)."""
    d = Path(directory)
    cfg_path = d / "config.json" if d.is_dir() else d
    cfg = read_config(cfg_path, "drafter config.json")
    if cfg.get("speculators_model_type") not in (None, "eagle3"):
        raise ForensicsError(f"speculators_model_type {_short(cfg.get('speculators_model_type'))} is not an EAGLE-3 "
                             "drafter", path=cfg_path)
    layout = "speculators" if "transformer_layer_config" in cfg else "specforge"
    inner = cfg.get("transformer_layer_config", cfg)
    if not isinstance(inner, dict):
        raise ForensicsError("transformer_layer_config is not an object", path=cfg_path)
    layers = _int(inner, "num_hidden_layers", cfg_path, 1)
    if layers > MAX_LAYERS:
        raise ForensicsError(f"drafter has num_hidden_layers={layers}; replay reads at most {MAX_LAYERS}",
                             path=cfg_path)
    hidden = _int(inner, "hidden_size", cfg_path)
    heads = _int(inner, "num_attention_heads", cfg_path)
    kv = _int(inner, "num_key_value_heads", cfg_path, heads)
    head_dim = inner.get("head_dim") or (hidden // heads if hidden >= heads else None)
    head_dim = _int({"head_dim": head_dim}, "head_dim", cfg_path)
    if heads % kv:
        raise ForensicsError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}", path=cfg_path)
    if head_dim % 2:
        raise ForensicsError(f"head_dim {head_dim} is odd; rotary embedding needs an even head_dim", path=cfg_path)
    act = inner.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ForensicsError(f"hidden_act {_short(act)} is not supported by replay (silu only)", path=cfg_path)
    theta, scaling = _rope(inner, cfg_path)
    window, sliding = _sliding(inner, layers, cfg_path)
    vocab = _int(inner, "vocab_size", cfg_path)
    draft_vocab = _int(cfg if "draft_vocab_size" in cfg else inner, "draft_vocab_size", cfg_path, vocab)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    nested = cfg.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and not (isinstance(ids, list) and 0 < len(ids) <= 16
                                and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ForensicsError(f"eagle_aux_hidden_state_layer_ids must be a list of integers, got {_short(ids)}",
                             path=cfg_path)
    hint = None
    spec_cfg = cfg.get("speculators_config")
    if isinstance(spec_cfg, dict) and isinstance(spec_cfg.get("verifier"), dict):
        hint = spec_cfg["verifier"].get("name_or_path")
    target_hidden = _int({"target_hidden_size": cfg.get("target_hidden_size") or hidden}, "target_hidden_size", cfg_path)
    norm_output = bool(cfg.get("norm_output", layout == "specforge"))
    most = inner.get("max_position_embeddings")
    return DrafterSpec(
        path=str(d), layout=layout, hidden_size=hidden, target_hidden_size=target_hidden, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, intermediate_size=_int(inner, "intermediate_size", cfg_path),
        rms_norm_eps=_float(inner, "rms_norm_eps", cfg_path, 1e-6), rope_theta=theta, rope_scaling=scaling,
        vocab_size=vocab, draft_vocab_size=draft_vocab, num_aux=len(ids) if ids else 3,
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        norm_before_head=norm_output if layout == "specforge" else True,
        feed_back_normed=norm_output if layout == "speculators" else False,
        aux_layer_ids=list(ids) if ids else None, target_hint=hint if isinstance(hint, str) else None,
        num_layers=layers, sliding_window=window, sliding_layers=sliding,
        max_position_embeddings=most if isinstance(most, int) and not isinstance(most, bool) and most > 0 else None,
    )


class _Reader:
    """Reads named tensors from a set of safetensors files, opening each file once."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.handles: dict[Path, Any] = {}

    def get(self, name: str) -> torch.Tensor:
        f = self.files[name]
        if f not in self.handles:
            self.handles[f] = open_weights(f)
        return to_torch(read_tensor(self.handles[f], name, f))


def _layer_prefix(files: dict[str, Path], i: int) -> str | None:
    """The stored prefix of decoder layer ``i`` (``midlayer.`` is SpecForge's name for the only layer)."""
    options = ("midlayer.", "layers.0.", "model.layers.0.") if i == 0 else (f"layers.{i}.", f"model.layers.{i}.")
    return next((p for p in options if any(k.startswith(p) for k in files)), None)


def _drafter_names(files: dict[str, Path], spec: DrafterSpec, path: Path) -> dict[str, str]:
    """canonical name -> stored name, for every tensor the forward needs (optional ones when present)."""
    prefix = _layer_prefix(files, 0)
    if prefix is None:
        raise ForensicsError("no decoder layer weights (expected midlayer.* as SpecForge writes them or layers.0.* "
                             "as speculators does)", path=path)
    beyond = _layer_prefix(files, spec.num_layers)
    if beyond is not None:
        raise ForensicsError(f"drafter holds weights of decoder layer {spec.num_layers} ({beyond}*) but config.json "
                             f"says num_hidden_layers={spec.num_layers}", path=path)
    strip = "model." if any(k.startswith("model.fc.") for k in files) else ""
    names = {f"layer.{part}": prefix + part for part in LAYER_PARTS + OPTIONAL_LAYER_PARTS}
    for i in range(1, spec.num_layers):
        pre = _layer_prefix(files, i)
        if pre is None:
            raise ForensicsError(f"config.json says num_hidden_layers={spec.num_layers} but the drafter has no "
                                 f"layers.{i}.* weights", path=path)
        for part in LATER_LAYER_PARTS + OPTIONAL_LAYER_PARTS:
            names[f"layers.{i}.{part}"] = pre + part
        if pre + "input_layernorm.weight" not in files and pre + "hidden_norm.weight" in files:
            names[f"layers.{i}.input_layernorm.weight"] = pre + "hidden_norm.weight"  # SGLang's name for it
    for canon in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "input_norm.weight"):
        names[canon] = strip + canon if canon != "lm_head.weight" else canon
    names["embed"] = next((k for k in ("embed_tokens.weight", "model.embed_tokens.weight") if k in files),
                          "embed_tokens.weight")
    for i in range(spec.num_aux):
        names[f"fc_norm.{i}.weight"] = f"{strip}fc_norm.{i}.weight"
    return names


def required(spec: DrafterSpec) -> tuple[str, ...]:
    """Canonical names every drafter of this shape must carry."""
    later = tuple(f"layers.{i}.{p}" for i in range(1, spec.num_layers) for p in LATER_LAYER_PARTS)
    return ("fc.weight", "norm.weight", "lm_head.weight") + tuple(f"layer.{p}" for p in LAYER_PARTS) + later


REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight") + tuple(f"layer.{p}" for p in LAYER_PARTS)


def expected_shapes(spec: DrafterSpec) -> dict[str, tuple[int, ...]]:
    """The shape config.json implies for every canonical tensor name."""
    h, th, d = spec.hidden_size, spec.target_hidden_size, spec.head_dim
    want: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, spec.num_aux * th), "norm.weight": (h,), "lm_head.weight": (spec.draft_vocab_size, h),
        "input_norm.weight": (spec.num_aux * th,), "embed": (spec.vocab_size, h), "target_embed": (spec.vocab_size, h),
        "d2t": (spec.draft_vocab_size,), "t2d": (spec.vocab_size,),
    }
    for i in range(spec.num_aux):
        want[f"fc_norm.{i}.weight"] = (th,)
    for i in range(spec.num_layers):
        pre, width = ("layer.", 2 * h) if i == 0 else (f"layers.{i}.", h)
        want.update({
            pre + "input_layernorm.weight": (h,), pre + "hidden_norm.weight": (h,),
            pre + "post_attention_layernorm.weight": (h,),
            pre + "self_attn.q_proj.weight": (spec.num_heads * d, width),
            pre + "self_attn.k_proj.weight": (spec.num_kv_heads * d, width),
            pre + "self_attn.v_proj.weight": (spec.num_kv_heads * d, width),
            pre + "self_attn.o_proj.weight": (h, spec.num_heads * d),
            pre + "mlp.gate_proj.weight": (spec.intermediate_size, h), pre + "mlp.up_proj.weight": (spec.intermediate_size, h),
            pre + "mlp.down_proj.weight": (h, spec.intermediate_size),
            pre + "self_attn.q_norm.weight": (d,), pre + "self_attn.k_norm.weight": (d,),
        })
    return want


def _kind_ok(canon: str, dtype: str) -> str | None:
    """Why a stored dtype cannot serve as ``canon`` (None when it can)."""
    if canon == "d2t":
        return None if dtype in SIGNED_DTYPES else "it must hold signed integer offsets (SpecForge writes int64)"
    if canon == "t2d":
        return None if dtype in SIGNED_DTYPES + ("BOOL", "U8") else "it must be a boolean or integer mask"
    return None if dtype in FLOAT_DTYPES else "replay reads float16/bfloat16/float32 weights"


def _check_headers(spec: DrafterSpec, names: dict[str, str], md: ModelDir, path: Path) -> None:
    """Shapes and dtypes of every tensor to be read, from the headers, against config.json: before any data is read."""
    want = expected_shapes(spec)
    files = {n: t.file for n, t in md.tensors.items()}
    for canon, stored in names.items():
        if stored not in files:
            continue
        dtype, shape = md.info(stored).dtype, md.info(stored).shape
        why = _kind_ok(canon, dtype)
        if why is not None:
            raise ForensicsError(f"tensor {stored} has dtype {dtype}; {why}", path=files[stored])
        if canon in want and shape != want[canon]:
            raise ForensicsError(f"tensor {stored} has shape {list(shape)}, config implies {list(want[canon])}",
                                 path=files[stored])


def _check_values(spec: DrafterSpec, w: dict[str, torch.Tensor], path: Path, finite: bool = True) -> None:
    """Shapes of what was read (the target's embedding included), finite floats (unless ``finite`` is False: the
    caller checks them where they go, ``check_finite``), d2t inside the target vocabulary."""
    want = expected_shapes(spec)
    for name, t in w.items():
        if name in want and tuple(t.shape) != want[name]:
            raise ForensicsError(f"tensor {name} has shape {list(t.shape)}, config implies {list(want[name])}", path=path)
        if not finite:
            continue
        if isinstance(t, DiskRows):
            t.check_finite(f"tensor {name}", path)
        elif t.is_floating_point() and not all_finite(t):
            raise ForensicsError(f"tensor {name} holds NaN or Inf", path=path)
    if "d2t" in w:
        if w["d2t"].is_floating_point() or w["d2t"].dtype == torch.bool:
            raise ForensicsError("d2t must hold integers (draft id -> target id offsets)", path=path)
        mapped = torch.arange(spec.draft_vocab_size) + w["d2t"].long()
        if int(mapped.min()) < 0 or int(mapped.max()) >= spec.vocab_size:
            raise ForensicsError("d2t maps a draft id outside the target vocabulary", path=path)
    elif spec.draft_vocab_size != spec.vocab_size:
        raise ForensicsError(f"draft vocabulary ({spec.draft_vocab_size}) differs from the target's "
                             f"({spec.vocab_size}) but the drafter has no d2t map", path=path)


def check_finite(weights: dict[str, Any], path: str | Path) -> None:
    """NaN or Inf in any float weight is bad input, said as ``load_drafter`` says it (run where the weights are:
    on a GPU, a pass over them there costs milliseconds)."""
    for name, t in weights.items():
        if isinstance(t, DiskRows):
            t.check_finite(f"tensor {name}", path)
        elif t.is_floating_point() and not all_finite(t):
            raise ForensicsError(f"tensor {name} holds NaN or Inf", path=path)


def load_drafter(directory: str | Path, *, target: str | Path | None = None, target_embed: bool = False,
                 lazy: bool = False, check_finite: bool = True) -> Drafter:
    """Load a drafter's config and the tensors replay uses; the embedding from ``target`` when the drafter lacks it.

    ``target_embed`` also reads the target's embedding into ``weights["target_embed"]`` (to replay the drafter as
    an engine serves it when it ignores the drafter's own ``embed_tokens``). ``lazy``: the embeddings are
    ``io.diskrows.DiskRows`` (rows read as looked up, never held whole; checked finite in one streamed pass).
    ``check_finite=False`` leaves the NaN/Inf test to the caller (``check_finite`` where the weights go).
    """
    d = Path(directory)
    if not d.is_dir():
        raise ForensicsError("expected the drafter's directory (config.json + safetensors)", path=d)
    spec = read_spec(d)
    md = ModelDir(d, "drafter directory")
    files = {n: t.file for n, t in md.tensors.items()}
    names = _drafter_names(files, spec, d)
    missing = [names[c] for c in required(spec) if names[c] not in files]
    for name in missing:
        if md.has(name):  # listed by the index in a shard that is not there: name the file
            md.info(name)
    if missing:
        raise ForensicsError(f"drafter lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}", path=d)
    biases = sorted(k for k in files if k.endswith(".bias") and not k.startswith(("verifier", "model.verifier")))
    if biases:
        raise ForensicsError(f"drafter has bias tensors ({', '.join(biases[:3])}); replay supports bias-free "
                             "EAGLE-3 drafters only", path=d)
    names = {c: s for c, s in names.items() if s in files}
    _check_headers(spec, names, md, d)  # nothing is read before every shape and dtype is known to fit
    reader = _Reader(files)
    weights: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    for canon, stored in names.items():
        # lazy: a vocabulary-sized embedding stays in its file, its rows read as looked up (io.diskrows)
        weights[canon] = disk_rows(md, stored) if lazy and canon == "embed" else reader.get(stored)
        sources[canon] = str(files[stored])
    need_embed = "embed" not in weights
    if need_embed or target_embed:
        if target is None:
            why = ("the drafter carries no embed_tokens.weight" if need_embed else
                   "replaying it as served without its own embed_tokens needs the target's embedding")
            raise ForensicsError(f"{why}: pass --target with the target model's directory (its embedding is read "
                                 "from the safetensors shards)", path=d)
        head = load_target(target, embed=True, lm_head=False, norm=False,
                           expect={"embed": (spec.vocab_size, spec.hidden_size)}, lazy=lazy)
        if head.embed is None:
            raise ForensicsError("target has no embed_tokens weight", path=target)
        if tuple(head.embed.shape) != (spec.vocab_size, spec.hidden_size):
            raise ForensicsError(f"target embedding has shape {list(head.embed.shape)}; the drafter needs "
                                 f"[{spec.vocab_size}, {spec.hidden_size}]: not this drafter's target", path=target)
        if need_embed:
            weights["embed"] = head.embed
            sources["embed"] = head.sources["embed"]
        if target_embed:
            weights["target_embed"] = head.embed
            sources["target_embed"] = head.sources["embed"]
    _check_values(spec, weights, d, finite=check_finite)
    return Drafter(spec, weights, sources, embed_from_target=need_embed)


def target_tensors(md: ModelDir, wanted: list[str], text_cfg: dict[str, Any],
                   expect: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[str, TensorInfo]]:
    """role -> (stored name, header info) of the target tensors ``wanted`` (embed / lm_head / norm), each checked
    from its shard's header (rank, float dtype, ``expect``ed shape) and no data read: only those shards are
    opened, so a partial download with the index and the head's shards is enough (``MissingShard`` otherwise)."""
    d = md.path
    out: dict[str, tuple[str, TensorInfo]] = {}
    for what in wanted:
        name = md.find(what)
        if name is None and what == "lm_head" and text_cfg.get("tie_word_embeddings"):
            name = md.find("embed")
        if name is None:
            raise ForensicsError(f"target has no {what} tensor (looked for {what} names in the safetensors index)", path=d)
        info = md.info(name)
        dtype, shape = info.dtype, info.shape
        if len(shape) != (1 if what == "norm" else 2) or dtype not in FLOAT_DTYPES or 0 in shape:
            raise ForensicsError(f"target tensor {name} has shape {list(shape)} {dtype}; not a {what}", path=info.file)
        if expect is not None and what in expect and shape != expect[what]:
            raise ForensicsError(f"target tensor {name} has shape {list(shape)}; the drafter needs "
                                 f"{list(expect[what])}: not this drafter's target", path=info.file)
        out[what] = (name, info)
    return out


def probe_target(directory: str | Path, *, embed: bool = False, lm_head: bool = True, norm: bool = True) -> None:
    """Fail fast on a target directory: its config, index and the headers of the tensors asked for, no data read
    (replay calls this before it spends time and memory loading the drafter)."""
    d = Path(directory)
    if not d.is_dir():
        raise ForensicsError("expected the target model's directory (config.json + safetensors shards)", path=d)
    cfg = read_config(d / "config.json", "target config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    wanted = [k for k, on in (("embed", embed), ("lm_head", lm_head), ("norm", norm)) if on]
    target_tensors(ModelDir(d, "target directory"), wanted, text_cfg)


def load_target(directory: str | Path, *, embed: bool = True, lm_head: bool = True, norm: bool = True,
                expect: dict[str, tuple[int, ...]] | None = None, lazy: bool = False) -> TargetHead:
    """Read only the target's embedding / lm_head / final norm (as asked) from its safetensors shards.

    Each tensor's rank and dtype (and, with ``expect``, its shape: what the drafter needs) are checked from the
    header before it is read, and its values after: a NaN or Inf in the target's head would make every token
    the same argmax (a perfect-looking replay).
    """
    d = Path(directory)
    if not d.is_dir():
        raise ForensicsError("expected the target model's directory (config.json + safetensors shards)", path=d)
    cfg = read_config(d / "config.json", "target config.json")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    eps = _float(text_cfg, "rms_norm_eps", d / "config.json", 1e-6)
    md = ModelDir(d, "target directory")
    layers = text_cfg.get("num_hidden_layers")
    out = TargetHead(str(d), None, None, None, eps,
                     num_layers=layers if isinstance(layers, int) and not isinstance(layers, bool) else None)
    wanted = [k for k, on in (("embed", embed), ("lm_head", lm_head), ("norm", norm)) if on]
    found = target_tensors(md, wanted, text_cfg, expect)  # every header checked before any data is read
    files = {name: info.file for name, info in found.values()}
    reader = _Reader(files)
    for what, (name, _info) in found.items():
        if lazy and what != "norm":  # left in the file (io.diskrows): the lm_head is checked as it is streamed
            t = disk_rows(md, name)
            if what == "embed":
                t.check_finite(f"target tensor {name}", files[name])
        else:
            t = reader.get(name)
            if not all_finite(t):
                raise ForensicsError(f"target tensor {name} holds NaN or Inf", path=files[name])
        setattr(out, what, t)
        out.sources[what] = str(files[name])
    return out
