"""The records every room reads and writes: a finding, a placed slot, an engine's advice, the serving cross-check.

Frozen data with their JSON and text forms, and nothing else: the floor of the house. Every room may import it
and it imports only the other bottom modules (``errors``, ``positions``), so no room that makes these records
has to import the rooms that read them (``results``, ``verdict``), and no circle forms.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .positions import Position

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
SEVERITIES = ("error", "warning", "info")
# How much acceptance a cause is likely to cost, most first: ``collapse`` (acceptance near zero or
# structural: nothing can be accepted), ``high`` (a large share lost), ``medium``, ``low``; "" = not rated.
IMPACTS = ("collapse", "high", "medium", "low", "")


@dataclass(frozen=True)
class Finding:
    """One statement with a stable ``code``; ``message`` is for people.

    ``fix`` (what to do), ``source`` (the thread, release or file the rule rests on) and ``impact``
    (one of ``IMPACTS``) are filled by the doctor's checks; align's findings leave them empty, and
    empty ones are left out of ``to_dict`` so align's JSON keeps its shape.
    """

    code: str
    severity: str
    message: str
    fix: str = ""
    source: str = ""
    impact: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v or k in ("code", "severity", "message")}


@dataclass(frozen=True)
class SlotMatch:
    """Where one training slot sits in the residual stream, and how sure we are."""

    key: str
    index: int | None
    role: str
    dtype: str
    best: Position | None
    score: float
    runner_up: Position | None
    margin: float
    confident: bool
    reason: str
    rel_diff: float
    max_abs_err: float
    norm_ratio: float
    tokens: int
    norm_cv: float
    looks_post_norm: bool
    nonfinite_rows: int
    # identity: which position, judged from evidence measured on this data (evidence.identity)
    identity: str = ""  # one of evidence.identity.VERDICTS ("" = not judged: a fingerprint)
    other: Position | None = None  # the position it is ambiguous with, else the runner-up
    robust_score: float = float("nan")  # median per-token score at ``best``
    vote_share: float = float("nan")  # share of tokens whose own best is best.p
    paired_mean: float = float("nan")  # mean per-token (best - runner-up)
    paired_bound: float = float("nan")  # lower confidence bound of that mean
    neighbour_step: float = float("nan")  # capture's own cosine of best.p with its closest captured neighbour
    neighbour: int | None = None
    missing_neighbours: tuple[int, ...] = ()
    fitted: bool = False  # best is a post-norm column computed by fitting a norm gain, not a captured one
    # fidelity: how close it is to that state (evidence.fidelity)
    fidelity: str = ""  # copy / drift / different
    fidelity_cause: str = ""  # routing / uniform / corrupted / scale / context (drift); norms (different)
    fidelity_text: str = ""
    differing_tokens: int = 0
    distinct_tokens: int = -1  # distinct (slot row, capture row) pairs the identity rests on (-1: not counted)
    between_fraction: float = float("nan")  # fraction of the layer step from best toward its neighbour ``other``

    @property
    def identity_verdict(self) -> str:
        """The identity answer, also for matches judged by the older score-floor rule (fingerprints)."""
        return self.identity or ("confident" if self.confident else "none")

    @property
    def best_label(self) -> str:
        """``p3``, ``p12 post-norm``, ``p11 post-norm (fitted)``, or ``-``."""
        return "-" if self.best is None else self.best.label + (" (fitted)" if self.fitted else "")

    @property
    def identity_text(self) -> str:
        """Identity in a few words for tables: ``confident``, ``ambiguous p5/p6``, ``best among captured``."""
        v = self.identity_verdict
        if v in ("ambiguous", "between") and self.best is not None and self.other is not None:
            return f"{v} {self.best.label}/{self.other.label}"
        return {"best-among-captured": "best among captured", "position-unknown": "position unknown",
                "rows-unverified": "rows unverified"}.get(v, v)

    @property
    def name(self) -> str:
        return self.key if self.index is None else f"{self.key}[{self.index}]"

    @property
    def position(self) -> Position | None:
        """The placed position, or None when the match is not confident."""
        return self.best if self.confident else None

    def to_dict(self, num_layers: int) -> dict[str, Any]:
        """One ``mapping`` entry of the JSON. Beside the placement keys:

        ``fitted``: the best column is a gain-fitted post-norm state, not a captured one.
        ``identity``: ``verdict`` (confident / ambiguous / best-among-captured / between /
        position-unknown / rows-unverified / none), ``other`` (the position it is ambiguous with or
        sits between, else the runner-up), ``distinct_tokens`` (distinct slot row / capture row
        pairs it rests on), ``between_fraction`` (how far from the best position toward its
        closer neighbour the slot sits, as a share of the layer step), ``robust_score`` (median
        per-token score), ``vote_share`` (share of tokens whose own best is this position),
        ``paired_mean`` / ``paired_bound`` (best minus runner-up over the same tokens: mean, and
        the lower confidence bound of the median), ``neighbour_step`` (the capture's own cosine
        between this position and its closest captured neighbour ``neighbour``),
        ``missing_neighbours`` (p-1 / p+1 not in the capture).
        ``fidelity``: ``kind`` (copy / drift / different), ``cause`` (drift: routing / uniform / scale /
        corrupted; different: norms, or empty), ``differing_tokens`` and ``text`` (the finding in words).
        """
        pos = self.position
        # where labels give no position (a list index, a p0 that is not the embedding) there is no candidate
        # position to name either: a script reading best_candidate would take it for an answer
        unplaced = self.identity_verdict == "position-unknown"
        return {
            "key": self.key, "index": self.index, "name": self.name, "role": self.role, "dtype": self.dtype,
            "position": None if pos is None else pos.p,
            "post_norm": None if pos is None else pos.normed,
            "holds": None if pos is None else pos.describe(num_layers),
            "score": num_or_none(self.score), "margin": num_or_none(self.margin), "confident": self.confident,
            "reason": self.reason or None,
            "best_candidate": None if self.best is None or unplaced else {"position": self.best.p,
                                                                          "post_norm": self.best.normed},
            "runner_up": None if self.runner_up is None or unplaced else {"position": self.runner_up.p,
                                                                          "post_norm": self.runner_up.normed},
            "rel_diff": num_or_none(self.rel_diff), "max_abs_err": num_or_none(self.max_abs_err), "norm_ratio": num_or_none(self.norm_ratio),
            "tokens": self.tokens, "norm_cv": num_or_none(self.norm_cv), "looks_post_norm": self.looks_post_norm,
            "nonfinite_rows": self.nonfinite_rows,
            "fitted": self.fitted,
            "identity": {
                "verdict": self.identity_verdict,
                "other": None if self.other is None or unplaced else {"position": self.other.p,
                                                                      "post_norm": self.other.normed},
                "robust_score": num_or_none(self.robust_score), "vote_share": num_or_none(self.vote_share),
                "paired_mean": num_or_none(self.paired_mean), "paired_bound": num_or_none(self.paired_bound),
                "neighbour_step": num_or_none(self.neighbour_step), "neighbour": self.neighbour,
                "missing_neighbours": list(self.missing_neighbours),
                "distinct_tokens": None if self.distinct_tokens < 0 else self.distinct_tokens,
                "between_fraction": num_or_none(self.between_fraction),
            },
            "fidelity": {"kind": self.fidelity or None, "cause": self.fidelity_cause or None,
                         "differing_tokens": self.differing_tokens, "text": self.fidelity_text or None},
        }


def num_or_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)



@dataclass(frozen=True)
class EngineAdvice:
    """What one engine (a rules target label) needs to capture the trained aux positions.

    ``snippet`` is the text to write (``syntax`` json or yaml) into ``where``, or None when no
    id list works (``notes`` say why). ``at_default`` is True when the engine's default ids
    already capture exactly these positions, so nothing has to be written.
    """

    engine: str
    ids: list[int] | None
    key: str | None
    where: str
    snippet: str | None
    syntax: str = "json"
    at_default: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "ids": self.ids, "key": self.key, "where": self.where,
                "snippet": self.snippet, "syntax": self.syntax, "at_default": self.at_default,
                "notes": list(self.notes)}


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Findings most severe first (stable within a severity)."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, len(SEVERITY_ORDER)))


MATCH, MISMATCH, CANNOT_JUDGE = "match", "mismatch", "cannot-judge"
WRITE_WHERE = {"sglang": "the draft's config.json", "vllm": "the draft's config.json",
                "trtllm": "the TensorRT-LLM extra-API YAML (JSON is valid YAML)"}


@dataclass(frozen=True)
class CrossCheck:
    """The engine's captured positions against the trained ones, and the ids that fix a mismatch."""

    engine: str
    version: str | None
    target: str
    num_layers: int
    draft_path: str
    ids_used: list[int]
    key_read: str | None
    positions_served: list[Position]
    positions_trained: list[Position] | None
    status: str
    fix_ids: list[int] | None = None
    fix_key: str | None = None
    fix_snippet: str | None = None
    fix_notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    rule: str = ""
    fix_all: dict[str, Any] | None = None

    @property
    def match(self) -> bool:
        """True only when the engine will capture exactly the trained positions, in slot order."""
        return self.status == MATCH

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready dict."""
        def labels(ps: list[Position] | None) -> list[str] | None:
            return None if ps is None else [q.label for q in ps]

        return {
            "status": self.status, "match": self.match, "engine": self.engine,
            "version": self.version, "target": self.target, "num_layers": self.num_layers,
            "draft_config": self.draft_path or None, "ids_used": self.ids_used,
            "key_read": self.key_read,
            "positions_served": labels(self.positions_served),
            "positions_trained": labels(self.positions_trained),
            "fix": None if self.fix_ids is None else {
                "ids": self.fix_ids, "key": self.fix_key, "snippet": json.loads(self.fix_snippet or "null"),
                "where": WRITE_WHERE[self.engine]},
            "fix_notes": self.fix_notes, "rule": self.rule, "fix_all": self.fix_all,
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_text(self) -> str:
        """A terminal section: served vs trained, the verdict and the snippet to paste."""
        ver = f" {self.version}" if self.version else ""
        src = self.key_read or "none: engine default"
        lines = [f"serving: {self.engine}{ver} (rule {self.rule or self.target}, N={self.num_layers})",
                 f"  draft config:    {self.draft_path or '(none given: engine default)'}",
                 f"  ids used:        {self.ids_used}  (read from: {src})",
                 f"  engine captures: {join_positions(self.positions_served)}",
                 f"  training holds:  {join_positions(self.positions_trained)}"]
        if self.status == MATCH:
            lines.append("  MATCH: the engine feeds the drafter the states it was trained on")
        elif self.status == CANNOT_JUDGE:
            why = next((f.message for f in self.findings if f.code in ("serving-unjudged", "num-layers-disagree")), "")
            lines.append(f"  CANNOT JUDGE: {why}")
        elif self.fix_ids is not None:
            lines += [f"  MISMATCH: set {self.fix_key} in {WRITE_WHERE[self.engine]}:",
                      f"    {self.fix_snippet}"]
        else:
            lines.append("  MISMATCH, and no id list on this engine captures the trained positions:")
        lines += [f"    note: {n}" for n in self.fix_notes]
        if self.status == MISMATCH and self.fix_all is not None:
            lines.append("  one draft config for every engine (config.json, then the TensorRT-LLM YAML):")
            lines.append(f"    {json.dumps(self.fix_all['config_json'])}")
            if self.fix_all.get("trtllm_yaml") is not None:
                lines.append(f"    {json.dumps(self.fix_all['trtllm_yaml'])}")
            for eng, why in self.fix_all.get("cannot", {}).items():
                lines.append(f"    cannot satisfy {eng}: {why}")
        return "\n".join(lines)


def join_positions(ps: list[Position] | None) -> str:
    return "-" if ps is None else (", ".join(q.label for q in ps) or "nothing")
