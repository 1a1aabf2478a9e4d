"""The result records: what an alignment found, as frozen data every room can import.

``Finding`` (one statement with a stable code), ``SlotMatch`` (one slot's placement) and
``AlignmentResult`` (the whole answer, with its dict/JSON/text forms) live here, below the
pipeline, so the rooms that derive findings (evidence, engines) and the rooms that show them
(report, cli) depend on the records rather than on the pipeline that fills them. The field
types that come from other rooms are named for type checkers only: no runtime import goes up.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import printable
from .positions import Position
from .records import IMPACTS, SEVERITIES, CrossCheck, Finding, SlotMatch  # noqa: F401  (re-exported: their old home)

if TYPE_CHECKING:  # pragma: no cover  (annotations only: results sit below every room)
    from .evidence.confidence import Thresholds
    from .evidence.match import ScoreMatrix
    from .evidence.tokens import TokenAlignment
    from .records import EngineAdvice
    from .verdict import Verdict

_DRIFT_WORDS = {"routing": "a few tokens differ (MoE routing)", "uniform": "every row drifts (quantised weights or "
                "other kernels)", "scale": "norms differ", "corrupted": "some rows are corrupted",
                "context": "the rows follow other tokens on each side (another system prompt or template)"}


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
    from .records import by_severity

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
