"""Read the JSON ``eagleforensics replay --json`` writes, for ``plan``: per wiring its reach@k, accept length, tree.

Schema ``eagleforensics-replay-v1``: ``steps``, ``trained`` (label or null), ``wirings`` (each
``label``, ``source``, ``steps``, ``starts``, ``reach``, ``accept_length``; newer replays add
``served_without``, ``sampling`` and ``tree``, read where present). Which wiring an engine feeds
is in its ``source``: replay names it ``"<engine>[ <version>] reading <config>"``. Anything else in
the file is ignored; a file that is not such an object is bad input naming the file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ForensicsError, printable
from . import physical
from .guards import parse_json, read_regular

SCHEMA = "eagleforensics-replay-v1"
MAX_BYTES = 64 * 1024 * 1024
ENGINES = ("sglang", "vllm", "trtllm")


@dataclass(frozen=True)
class ReplayWiring:
    """One replayed wiring: where it comes from, its reach@1..S over ``starts`` rows, and the optional figures."""

    label: str
    source: str
    steps: int
    starts: int
    reach: tuple[float | None, ...]
    accept_length: float | None
    served_without: tuple[str, ...] = ()
    tree: dict[str, Any] | None = None
    sampled_reach: tuple[float | None, ...] | None = None
    temperature: float | None = None

    @property
    def sources(self) -> list[str]:
        return [s.strip() for s in self.source.split(";") if s.strip()]

    @property
    def trained(self) -> bool:
        return "trained" in self.sources

    def engines(self) -> list[str]:
        """The engines whose reading of the draft config gives this wiring (from replay's source text)."""
        return [e for e in ENGINES if any(s == e or s.startswith(e + " ") for s in self.sources)]


@dataclass(frozen=True)
class ReplayFile:
    """What plan reads from a replay JSON."""

    path: str
    steps: int
    trained_label: str | None
    wirings: tuple[ReplayWiring, ...] = field(default_factory=tuple)

    @property
    def trained(self) -> ReplayWiring | None:
        return next((w for w in self.wirings if (w.trained or w.label == self.trained_label)
                     and not w.served_without), None)

    def fed_by(self, engine: str | None) -> tuple[ReplayWiring | None, str]:
        """The wiring ``engine`` feeds and how it was chosen; the trained one (said) when replay named no engine."""
        if engine is not None:
            named = [w for w in self.wirings if engine in w.engines()]
            served = [w for w in named if w.served_without] or [w for w in self.wirings if w.served_without]
            if served:
                w = served[0]
                return w, (f"replay's 'as served' row for {engine} ({w.label}, without "
                           f"{', '.join(w.served_without)})")
            if named:
                return named[0], f"replay's row for what {engine} reads from the draft config"
        trained = self.trained
        if trained is not None:
            return trained, ("the trained wiring: replay was not run with --engine for this engine, so the engine "
                             "is assumed to feed what was trained")
        measured = [w for w in self.wirings if w.accept_length is not None]
        if measured:
            best = max(measured, key=lambda w: w.accept_length or 0.0)
            return best, "the best replayed wiring (replay names neither the engine's wiring nor the trained one)"
        return None, "replay measured no wiring"

    def by_label(self, label: str) -> ReplayWiring | None:
        return next((w for w in self.wirings if w.label == label), None)


def _bad(path: Path, what: str) -> ForensicsError:
    return ForensicsError(f"not a replay JSON ({SCHEMA}): {what}", path=path)


def _number(value: Any, path: Path, where: str, lo: float, hi: float, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise _bad(path, f"{where} is {printable(repr(value))[:60]}, expected a number")
    if not lo <= float(value) <= hi:
        raise _bad(path, f"{where} = {value} is outside [{lo:g}, {hi:g}]")
    return float(value)


def _int(value: Any, path: Path, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _bad(path, f"{where} is {printable(repr(value))[:60]}, expected an integer >= {lo}")
    return value


def _steps(value: Any, path: Path, where: str) -> int:
    n = _int(value, path, where, 1)
    why = physical.steps_problem(n)
    if why:
        raise _bad(path, f"{where}: {why}")
    return n


def _reach(value: Any, path: Path, where: str) -> tuple[float | None, ...]:
    if not isinstance(value, list) or len(value) > 64:
        raise _bad(path, f"{where} is not a list of at most 64 numbers")
    return tuple(_number(x, path, f"{where}[{i}]", 0.0, 1.0) for i, x in enumerate(value))


def _wiring(item: Any, path: Path, i: int, steps: int) -> ReplayWiring:
    where = f"wirings[{i}]"
    if not isinstance(item, dict):
        raise _bad(path, f"{where} is not an object")
    label, source = item.get("label"), item.get("source", "")
    if not isinstance(label, str) or not isinstance(source, str):
        raise _bad(path, f"{where}: label and source must be strings")
    reach = _reach(item.get("reach"), path, f"{where}.reach")
    length = _number(item.get("accept_length"), path, f"{where}.accept_length", 1.0, 65.0)
    w_steps = _steps(item.get("steps", steps), path, f"{where}.steps")
    starts = _int(item.get("starts", 0), path, f"{where}.starts", 0)
    served = item.get("served_without") or []
    if not isinstance(served, list) or not all(isinstance(s, str) for s in served):
        raise _bad(path, f"{where}.served_without is not a list of names")
    tree = item.get("tree")
    if tree is not None:
        if not isinstance(tree, dict):
            raise _bad(path, f"{where}.tree is not an object")
        tree = {"topk": _int(tree.get("topk"), path, f"{where}.tree.topk", 1),
                "draft_tokens": _int(tree.get("draft_tokens"), path, f"{where}.tree.draft_tokens", 2),
                "steps": _steps(tree.get("steps", w_steps), path, f"{where}.tree.steps"),
                "accept_length": _number(tree.get("accept_length"), path, f"{where}.tree.accept_length", 1.0, 65.0),
                "chain_accept_length": _number(tree.get("chain_accept_length"), path,
                                               f"{where}.tree.chain_accept_length", 1.0, 65.0),
                "teacher_forced_chain": _number(tree.get("teacher_forced_chain"), path,
                                                f"{where}.tree.teacher_forced_chain", 1.0, 65.0)}
    for name, value, n in (("accept_length", length, w_steps),
                           *((f"tree.{k}", tree[k], tree["steps"] if k == "accept_length" else w_steps)
                             for k in ("accept_length", "chain_accept_length", "teacher_forced_chain")
                             if tree is not None)):
        why = physical.accept_problem(value if value is not None else math.nan, n)
        if why:
            raise _bad(path, f"{where}.{name}: {why}")
    sampled, temperature = None, None
    sampling = item.get("sampling")
    if isinstance(sampling, dict) and isinstance(sampling.get("sampled_drafts"), dict):
        sampled = _reach(sampling["sampled_drafts"].get("reach"), path, f"{where}.sampling.sampled_drafts.reach")
        temperature = _number(sampling.get("temperature"), path, f"{where}.sampling.temperature", 0.0, 100.0)
    return ReplayWiring(label, source, w_steps, starts, reach, length, tuple(served), tree, sampled, temperature)


def read_replay(path: str | Path) -> ReplayFile:
    """The wirings of a replay JSON; a file that is not one is a ForensicsError naming it and what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ForensicsError("no such replay JSON file", path=p)
    try:
        doc = parse_json(read_regular(p, MAX_BYTES, "replay JSON"), p, "replay JSON")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ForensicsError(f"not valid JSON: {' '.join(str(exc).split())[:120]}", path=p) from None
    if not isinstance(doc, dict):
        raise _bad(p, "the top level is not an object")
    from .specprofile import is_profile

    if doc.get("schema") != SCHEMA and is_profile(doc):  # ModelOpt's speculation_profile.json: one reference wiring
        return _from_profile(doc, p)
    if doc.get("schema") != SCHEMA:
        raise _bad(p, f"schema is {printable(repr(doc.get('schema')))[:60]}")
    steps = _steps(doc.get("steps"), p, "steps")
    trained = doc.get("trained")
    if trained is not None and not isinstance(trained, str):
        raise _bad(p, "trained is not a label or null")
    items = doc.get("wirings")
    if not isinstance(items, list) or not items:
        raise _bad(p, "wirings is not a non-empty list")
    wirings = tuple(_wiring(item, p, i, steps) for i, item in enumerate(items[:256]))
    return ReplayFile(str(p), steps, trained, wirings)


def _from_profile(doc: dict[str, Any], p: Path) -> ReplayFile:
    """A speculation profile as a replay file of one wiring, ``profile``, taken as the trained one."""
    from .specprofile import SOURCE, profile_reach, profile_steps

    reach, length, what = profile_reach(doc, p)
    steps = _steps(len(reach), p, "num_speculative_tokens")
    wiring = ReplayWiring("profile", f"trained; speculation_profile.json ({what}; {SOURCE})", steps,
                          profile_steps(doc), tuple(reach), length)
    return ReplayFile(str(p), steps, "profile", (wiring,))
