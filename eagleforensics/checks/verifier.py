"""The speculators format's verifier against the target: was this drafter trained for this model?

``verifier-mismatch``: a speculators drafter config names the model it was trained against
(``speculators_config.verifier``: ``name_or_path``, ``architectures``; speculators 0.9.0
``speculators/config.py`` VerifierConfig). Architectures that differ from the target's mean a
drafter for another model (warning, high: vocabulary and widths may still agree, see
``size-mismatch`` for when they do not); a name unlike the target directory's or its
``_name_or_path`` alone is weak evidence, since names are often local paths (info), except where the
verifier and the model the server's log serves are both canonical hub ids (``org/name``) of different
models (warning, high: a distilled model keeps its base's architecture and widths).
Quantization and format suffixes (``-FP8``, ``-w8a8``, ``-AWQ``, ...) are ignored in the names.
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .registry import register

VERIFIER_SOURCE = "speculators 0.9.0 speculators/config.py (VerifierConfig); SafeAILab/EAGLE#258 (catalogue row 17)"
_SUFFIX = re.compile(r"[-_.](fp8|fp4|nvfp4|mxfp4|w\d+a\d+|int[48]|awq|gptq|bnb|4bit|8bit|quarot|dynamic|static|"
                     r"block|fp8-dynamic|quantized|mlx|gguf)\b.*$", re.I)


def short_name(name: Any) -> str:
    """A model name compared without its organisation, path or quantization suffix: ``org/Foo-8B-FP8`` -> ``foo-8b``."""
    text = str(name or "").strip().rstrip("/")
    base = PurePosixPath(text.replace("\\", "/")).name
    prev = None
    while prev != base:
        prev, base = base, _SUFFIX.sub("", base)
    return base.lower()


def verifier_of(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """``speculators_config.verifier`` of a drafter config, or None (not the speculators format)."""
    spec = cfg.get("speculators_config")
    ver = spec.get("verifier") if isinstance(spec, dict) else None
    return ver if isinstance(ver, dict) else None


def _archs(value: Any) -> list[str]:
    """An ``architectures`` value as a list of names (a bare string is one name; anything else none)."""
    if isinstance(value, str):
        return [value]
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def hub_id(name: Any) -> str | None:
    """``name`` when it is a canonical hub id (``org/name``: one slash, no path, no drive, no home), else None."""
    text = str(name or "").strip()
    return text if _HUB_ID.match(text) and not text.startswith(("./", "../")) else None


def served_model(art: Artifacts) -> str | None:
    """The model the server's log says it serves (its arguments line), None without a log or line."""
    if art.inputs.log is None:
        return None
    args = art.server_args
    return str(args.model) if args is not None and args.model else None


def _names_agree(a: str, b: str) -> bool:
    return bool(a and b) and (a == b or a in b or b in a)


def run(art: Artifacts) -> CheckResult:
    """Compare the verifier's name and architectures with the target's directory name, ``_name_or_path`` and
    architectures."""
    ver = verifier_of(art.draft_config)
    if ver is None:
        return CheckResult(note="the draft config names no verifier (not the speculators format)")
    tcfg = art.target.config
    v_name = short_name(ver.get("name_or_path"))
    t_names = [n for n in (short_name(art.target.path.resolve().name), short_name(tcfg.get("_name_or_path"))) if n]
    v_arch, t_arch = _archs(ver.get("architectures")), _archs(tcfg.get("architectures"))
    data = {"verifier_name": ver.get("name_or_path"), "verifier_architectures": v_arch, "target_names": t_names,
            "target_architectures": t_arch}
    arch_differs = bool(v_arch and t_arch and not set(v_arch) & set(t_arch))
    name_differs = bool(v_name and t_names and not any(_names_agree(v_name, n) for n in t_names))
    if not arch_differs and not name_differs:
        return CheckResult(note=f"verifier {ver.get('name_or_path')!s:.80} agrees with the target" +
                           ("" if v_arch and t_arch else " (name only: no architectures on one side)"), data=data)
    parts = []
    if arch_differs:
        parts.append(f"its verifier's architectures {v_arch} are not the target's {t_arch}")
    if name_differs:
        parts.append(f"its verifier is {ver.get('name_or_path')!s:.120} and the target is "
                     f"{' / '.join(t_names)}")
    msg = "the drafter was trained against another model than this target: " + "; ".join(parts)
    if arch_differs:
        return CheckResult((Finding("verifier-mismatch", "warning", msg + ". A drafter trained on another model's "
                                    "states drafts that model's continuations.", fix="Use the drafter trained for "
                                    "this target, or train one on it.", source=VERIFIER_SOURCE, impact="high"),),
                           "", data)
    served = served_model(art)
    v_id, s_id = hub_id(ver.get("name_or_path")), hub_id(served)
    if v_id and s_id and not _names_agree(short_name(v_id), short_name(s_id)):
        data["served_model"] = served
        return CheckResult((Finding("verifier-mismatch", "warning", msg + f". Both are hub ids of different models "
                                    f"({v_id} and {s_id}) and the server's log serves {s_id}: not a renamed or local "
                                    "copy. Architectures and widths may agree (a distilled model keeps its base's), "
                                    "the states and continuations do not.", fix="Use the drafter trained for "
                                    f"{s_id}, or train one on it.", source=VERIFIER_SOURCE, impact="high"),),
                           "", data)
    return CheckResult((Finding("verifier-mismatch", "info", msg + " (names only: a renamed or local copy of the same "
                                "model reads the same way; sizes and embeddings are compared by the other checks).",
                                fix="Check that the verifier named is this target (or its quantized export).",
                                source=VERIFIER_SOURCE, impact="low"),), "", data)


CHECK = register(Check("verifier", "the speculators verifier against the target", ("verifier-mismatch",),
                       ("draft_config", "target"), run, order=11))
