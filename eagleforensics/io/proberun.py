"""Read a ``probe --json`` / ``--out`` file as a run, for ``plan``: checked, bounded, one line when it is not one.

``is_probe_run`` looks at the start of a file only (a log is never read twice); ``read_probe_run``
returns its ``run`` block with every number checked against the range a server can produce.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ForensicsError, printable
from .guards import parse_json, read_regular

SCHEMA = "eagleforensics-probe-v1"
MAX_BYTES = 64 * 1024 * 1024  # 1024 requests with their figures are well below this
MAX_POSITIONS = 128  # per-position rates a run may hold: engines.probeformats.MAX_STEPS, the most any engine runs
_HEAD = 4096


def is_probe_run(path: str | Path) -> bool:
    """Whether ``path`` is a probe JSON (its first bytes name the schema); False for anything else, logs included."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as fh:
            head = fh.read(_HEAD)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and SCHEMA.encode() in head


def _bad(path: Path, what: str) -> ForensicsError:
    return ForensicsError(f"not a probe run ({SCHEMA}): {what}", path=path)


def _number(run: dict[str, Any], key: str, path: Path, lo: float, hi: float, *, allow_none: bool = True) -> float:
    value = run.get(key)
    if value is None and allow_none:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not lo <= value <= hi:
        raise _bad(path, f"run.{key} is {printable(repr(value))[:40]}, not a number in [{lo:g}, {hi:g}]")
    return float(value)


def _count(value: Any, path: Path, where: str, hi: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise _bad(path, f"{where} is {printable(repr(value))[:40]}, not a count up to {hi}")
    return value


def read_probe_run(path: str | Path) -> dict[str, Any]:
    """The ``run`` block of a probe JSON, its numbers checked (NaN where the probe called none)."""
    p = Path(path)
    try:
        doc = parse_json(read_regular(p, MAX_BYTES, "probe JSON"), p, "probe JSON")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ForensicsError(f"not valid JSON: {' '.join(str(exc).split())[:120]}", path=p) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(p, "no schema line")
    run = doc.get("run")
    if not isinstance(run, dict):
        raise _bad(p, "no run object")
    if run.get("engine") not in ("sglang", "vllm"):
        raise _bad(p, f"run.engine is {printable(repr(run.get('engine')))[:40]}")
    out: dict[str, Any] = {"engine": run["engine"], "speculative": run.get("speculative") is True}
    out["accept_length"] = _number(run, "accept_length", p, 1.0, 64.0)
    out["accept_length_se"] = _number(run, "accept_length_se", p, 0.0, 64.0)
    out["tok_s"] = _number(run, "tok_s", p, 1e-6, 1e8, allow_none=False)
    out["tok_s_se"] = _number(run, "tok_s_se", p, 0.0, 1e8)
    out["batch"] = _count(run.get("batch"), p, "run.batch", 1 << 16) or 1
    out["requests"] = _count(run.get("requests"), p, "run.requests", 1 << 20) or 0
    out["rounds"] = _number(run, "rounds", p, 0.0, 1e12)
    pos = run.get("per_position_acceptance")
    if pos is not None:
        if not isinstance(pos, list) or not 1 <= len(pos) <= MAX_POSITIONS or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0 for v in pos):
            raise _bad(p, "run.per_position_acceptance is not a list of rates in [0, 1]")
        pos = tuple(float(v) for v in pos)
    out["per_position"] = pos
    args = run.get("server_args")
    if not isinstance(args, dict):
        raise _bad(p, "run.server_args is not an object")
    clean: dict[str, Any] = {}
    for key in ("version", "model", "draft", "algorithm"):
        value = args.get(key)
        if value is not None and not isinstance(value, str):
            raise _bad(p, f"run.server_args.{key} is not text")
        clean[key] = None if value is None else value[:4096]
    for key in ("num_steps", "topk", "num_draft_tokens"):
        clean[key] = _count(args.get(key), p, f"run.server_args.{key}", 1024)
    for key in ("cuda_graph", "prefix_cache"):
        value = args.get(key)
        clean[key] = value if isinstance(value, bool) else None
    out["server_args"] = clean
    return out



def read_probe_counters(path: str | Path) -> dict[str, Any]:
    """An earlier probe's server-wide counters at its end (``server_counters``), for ``probe --since``: the
    engine, the counter values and the wall time, checked; one line when the file has none."""
    p = Path(path)
    try:
        doc = parse_json(read_regular(p, MAX_BYTES, "probe JSON"), p, "probe JSON")
    except ValueError as exc:
        raise ForensicsError(f"not valid JSON: {' '.join(str(exc).split())[:120]}", path=p) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(p, "no schema line")
    engine = (doc.get("server") or {}).get("engine") if isinstance(doc.get("server"), dict) else None
    block = doc.get("server_counters")
    if engine not in ("sglang", "vllm"):
        raise _bad(p, "server.engine is not sglang or vllm")
    if not isinstance(block, dict):
        raise ForensicsError("--since: that probe file has no server_counters (written by an older probe)", path=p)
    end, when = block.get("end"), block.get("end_time")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when < 0:
        raise _bad(p, "server_counters.end_time is not a time")
    if end is not None and (not isinstance(end, dict) or len(end) > 16 or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or v < 0 for k, v in end.items())):
        raise _bad(p, "server_counters.end is not a map of counter values")
    return {"engine": engine, "end": end, "end_time": float(when)}
