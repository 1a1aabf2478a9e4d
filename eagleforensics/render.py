"""Plain-text rendering of an alignment result for the terminal."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .alignment import AlignmentResult


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def render_text(result: AlignmentResult) -> str:
    """The verdict, the slot table, the engine id lists and the findings, as terminal text."""
    r = result
    lines = [f"training: {r.train_path} ({r.train_format})",
             f"capture:  {r.capture_path} (convention {r.capture_convention}, N={r.num_layers} "
             f"[{r.num_layers_source}], H={r.hidden_size})",
             f"tokens:   {r.tokens.length} compared ({r.tokens.method})", "",
             "VERDICT: " + r.verdict, ""]
    header = ("slot", "role", "holds", "score", "margin", "confident", "tokens")
    rows = []
    for m in r.matches:
        pos = m.position
        holds = pos.describe(r.num_layers) if pos else f"no confident match (best {m.best.label if m.best else '-'})"
        rows.append((m.name, m.role, holds, _fmt(m.score), _fmt(m.margin), "yes" if m.confident else "NO", str(m.tokens)))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    if r.engine_ids:
        lines += ["", "ids each engine needs (eagle_aux_hidden_state_layer_ids):"]
        for label, ids in r.engine_ids.items():
            why = "; ".join(r.engine_notes.get(label, []))
            lines.append(f"  {label:<26} {ids if ids is not None else 'none works'}" + (f"  ({why})" if why else ""))
    if r.findings:
        lines += ["", "findings:"]
        lines += [f"  [{f.severity}] {f.code}: {f.message}" for f in r.findings]
    return "\n".join(lines)
