"""MTP heads declared but not stored: the target's config names next-n layers its shard index has no weights for.

``mtp-weights-missing``: ``num_nextn_predict_layers`` (DeepSeek-V3, GLM-4.5, MiMo) or
``mtp_num_hidden_layers`` (Qwen3-Next, Qwen3.5) is positive, but no tensor of those layers is
listed: DeepSeek-style exports store them as ``model.layers.{N}..`` (N = ``num_hidden_layers``),
others under an ``mtp`` prefix. Quantized and converted exports drop them (GLM-5-NVFP4,
compressed-tensors, exporters that skip ``mtp.*``: vllm-project/vllm#35548, sgl-project/sglang#35797,
NVIDIA/Model-Optimizer#2427); an engine serving MTP then builds a random head and accepts nothing
(accept length 1.00). It matters only where MTP serves the drafts: error when the log's launch does
(NEXTN / MTP, or the draft path is the target's), info beside an EAGLE-3 drafter, warning otherwise.
"""
from __future__ import annotations

from typing import Any

from ..errors import ForensicsError
from ..io.bounds import MAX_MTP_LAYERS, MTP_WHY, past_bound
from ..io.modeldir import text_config
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .drafterfacts import positive_int
from .registry import register

MTP_SOURCE = ("vllm-project/vllm#35548, sgl-project/sglang#35797, vllm-project/vllm#37667, "
              "NVIDIA/Model-Optimizer#2427 (docs/causes.md row 26)")
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_mtp_layers")
MTP_ALGORITHMS = ("nextn", "mtp", "deepseek_mtp", "qwen3_next_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp",
                  "longcat_flash_mtp")


def declared_mtp(cfg: dict[str, Any]) -> tuple[str, int] | None:
    """(key, count) of the MTP layers the config declares, or None."""
    text = text_config(cfg)
    for key in MTP_KEYS:
        n = positive_int(text.get(key)) or positive_int(cfg.get(key))
        if n:
            return key, n
    return None


def stored_names(art: Artifacts) -> list[str]:
    """The target's tensor names: the shard index's ``weight_map`` when it has one (a partial download lists every
    tensor there, stored or not), else the safetensors headers (``io.modeldir.ModelDir.names``)."""
    return list(art.target.names)


def counted(art: Artifacts, n: int) -> str:
    """How the names were read, for the message: "the 91,991 names the index lists" or "its 12 stored tensors"."""
    if art.target.index is not None:
        return f"the {n:,} name{'s' if n != 1 else ''} the shard index lists"
    return f"its {n:,} stored tensor{'s' if n != 1 else ''}"


def mtp_tensors(names: list[str], num_layers: int, count: int) -> list[str]:
    """Names that belong to MTP layers: ``layers.{num_layers + i}.`` or an ``mtp`` prefix (plain string scans: a
    DeepSeek-V3 index lists about 92k names)."""
    wanted = {str(i) for i in range(num_layers, num_layers + count)}
    out = []
    for name in names:
        at = name.find("layers.")
        if at >= 0 and (at == 0 or name[at - 1] == "."):
            end = name.find(".", at + 7)
            if name[at + 7:end] in wanted:
                out.append(name)
                continue
        if name.startswith("mtp") or ".mtp" in name[:40]:
            out.append(name)
    return out


ACCEPTING = 1.2  # a mean accept length above this: the served drafts are accepted (a random head gives 1.00)


def logged_accept_length(art: Artifacts) -> tuple[float, int] | None:
    """(mean accept length, decode lines) of the log's decode lines, or None without a log or such lines."""
    if art.inputs.log is None:
        return None
    try:
        df = art.server_log
    except ForensicsError:
        return None
    if "accept_length" not in df.columns:
        return None
    values = [float(v) for v in df["accept_length"].tolist() if v is not None and float(v) == float(v)]
    return (sum(values) / len(values), len(values)) if values else None


def _served_by_mtp(art: Artifacts) -> bool | None:
    """True when the log's launch drafts with MTP, False when with an EAGLE-3 drafter, None when unknown."""
    args = art.server_args
    if args is not None:
        algo = (args.algorithm or args.algorithm_raw or "").lower()
        if any(a == algo for a in MTP_ALGORITHMS) or (args.draft and args.model and args.draft == args.model):
            return True
        if "eagle3" in algo:
            return False
    if art.available("draft_config"):  # an EAGLE-3 drafter (or its config) was handed over
        return False
    return None


def run(art: Artifacts) -> CheckResult:
    """Compare the declared MTP layers with the tensor names the target stores."""
    cfg = art.target.config
    declared = declared_mtp(cfg)
    if declared is None:
        return CheckResult(note="the target's config declares no MTP / next-n layers")
    key, count = declared
    past = past_bound(count, (MAX_MTP_LAYERS, MTP_WHY))
    if past:  # this check's input only: its row is "not run", the others answer
        return CheckResult(skipped=f"the target's config.json declares {key} = {past}: not a count of MTP layers")
    num_layers = positive_int(text_config(cfg).get("num_hidden_layers")) or 0
    try:
        names = stored_names(art)
    except ForensicsError as exc:  # a config-only target, or a partial download the listing cannot read yet
        return CheckResult(skipped=f"the target's tensor names cannot be listed ({exc}): the check needs its shard "
                                   "index or safetensors files")
    found = mtp_tensors(names, num_layers, count)
    data = {"key": key, "declared": count, "num_hidden_layers": num_layers, "mtp_tensors": len(found),
            "tensors_listed": len(names), "names_from": "index" if art.target.index is not None else "headers"}
    where = f"layers {num_layers}..{num_layers + count - 1}" if count > 1 else f"layer {num_layers}"
    if found:
        return CheckResult(note=f"{key} = {count}: of {counted(art, len(names))}, {len(found):,} belong to the MTP "
                                f"{'layers' if count > 1 else 'layer'} ({where}, or an mtp prefix)", data=data)
    head = (f"the target's config declares {key} = {count}, but none of {counted(art, len(names))} belongs to an "
            f"MTP layer ({where}, or an mtp prefix): the export dropped them")
    fix = ("Take the MTP weights from the unquantized checkpoint (or an export that keeps them, e.g. listed in the "
           "quantization's ignore list), or serve with an EAGLE-3 drafter instead of MTP.")
    served = _served_by_mtp(art)
    data["served_by_mtp"] = served
    logged = logged_accept_length(art) if served else None
    if logged is not None and logged[0] > ACCEPTING:
        data["logged_accept_length"] = round(logged[0], 3)
        return CheckResult((Finding("mtp-weights-missing", "warning", head + f"; yet the log's launch drafts with MTP "
                                    f"and its {logged[1]} decode lines accept {logged[0]:.2f} tokens a step, which a "
                                    "random head cannot: the served checkpoint has its MTP layer, so this --target "
                                    "directory is not the one served (another export or download).",
                                    fix="Point --target at the directory the server loads (its model path).",
                                    source=MTP_SOURCE, impact="low"),), "", data)
    if served:
        return CheckResult((Finding("mtp-weights-missing", "error", head + "; the log's launch drafts with MTP, so "
                                    "the engine builds a random head and every draft is rejected (accept length 1.00).",
                                    fix=fix, source=MTP_SOURCE, impact="collapse"),), "", data)
    if served is False:
        return CheckResult((Finding("mtp-weights-missing", "info", head + "; the EAGLE-3 drafter does not use them, "
                                    "but serving this target with MTP (NEXTN) would accept nothing.", fix=fix,
                                    source=MTP_SOURCE, impact="low"),), "", data)
    return CheckResult((Finding("mtp-weights-missing", "warning", head + "; an engine serving it with MTP (NEXTN, "
                                "deepseek_mtp) builds a random head and accepts nothing (accept length 1.00). Pass "
                                "--log or --drafter to say how it is served.", fix=fix, source=MTP_SOURCE,
                                impact="collapse"),), "", data)


CHECK = register(Check("mtp-weights", "MTP layers the target's config declares against its stored tensors",
                       ("mtp-weights-missing",), ("target",), run, order=14))
