"""The result records: what an alignment found, as frozen data every room can import.

``Finding`` (one statement with a stable code), ``SlotMatch`` (one slot's placement) and
``AlignmentResult`` (the whole answer, with its dict/JSON/text forms) live here, below the
pipeline, so the rooms that derive findings (evidence, engines) and the rooms that show them
(report, cli) depend on the records rather than on the pipeline that fills them. The field
types that come from other rooms are named for type checkers only: no runtime import goes up.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import printable
from .positions import Position

if TYPE_CHECKING:  # pragma: no cover  (annotations only: results sit below every room)
    from .engines.crosscheck import CrossCheck
    from .evidence.confidence import Thresholds
    from .evidence.match import ScoreMatrix
    from .evidence.tokens import TokenAlignment
    from .verdict import EngineAdvice, Verdict

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
    fidelity_cause: str = ""  # routing / uniform / corrupted / scale (drift); norms (different)
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
            "score": _num(self.score), "margin": _num(self.margin), "confident": self.confident,
            "reason": self.reason or None,
            "best_candidate": None if self.best is None or unplaced else {"position": self.best.p,
                                                                          "post_norm": self.best.normed},
            "runner_up": None if self.runner_up is None or unplaced else {"position": self.runner_up.p,
                                                                          "post_norm": self.runner_up.normed},
            "rel_diff": _num(self.rel_diff), "max_abs_err": _num(self.max_abs_err), "norm_ratio": _num(self.norm_ratio),
            "tokens": self.tokens, "norm_cv": _num(self.norm_cv), "looks_post_norm": self.looks_post_norm,
            "nonfinite_rows": self.nonfinite_rows,
            "fitted": self.fitted,
            "identity": {
                "verdict": self.identity_verdict,
                "other": None if self.other is None or unplaced else {"position": self.other.p,
                                                                      "post_norm": self.other.normed},
                "robust_score": _num(self.robust_score), "vote_share": _num(self.vote_share),
                "paired_mean": _num(self.paired_mean), "paired_bound": _num(self.paired_bound),
                "neighbour_step": _num(self.neighbour_step), "neighbour": self.neighbour,
                "missing_neighbours": list(self.missing_neighbours),
                "distinct_tokens": None if self.distinct_tokens < 0 else self.distinct_tokens,
                "between_fraction": _num(self.between_fraction),
            },
            "fidelity": {"kind": self.fidelity or None, "cause": self.fidelity_cause or None,
                         "differing_tokens": self.differing_tokens, "text": self.fidelity_text or None},
        }


_DRIFT_WORDS = {"routing": "a few tokens differ (MoE routing)", "uniform": "every row drifts (quantised weights or "
                "other kernels)", "scale": "norms differ", "corrupted": "some rows are corrupted"}


def _evidence_notes(matches: list[SlotMatch]) -> str:
    """Short sentences on ambiguity, uncaptured neighbours and drift, appended to the verdict ('' if none)."""
    out = []
    for m in matches:
        if m.identity == "ambiguous" and m.best is not None and m.other is not None:
            out.append(f"{m.name} is ambiguous between {m.best.label} and {m.other.label}.")
        elif m.identity == "best-among-captured" and m.best is not None:
            out.append(f"{m.name}: {m.best.label} is only the best among the captured positions "
                       f"({' / '.join(f'p{q}' for q in m.missing_neighbours)} not captured).")
        elif m.identity == "between" and m.best is not None and m.other is not None:
            lo, hi = sorted((m.best, m.other))
            out.append(f"{m.name} sits between {lo.label} and {hi.label} (a mid-layer state).")
        elif m.identity == "rows-unverified":
            out.append(f"{m.name} matched on rows no ids or aux slot vouch for.")
    unknown = [m.name for m in matches if m.identity == "position-unknown"]
    if unknown:
        out.append(f"{', '.join(unknown)} {'matches a capture entry' if len(unknown) == 1 else 'match capture entries'} "
                   "whose position is unknown.")
    drift = [m for m in matches if m.confident and m.fidelity == "drift"]
    if drift:
        out.append("Placed under drift, not copies: " + "; ".join(
            f"{m.name}: {_DRIFT_WORDS.get(m.fidelity_cause, m.fidelity_cause)}" for m in drift) + ".")
    return "".join(" " + o for o in out)


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class AlignmentResult:
    """Everything one alignment found; render with ``to_dict``, ``to_json``, ``to_text``."""

    train_path: str
    train_format: str
    capture_path: str
    capture_convention: str
    num_layers: int
    num_layers_source: str
    hidden_size: int
    tokens: TokenAlignment
    matches: list[SlotMatch]
    scores: ScoreMatrix
    slot_norms: list[np.ndarray]
    engine_ids: dict[str, list[int] | None]
    engine_notes: dict[str, list[str]]
    findings: list[Finding]
    thresholds: Thresholds
    metadata: dict[str, Any] = field(default_factory=dict)
    serving: CrossCheck | None = None  # engine config vs training, when an engine was given
    advice: list[EngineAdvice] = field(default_factory=list)  # per engine: the ids to write, or default

    def judge(self) -> Verdict:
        """The verdict level (OK / ACTION / PROBLEM), its summary and what to do (``verdict.judge``)."""
        from .verdict import judge

        v = judge(self)
        notes = _evidence_notes(self.matches)  # ambiguity, uncaptured neighbours, the kind of drift
        return replace(v, summary=v.summary + notes) if notes else v

    @property
    def level(self) -> str:
        return self.judge().level

    @property
    def columns(self) -> list[Position]:
        return self.scores.columns

    @property
    def exit_code(self) -> int:
        """0 when the verdict is OK (nothing to do), 1 for ACTION or PROBLEM (something to do)."""
        return self.judge().exit_code

    @property
    def verdict(self) -> str:
        """One line a tired engineer can act on: ``LEVEL: summary`` (see ``eagleforensics.verdict``)."""
        return self.judge().line

    def to_dict(self) -> dict[str, Any]:
        v = self.judge()
        return {
            "verdict": v.line,
            "level": v.level,
            "exit_code": v.exit_code,
            "actions": [a.to_dict() for a in v.actions],
            "todo": list(v.todo),
            "training": {"path": self.train_path, "format": self.train_format, "metadata": _jsonable(self.metadata)},
            "capture": {"path": self.capture_path, "convention": self.capture_convention,
                        "num_layers": self.num_layers, "num_layers_source": self.num_layers_source,
                        "hidden_size": self.hidden_size, "positions": [c.label for c in self.columns]},
            "tokens": self.tokens.to_dict(),
            "thresholds": self.thresholds.to_dict(),
            "mapping": [m.to_dict(self.num_layers) for m in self.matches],
            "engine_ids": self.engine_ids,
            "engine_notes": self.engine_notes,
            "findings": [f.to_dict() for f in self.findings],
            "serving": None if self.serving is None else self.serving.to_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> "Any":
        """The mapping as a pandas DataFrame (one row per slot)."""
        import pandas as pd

        rows = [m.to_dict(self.num_layers) for m in self.matches]
        cols = ["name", "role", "position", "post_norm", "holds", "score", "margin", "confident", "tokens", "reason"]
        df = pd.DataFrame(rows)[cols]
        df.insert(df.columns.get_loc("confident") + 1, "identity", [m.identity_text for m in self.matches])
        df.insert(df.columns.get_loc("identity") + 1, "fidelity",
                  [m.fidelity + (f" ({m.fidelity_cause})" if m.fidelity_cause else "") for m in self.matches])
        return df

    def to_text(self) -> str:
        text = render_text(self)
        return text if self.serving is None else text + "\n\n" + self.serving.to_text()


def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    return {str(k): (v if isinstance(v, (str, int, float, bool)) or v is None else str(v)) for k, v in meta.items()}



def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def render_text(result: AlignmentResult) -> str:
    """The verdict, what to write or do, the findings (most severe first), the slot table, the engine ids."""
    from .verdict import by_severity

    r = result
    v = r.judge()
    lines = [f"training: {printable(r.train_path)} ({r.train_format})",
             f"capture:  {printable(r.capture_path)} (convention {r.capture_convention}, N={r.num_layers} "
             f"[{r.num_layers_source}], H={r.hidden_size})",
             f"tokens:   {r.tokens.length} compared ({r.tokens.method})", "",
             "VERDICT: " + v.line]
    for a in v.actions:
        lines += ["", f"  {a.engine}: write into {a.where}:"] + [f"    {x}" for x in (a.snippet or "").splitlines()]
    if v.todo:
        lines += ["", "what to do:"] + [f"  - {t}" for t in v.todo]
    if r.findings:
        lines += ["", "findings:"]
        lines += [f"  [{f.severity}] {f.code}: {f.message}" for f in by_severity(r.findings)]
    lines.append("")
    header = ("slot", "role", "holds", "score", "margin", "confident", "identity", "fidelity", "tokens")
    rows = []
    for m in r.matches:
        pos = m.position
        holds = (pos.describe(r.num_layers) + (" (fitted)" if m.fitted else "") if pos
                 else f"no confident match (best {m.best_label})")
        fid = m.fidelity + (f" ({m.fidelity_cause})" if m.fidelity_cause else "") if m.fidelity else "-"
        rows.append((m.name, m.role, holds, _fmt(m.score), _fmt(m.margin), "yes" if m.confident else "NO",
                     m.identity_text, fid, str(m.tokens)))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    if r.engine_ids:
        lines += ["", "ids each engine needs (eagle_aux_hidden_state_layer_ids):"]
        for label, ids in r.engine_ids.items():
            why = "; ".join(r.engine_notes.get(label, []))
            lines.append(f"  {label:<26} {ids if ids is not None else 'none works'}" + (f"  ({why})" if why else ""))
    return "\n".join(lines)
