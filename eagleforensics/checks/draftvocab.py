"""The drafter's vocabulary map (``d2t``/``t2d``) read and diagnosed once, for the map check and the coverage check.

A drafter with a reduced vocabulary (``draft_vocab_size`` < ``vocab_size``) drafts draft ids; the
engines turn draft id ``i`` into target id ``i + d2t[i]`` (``d2t`` holds offsets), skip ``t2d`` at load,
and fall back to draft id = target id (the first ``draft_vocab_size`` ids) when ``d2t`` is missing: SGLang
leaves ``hot_token_id`` None, vLLM keeps its zero-initialised ``draft_id_to_target_id``. Every release read
says so; the rows, with the releases and files, are ``engines.embedrules.D2T_RULES``. SpecForge and speculators write
``t2d`` as a boolean mask over the target vocabulary whose set ids, in order, are ``arange + d2t``.

``diagnose_map`` says which convention the stored ``d2t`` follows and what is wrong with it; the
checks turn that into findings, and the coverage check uses the vocabulary the map *meant*.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import Artifacts
from .drafterfacts import Listed, draft_facts, drafter_tensor, positive_int, target_facts

INT_DTYPES = ("I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64")
UNSIGNED_WIDE = ("U16", "U32", "U64")  # torch promotes none of them with int64 (uint8 it does)
# Fewer draft ids than this and "no two kept ids are adjacent" is weak evidence of absolute ids.
MIN_IDS_FOR_ADJACENCY = 16


@dataclass(frozen=True)
class VocabMap:
    """What the drafter stores and declares about its vocabulary (None where absent)."""

    vocab_size: int | None  # the target vocabulary (drafter config, else target config)
    draft_vocab_size: int | None  # draft_vocab_size (defaults to vocab_size)
    declared_draft_vocab: bool  # the config names draft_vocab_size itself
    d2t_name: str | None
    t2d_name: str | None
    d2t_dtype: str | None  # safetensors dtype code
    d2t: np.ndarray | None  # int64, flattened
    t2d: np.ndarray | None  # as stored (bool or integer), flattened
    d2t_shape: tuple[int, ...] | None = None
    side_files: tuple[str, ...] = ()  # d2t / t2d kept beside the checkpoint, which no engine reads

    @property
    def reduced(self) -> bool:
        return bool(self.vocab_size and self.draft_vocab_size and self.draft_vocab_size < self.vocab_size)


@dataclass(frozen=True)
class MapDiagnosis:
    """Which convention ``d2t`` follows and what is wrong with it.

    ``kind``: ``full`` (no reduced vocabulary, nothing to map), ``ok`` (offsets, as the engines read),
    ``missing`` (reduced vocabulary, no d2t), ``placeholder`` (all zeros: the first N ids),
    ``absolute`` (target ids stored where offsets belong), ``invalid`` (wrong dtype, size, range,
    duplicates, or unlike t2d). ``intended`` holds the target ids the map meant (sorted), when known.
    """

    kind: str
    problems: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    intended: np.ndarray | None = None
    intended_how: str = ""
    served: np.ndarray | None = None  # the target ids the engines will emit for draft ids 0..N-1
    data: dict[str, Any] = field(default_factory=dict)


def _side_files(art: Artifacts) -> tuple[str, ...]:
    root = art.drafter.path
    return tuple(sorted(p.name for p in root.iterdir() if p.is_file() and p.stem.lower() in ("d2t", "t2d")
                        and p.suffix.lower() in (".npy", ".pt", ".bin", ".safetensors", ".json")))


def read_vocab_map(art: Artifacts) -> VocabMap:
    """The drafter's vocabulary sizes and its ``d2t``/``t2d`` tensors (read whole: they are small)."""
    cfg = art.drafter.config
    facts = draft_facts(cfg)
    vocab = facts.vocab_size
    if vocab is None and art.available("target"):
        vocab = target_facts(art.target.config).vocab_size
    declared = positive_int(cfg.get("draft_vocab_size")) or positive_int(facts.layer.get("draft_vocab_size"))
    names = Listed(art.drafter)
    d2t_name, t2d_name = drafter_tensor(names, "d2t"), drafter_tensor(names, "t2d")
    d2t = t2d = None
    dtype = shape = None
    if d2t_name is not None:
        info = names[d2t_name]
        dtype, shape = info.dtype, info.shape
        raw = art.drafter.read(d2t_name)
        d2t = np.asarray(raw).reshape(-1)
    if t2d_name is not None:
        t2d = np.asarray(art.drafter.read(t2d_name)).reshape(-1)
    return VocabMap(vocab, declared or vocab, declared is not None, d2t_name, t2d_name, dtype, d2t, t2d, shape,
                    _side_files(art))


def _strictly_increasing(x: np.ndarray) -> bool:
    return bool(x.size < 2 or (np.diff(x) > 0).all())


def diagnose_map(vm: VocabMap) -> MapDiagnosis:
    """Say which convention ``vm.d2t`` follows and what is wrong; the rules are in the module docstring."""
    n, v = vm.draft_vocab_size, vm.vocab_size
    kept = None
    if vm.t2d is not None and v is not None and vm.t2d.size == v and vm.t2d.dtype.kind in "biu":
        kept = np.flatnonzero(vm.t2d)
    if vm.d2t is None:
        if not vm.reduced:
            return MapDiagnosis("full", intended_how="the whole target vocabulary")
        intended = kept if kept is not None and kept.size == n else None
        return MapDiagnosis("missing", intended=intended, intended_how="t2d's set ids" if intended is not None else "",
                            served=np.arange(n))
    d2t = vm.d2t
    if vm.d2t_dtype not in INT_DTYPES:
        return MapDiagnosis("invalid", (f"d2t is stored as {vm.d2t_dtype}, not integers: SGLang adds it to an integer "
                                        "arange and indexes with it, vLLM copies it into an int64 parameter",),
                            intended=kept if kept is not None and n and kept.size == n else None,
                            intended_how="t2d's set ids")
    if vm.d2t_dtype in UNSIGNED_WIDE:
        return MapDiagnosis("invalid", (f"d2t is stored as {vm.d2t_dtype}: SGLang adds it to an int64 arange "
                                        "(hot_token_id = d2t + arange), which torch refuses for uint16/32/64 "
                                        "('Promotion for uint16, uint32, uint64 types is not supported', torch 2.13), "
                                        "so SGLang cannot load the drafter; store int64 offsets as SpecForge does",),
                            intended=kept if kept is not None and n and kept.size == n else None,
                            intended_how="t2d's set ids")
    d2t = d2t.astype(np.int64)
    problems: list[str] = []
    if vm.d2t_shape is not None and len(vm.d2t_shape) != 1:
        problems.append(f"d2t has shape {list(vm.d2t_shape)}; engines expect one offset per draft id, shape [{n}]")
    if n is not None and d2t.size != n:
        problems.append(f"d2t holds {d2t.size} offsets but draft_vocab_size is {n} (SafeAILab/EAGLE#248): the "
                        "engine's draft head and its map disagree")
    base = np.arange(d2t.size)
    served = base + d2t
    data: dict[str, Any] = {"d2t_size": int(d2t.size)}
    if not problems and vm.reduced and not d2t.any():
        return MapDiagnosis("placeholder", evidence=(f"all {d2t.size} offsets are 0",),
                            intended=kept if kept is not None and kept.size == n else None,
                            intended_how="t2d's set ids", served=served, data=data)
    # absolute ids where offsets belong: t2d says so outright; without t2d, a strictly increasing d2t with
    # no two adjacent kept ids (offsets of a frequency-pruned vocabulary repeat wherever two kept ids are
    # adjacent), or one whose offsets overshoot the vocabulary while its values do not.
    in_range_as_ids = v is not None and d2t.size and d2t.min() >= 0 and d2t.max() < v
    # a full vocabulary's arange(V) is the same mistake (ids 0..V-1 stored where zero offsets belong), not a bad map
    full_ids = not vm.reduced and d2t.size > 1 and np.array_equal(d2t, base)
    if not problems and in_range_as_ids and (vm.reduced or full_ids):
        evidence: list[str] = []
        if kept is not None and kept.size == d2t.size:
            if np.array_equal(d2t, kept) and not np.array_equal(served, kept):
                evidence.append("d2t equals t2d's set ids (target ids), not their offsets from arange")
        elif _strictly_increasing(d2t):
            if np.array_equal(d2t, base):
                evidence.append("d2t is arange(N): the absolute ids of the first N tokens, so the engines read "
                                "draft id i as target id 2i")
            elif served.max() >= v:
                evidence.append(f"read as offsets it sends draft ids up to target id {int(served.max())}, past the "
                                f"vocabulary of {v}, while its values themselves are valid target ids")
            elif d2t.size >= MIN_IDS_FOR_ADJACENCY:
                evidence.append(f"d2t is strictly increasing over {d2t.size} entries: offsets repeat wherever two kept "
                                "target ids are adjacent, which a frequency-pruned vocabulary always has")
        if evidence:
            return MapDiagnosis("absolute", evidence=tuple(evidence), intended=np.sort(d2t),
                                intended_how="d2t read as target ids", served=served, data=data)
    if not problems:
        lo, hi = int(served.min()) if served.size else 0, int(served.max()) if served.size else 0
        if lo < 0 or (v is not None and hi >= v):
            problems.append(f"d2t sends draft ids to target ids {lo}..{hi}, outside the vocabulary 0..{(v or 0) - 1}: "
                            "an out-of-bounds index in the engine")
        dup = int(served.size - np.unique(served).size)
        if dup:
            problems.append(f"{dup} draft ids map onto a target id another draft id already has: those drafts can "
                            "never differ")
        if kept is not None and kept.size == served.size and not problems and not np.array_equal(np.sort(served), kept):
            differ = int(np.setdiff1d(kept, served).size)
            problems.append(f"d2t and t2d disagree on {differ} of {kept.size} draft tokens: the engines read d2t "
                            "only, the trainer scored the drafter on t2d's ids")
    if problems:
        return MapDiagnosis("invalid", tuple(problems),
                            intended=kept if kept is not None and n and kept.size == n else None,
                            intended_how="t2d's set ids", served=served, data=data)
    if not vm.reduced:
        return MapDiagnosis("full", intended_how="the whole target vocabulary", served=served, data=data)
    return MapDiagnosis("ok", intended=np.sort(served), intended_how="arange + d2t (as the engines read it)",
                        served=served, data=data)
