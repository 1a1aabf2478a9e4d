"""Read the serving-path settings out of a server's arguments line: LoRA, DP attention, chunked prefill, ...

``engines.serverargs`` keeps the fields the launch checks and ``plan`` need; this module reads the
others from the same record (``ServerArgs.raw`` and vLLM's engine config line) for the serving
checks and plan's suspects. Field names as each release prints them (wheels read as in
``engines.servingrules``): SGLang ``enable_lora``, ``lora_paths``, ``enable_dp_attention``,
``dp_size``, ``ep_size``, ``moe_a2a_backend`` (``enable_deepep_moe`` before it),
``chunked_prefill_size``, ``disable_overlap_schedule``, ``attention_backend`` and its
prefill/decode/draft variants, ``sampling_defaults``, ``speculative_accept_threshold_single`` /
``_acc``, ``speculative_use_rejection_sampling`` (server_args.py 0.4.6 - 0.5.12,
arg_groups/fields/*.py 0.5.23; SGLang prints them after resolving its defaults); vLLM
``enable_lora``, ``lora_modules``, ``data_parallel_size``, ``enable_expert_parallel``,
``enable_chunked_prefill``, ``max_num_batched_tokens``, ``async_scheduling``,
``attention_backend``, ``generation_config``, ``override_generation_config``, and
``speculative_config`` keys ``draft_sample_method`` / ``rejection_sample_method`` /
``attention_backend`` (engine/arg_utils.py, config/*.py 0.10.0 - 0.33.0, 0.34.0; the non-default-args
line omits defaults, so a missing field is the release's default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import printable
from .pyrepr import CALL_KEY

if TYPE_CHECKING:  # pragma: no cover
    from .serverargs import ServerArgs

_NONE = ("", "none", "null")


def _get(args: ServerArgs, *keys: str) -> tuple[str | None, Any]:
    """The first of ``keys`` the arguments line (or vLLM's engine config line) holds: (key, value)."""
    for source in (args.raw, args.engine_config or {}):
        for key in keys:
            if key in source:
                return key, source[key]
    return None, None


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NONE)


def _truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def spec_config(args: ServerArgs) -> dict[str, Any]:
    """vLLM's ``speculative_config`` as a dict (the arguments line's, else the engine config line's)."""
    from .serverargs import _spec_dict  # the same reading the launch fields use

    for source in (args.raw, args.engine_config or {}):
        spec = _spec_dict(source.get("speculative_config")) if "speculative_config" in source else {}
        if spec:
            return {k: v for k, v in spec.items() if k != CALL_KEY}
    return {}


# ---------------------------------------------------------------- LoRA
@dataclass(frozen=True)
class LoraSetting:
    """LoRA on the target: enabled or not (None: the line does not say) and the adapters named at launch."""

    enabled: bool | None
    adapters: tuple[str, ...]
    field: str | None


def _adapter_names(value: Any) -> list[str]:
    """Adapter names from SGLang ``lora_paths`` (list of 'name=path' / paths / dicts, or a dict) or vLLM
    ``lora_modules`` (LoRAModulePath(name=..., path=...) calls, 'name=path' strings or JSON objects)."""
    if _is_none(value):
        return []
    if isinstance(value, dict) and CALL_KEY not in value:
        return [printable(str(k)) for k in value]
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict):
            name = item.get("name") or item.get("lora_name") or item.get("path") or item.get("lora_path")
            if name:
                out.append(printable(str(name)))
        elif isinstance(item, str) and item.strip():
            out.append(printable(item.split("=", 1)[0].strip()))
    return out


def lora_setting(args: ServerArgs) -> LoraSetting:
    """Whether the target serves LoRA adapters (SGLang ``enable_lora`` / ``lora_paths``, vLLM ``enable_lora`` /
    ``lora_modules``)."""
    key, paths = _get(args, "lora_paths", "lora_modules")
    adapters = tuple(_adapter_names(paths))
    ekey, enabled = _get(args, "enable_lora")
    flag = _truthy(enabled)
    if flag is None and adapters:
        flag = True  # SGLang: lora_paths alone turns LoRA on; vLLM needs both, and refuses modules without it
    if flag is None and args.source == "vllm-non-default":
        flag = False  # a non-default-args line omits enable_lora=False
    return LoraSetting(flag, adapters if flag is not False else (), key or ekey)


# ---------------------------------------------------------------- DP attention / expert parallelism
@dataclass(frozen=True)
class DpSetting:
    """DP attention (SGLang) or data parallelism with expert parallelism (vLLM), and the MoE all-to-all backend."""

    dp_attention: bool | None
    dp_size: int | None
    ep_size: int | None
    a2a_backend: str | None  # 'deepep', 'mooncake', ... ; None when 'none' or not printed
    expert_parallel: bool | None

    def describe(self) -> str:
        parts = []
        if self.dp_attention is not None:
            parts.append(f"enable_dp_attention={self.dp_attention}")
        if self.dp_size is not None:
            parts.append(f"dp_size={self.dp_size}")
        if self.ep_size is not None:
            parts.append(f"ep_size={self.ep_size}")
        if self.expert_parallel is not None:
            parts.append(f"enable_expert_parallel={self.expert_parallel}")
        parts.append(f"moe_a2a_backend={self.a2a_backend or 'none'}")
        return ", ".join(parts)


def dp_setting(args: ServerArgs) -> DpSetting:
    _, dpa = _get(args, "enable_dp_attention")
    _, ep = _get(args, "ep_size", "expert_parallel_size")
    _, a2a = _get(args, "moe_a2a_backend")
    _, deepep = _get(args, "enable_deepep_moe")  # SGLang 0.4.x spelling
    _, expert = _get(args, "enable_expert_parallel")
    backend = None if _is_none(a2a) else printable(str(a2a)).strip("'\"").lower()
    if backend is None and _truthy(deepep):
        backend = "deepep"
    ep_n = _number(ep)
    return DpSetting(_truthy(dpa), args.dp, None if ep_n is None else int(ep_n), backend, _truthy(expert))


# ---------------------------------------------------------------- chunked prefill, async scheduling, backends
def chunked_prefill(args: ServerArgs) -> tuple[bool | None, str]:
    """(on, the setting as read): SGLang ``chunked_prefill_size`` (-1: off; None: sized at start), vLLM
    ``enable_chunked_prefill`` (on by default in every V1 release read) and ``max_num_batched_tokens``."""
    if args.engine == "sglang":
        key, size = _get(args, "chunked_prefill_size")
        n = _number(size)
        if key is None or _is_none(size):
            return None, ("the arguments line has no chunked_prefill_size" if key is None else
                          "chunked_prefill_size=None (SGLang sizes it at start from the GPU's memory)")
        if n is None or n <= 0:
            return False, f"chunked_prefill_size={printable(repr(size))} (chunked prefill off)"
        return True, f"chunked_prefill_size={int(n)}"
    key, on = _get(args, "enable_chunked_prefill")
    _, budget = _get(args, "max_num_batched_tokens")
    extra = f", max_num_batched_tokens={int(_number(budget))}" if _number(budget) is not None else ""
    flag = _truthy(on)
    if flag is None:
        return True, "enable_chunked_prefill not set: on (vLLM V1's default, config/scheduler.py)" + extra
    return flag, f"enable_chunked_prefill={flag}" + extra


def attention_backends(args: ServerArgs) -> dict[str, str]:
    """Every attention-backend setting the line names (None values left out): target, prefill, decode, draft."""
    out = {}
    for key in ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                "speculative_draft_attention_backend"):
        _, value = _get(args, key)
        if not _is_none(value):
            out[key] = printable(str(value)).strip("'\"")
    spec = spec_config(args)
    if not _is_none(spec.get("attention_backend")):
        out["speculative_config.attention_backend"] = printable(str(spec["attention_backend"]))
    return out


def verify_settings(args: ServerArgs) -> dict[str, Any]:
    """The arguments that change the acceptance rule at temperature > 0, as printed."""
    out: dict[str, Any] = {}
    if args.engine == "sglang":
        for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc",
                    "speculative_use_rejection_sampling"):
            _, value = _get(args, key)
            if value is not None:
                out[key] = value
        return out
    spec = spec_config(args)
    for key in ("draft_sample_method", "rejection_sample_method"):
        if spec.get(key) is not None:
            out[key] = spec[key]
    return out


def sampling_defaults(args: ServerArgs) -> tuple[str | None, Any]:
    """Where the server takes request defaults from: SGLang ``sampling_defaults``, vLLM ``generation_config``
    (('field', value), value None when the line does not print it); vLLM's ``override_generation_config``
    is read by ``override_penalties``."""
    key = "sampling_defaults" if args.engine == "sglang" else "generation_config"
    _, value = _get(args, key)
    return key, None if value is None else printable(str(value)).strip("'\"")


PENALTY_KEYS = ("repetition_penalty", "frequency_penalty", "presence_penalty")
NEUTRAL = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


def override_penalties(args: ServerArgs) -> dict[str, float]:
    """Penalties the server sets for every request: vLLM ``override_generation_config`` (a dict or its JSON)."""
    import json

    _, value = _get(args, "override_generation_config")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    out = {}
    for key in PENALTY_KEYS:
        n = _number(value.get(key))
        if n is not None and n != NEUTRAL[key]:
            out[key] = n
    return out
