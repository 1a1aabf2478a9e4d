"""Figures and tables of one alignment: the pictures the notebooks and the HTML report show.

Each builder takes an ``AlignmentResult`` and returns a plotly figure (or a pandas table), so
it can be tested without a notebook. plotly is imported inside the builders so importing
this module stays cheap. Every string that comes from the inputs (slot keys, paths) goes
through ``html.escape`` first: plotly titles, tick labels and hover text are HTML.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..arrays import as_array, f32
from ..errors import ForensicsError
from ..positions import Position

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import plotly.graph_objects as go

    from ..io.capture import Capture
    from ..io.training import TrainingRecord
    from ..results import AlignmentResult

FLOOR = 1e-7  # 1 - score below this is drawn as a perfect match (float32 noise)
DIP = 1e-3  # a token this far below the slot's median cosine is annotated as the odd one out
OK_COLOUR, BAD_COLOUR, CAPTURE_COLOUR = "#1a9850", "#d73027", "#333333"
# legends sit above the plot area, right-aligned: below it they cover the x-axis labels
LEGEND_TOP = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1}
# legends of many entries go right of the plot area, where they cover neither axis nor title
LEGEND_RIGHT = {"orientation": "v", "yanchor": "top", "y": 1, "xanchor": "left", "x": 1.02}


def esc(text: object) -> str:
    """``html.escape`` for anything from the inputs that ends up in a figure or a page."""
    return html.escape(str(text), quote=True)


def slot_index(result: AlignmentResult, slot: int | str) -> int:
    """Index of a slot given by index or by name (``hidden_states[2]``); a bad one is a ForensicsError."""
    names = [m.name for m in result.matches]
    if isinstance(slot, str):
        if slot not in names:
            raise ForensicsError(f"no slot named {slot!r}; slots are {', '.join(names)}")
        return names.index(slot)
    if not 0 <= int(slot) < len(names):
        raise ForensicsError(f"slot index {slot} is out of range (0..{len(names) - 1})")
    return int(slot)


def is_virtual(result: AlignmentResult, pos: Position) -> bool:
    """True for a post-norm column the matcher computed by fitting a norm gain (not in the capture)."""
    return pos not in result.scores.column_norms


def drawn_columns(result: AlignmentResult) -> list[int]:
    """Indexes of the heatmap's columns: every captured position, and a fitted post-norm column only
    where some slot (one that may be the final state) was scored, so no column is blank top to bottom."""
    scored = np.isfinite(np.asarray(result.scores.score, dtype=np.float64))
    return [j for j, c in enumerate(result.scores.columns) if not is_virtual(result, c) or scored[:, j].any()]


def column_label(result: AlignmentResult, pos: Position) -> str:
    """Axis label of a column: ``p3``, ``p12 post-norm``, ``p11 post-norm (fitted)``."""
    return pos.label + (" (fitted)" if is_virtual(result, pos) else "")


def _files(result: AlignmentResult) -> str:
    return f"{esc(Path(result.train_path).name)} vs {esc(Path(result.capture_path).name)}"


def _compared(result: AlignmentResult, values: np.ndarray, train_side: bool) -> np.ndarray:
    """The rows of a per-token array that take part in the comparison."""
    t = result.tokens
    start = t.train_start if train_side else t.capture_start
    return np.asarray(values, dtype=np.float64)[start:start + t.length]


def score_heatmap(result: AlignmentResult, highlight: tuple[int, Position] | None = None) -> go.Figure:
    """Slots x positions of the match score, coloured by 1 - score on a log scale; chosen cells marked.

    A log scale of the distance from a perfect match makes the winner stand out from its
    neighbours, which on a linear score scale all look alike (neighbouring layers have cosine
    0.9+). ``highlight`` (slot index, position) draws a selection box (used by the explorer).
    """
    import plotly.graph_objects as go

    sm = result.scores
    names = [esc(m.name) for m in result.matches]
    keep = drawn_columns(result)
    cols = [sm.columns[j] for j in keep]
    score = np.asarray(sm.score, dtype=np.float64)[:, keep]
    xs = [esc(column_label(result, c)) for c in cols]
    dist = np.clip(1.0 - score, FLOOR, 2.0)
    z = np.where(np.isfinite(score), np.log10(dist), np.nan)
    best = np.array([m.score for m in result.matches], dtype=np.float64)[:, None]
    margins = np.array([m.margin for m in result.matches], dtype=np.float64)[:, None]
    custom = np.stack([score, np.asarray(sm.rel_diff, dtype=np.float64)[:, keep], best - score,
                       np.broadcast_to(margins, score.shape), np.asarray(sm.tokens_used, dtype=np.float64)[:, keep]],
                      axis=-1)
    fitted = [f"<br>(fitted): raw p{c.p} through a norm gain fitted to this slot" if is_virtual(result, c) else ""
              for c in cols]
    text = [[fitted[j] for j in range(len(cols))] for _ in names]
    ticks = list(range(int(math.log10(FLOOR)), 1))
    fig = go.Figure(go.Heatmap(
        z=z.tolist(), x=xs, y=names, customdata=custom.tolist(), text=text, colorscale="Viridis_r", zmin=ticks[0],
        zmax=0, hoverongaps=False,  # a cell that was not scored has no hover text
        colorbar={"title": {"text": "1 − score"}, "tickvals": ticks, "ticktext": [f"1e{t}" for t in ticks]},
        hovertemplate=("slot %{y}<br>position %{x}%{text}<br>score %{customdata[0]:.6f}<br>"
                       "rel_diff %{customdata[1]:.3e}<br>below the slot's best by %{customdata[2]:.4f}<br>"
                       "slot margin %{customdata[3]:.4f}<br>tokens %{customdata[4]:.0f}<extra></extra>"),
        name="score",
    ))
    for confident, colour, symbol, label in ((True, OK_COLOUR, "square-open", "chosen (confident)"),
                                             (False, BAD_COLOUR, "x-thin-open", "best guess (not confident)")):
        picks = [(i, m) for i, m in enumerate(result.matches) if m.best is not None and m.confident == confident]
        if not picks:
            continue
        fig.add_trace(go.Scatter(
            x=[esc(column_label(result, m.best)) for _, m in picks], y=[names[i] for i, _ in picks],
            mode="markers", name=label, marker={"symbol": symbol, "size": 22, "color": colour, "line": {"width": 3}},
            text=[esc(f"{m.name}: {m.best.label}, score {m.score:.6f}, margin {m.margin:.4f}"
                      + ("" if m.confident else f" (not confident: {m.reason})")) for _, m in picks],
            hovertemplate="%{text}<extra></extra>",
        ))
    if highlight is not None:
        i, pos = highlight
        fig.add_trace(go.Scatter(x=[esc(column_label(result, pos))], y=[names[i]], mode="markers", name="selected",
                                 marker={"symbol": "circle-open", "size": 30, "color": "#ff7f0e", "line": {"width": 3}},
                                 hoverinfo="skip"))
    fig.update_layout(
        title={"text": f"Match score, training slots × capture positions<br><sup>{_files(result)}; blank: not "
                       "scored ((fitted) columns only for slots that may be the final state)</sup>"},
        # fixed ranges: autorange pads for the markers' size, which drew an empty column at the right
        xaxis={"title": {"text": "capture position (residual stream)"}, "type": "category", "tickangle": -45,
               "range": [-0.5, len(xs) - 0.5], "tickmode": "array", "tickvals": xs, "ticktext": xs},
        yaxis={"title": {"text": "training slot"}, "type": "category", "range": [len(names) - 0.5, -0.5]},
        height=max(420, 300 + 45 * len(names)), legend=LEGEND_TOP,
        margin={"l": 140, "r": 30, "t": 120, "b": 150},
    )
    return fig


def norm_profile(result: AlignmentResult, highlight: int | None = None, stat: str = "median") -> go.Figure:
    """Per-token norm of the capture at each position (log y), each slot's norm drawn against it.

    ``stat`` ("median" or "mean") summarises the per-token norms of the compared tokens. The
    median is the default: the first token's massive activation (norm ~100x the others from
    layer 1 on) dominates the mean and flattens the curve, hiding the growth with depth. A
    slot's dashed line crosses the capture's curve where its norm fits; its marker sits at
    the position it was matched to. Post-norm states sit apart from the residual curve.
    """
    import plotly.graph_objects as go

    if stat not in ("median", "mean"):
        raise ForensicsError(f"stat must be 'median' or 'mean', got {stat!r}")
    summary = np.nanmedian if stat == "median" else np.nanmean
    raw = sorted(p for p in result.scores.column_norms if not p.normed)
    normed = sorted(p for p in result.scores.column_norms if p.normed)
    level = {p: float(summary(_compared(result, result.scores.column_norms[p], False))) for p in raw + normed}
    fig = go.Figure(go.Scatter(
        x=[p.p for p in raw], y=[level[p] for p in raw], mode="lines+markers", name="capture (residual stream)",
        line={"color": CAPTURE_COLOUR, "width": 3},
        hovertemplate=f"p%{{x}}: {stat} norm %{{y:.4g}}<extra>capture</extra>",
    ))
    if normed:
        fig.add_trace(go.Scatter(
            x=[p.p for p in normed], y=[level[p] for p in normed], mode="markers", name="capture post-norm final",
            marker={"symbol": "diamond", "size": 12, "color": CAPTURE_COLOUR},
            hovertemplate=f"p%{{x}} post-norm: {stat} norm %{{y:.4g}}<extra>capture</extra>",
        ))
    xs = [p.p for p in raw + normed] or [0, result.num_layers]
    lo, hi = min(xs), max(xs)
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
    for i, (m, norms) in enumerate(zip(result.matches, result.slot_norms)):
        y = float(summary(_compared(result, norms, True)))
        colour = palette[i % len(palette)]
        where = m.best.label if m.best is not None else "no candidate"
        label = esc(f"{m.name} → {where}" + ("" if m.confident else " (not confident)"))
        hover = f"{label}<br>{stat} norm %{{y:.4g}}<extra></extra>"
        fig.add_trace(go.Scatter(
            x=[lo, hi], y=[y, y], mode="lines", name=label, legendgroup=str(i), hovertemplate=hover,
            line={"dash": "dash", "width": 4 if highlight == i else 1.5, "color": colour},
        ))
        if m.best is not None:
            fig.add_trace(go.Scatter(
                x=[m.best.p], y=[y], mode="markers", showlegend=False, legendgroup=str(i), hovertemplate=hover,
                marker={"size": 14 if highlight == i else 10, "symbol": "circle" if m.confident else "x",
                        "color": colour, "line": {"width": 1, "color": "white"}},
            ))
    fig.update_layout(
        title={"text": f"{stat.capitalize()} per-token norm by position<br><sup>{_files(result)}; "
                       f"{result.tokens.length} compared tokens</sup>"},
        xaxis={"title": {"text": "position p (0 = embedding, N = last layer)"}, "dtick": 1},
        yaxis={"title": {"text": f"{stat} per-token L2 norm"}, "type": "log"},
        height=480, legend=LEGEND_RIGHT, margin={"t": 80},
    )
    return fig


def per_token_cosine(result: AlignmentResult, slot: int | str, neighbours: int = 1, *,
                     position: Position | None = None, tokens: tuple[int, int] | None = None) -> go.Figure:
    """Per-token cosine of one slot against its chosen position (or ``position``) and the neighbours.

    A token whose cosine dips below the rest is misaligned or bad; a whole curve that sits
    below the chosen one shows how far the neighbouring layers are. ``tokens`` is a
    half-open range of compared-token indexes.
    """
    import plotly.graph_objects as go

    i = slot_index(result, slot)
    m = result.matches[i]
    centre = position if position is not None else m.best
    sm = result.scores
    t = result.tokens
    a, b = tokens if tokens is not None else (0, t.length)
    a, b = max(0, a), min(t.length, b)
    fig = go.Figure()
    if centre is None or centre not in sm.columns or b <= a:
        fig.add_annotation(text=esc(f"{m.name}: nothing to compare ({m.reason or 'empty token range'})"),
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    else:
        rows = np.arange(a, b)
        cols = [c for c in sm.columns if c.normed == centre.normed and abs(c.p - centre.p) <= neighbours]
        for c in sorted(cols, key=lambda c: (c != centre, c.p)):
            j = sm.columns.index(c)
            y = sm.per_token[i, j, a:b]
            is_centre = c == centre
            label = esc(column_label(result, c)) + (" (chosen)" if is_centre and position is None else "")
            fig.add_trace(go.Scatter(
                x=(rows + t.train_start).tolist(), y=[None if not np.isfinite(v) else float(v) for v in y],
                customdata=(rows + t.capture_start).tolist(), mode="lines+markers" if is_centre else "lines",
                name=label, line={"width": 3 if is_centre else 1.2, "dash": "solid" if is_centre else "dot"},
                hovertemplate=(f"{label}<br>training row %{{x}} / capture row %{{customdata}}"
                               "<br>cosine %{y:.6f}<extra></extra>"),
            ))
            if is_centre and np.isfinite(y).any() and np.nanmin(y) < np.nanmedian(y) - DIP:
                k = int(np.nanargmin(y))
                fig.add_annotation(x=int(rows[k] + t.train_start), y=float(y[k]), showarrow=True, arrowhead=2, ay=-30,
                                   text=f"token {int(rows[k] + t.train_start)}: {float(y[k]):.4f}")
    fig.update_layout(
        title={"text": f"Per-token cosine of {esc(m.name)} against "
                       f"{esc(column_label(result, centre)) if centre is not None else 'no position'} and neighbours"},
        xaxis={"title": {"text": "training row"}}, yaxis={"title": {"text": "cosine"}},
        height=400, legend=LEGEND_RIGHT, margin={"t": 60},
    )
    return fig


def load_inputs(result: AlignmentResult, allow_unsafe: bool = False) -> tuple[TrainingRecord, Capture]:
    """Reload the record and capture an alignment was computed from (its JSON keeps no tensors)."""
    from ..io.capture import load_capture
    from ..io.training import load_training

    record = load_training(result.train_path, fmt=result.train_format, allow_unsafe=allow_unsafe)
    capture = load_capture(result.capture_path, convention=result.capture_convention, allow_unsafe=allow_unsafe,
                           num_layers=result.num_layers if result.num_layers_source == "given" else None)
    return record, capture


def _sample_tokens(length: int, tokens: Sequence[int] | None) -> list[int]:
    if tokens is not None:
        return [int(t) for t in tokens if 0 <= int(t) < length]
    return sorted({0, length // 2, length - 1}) if length > 0 else []


def first_values_table(result: AlignmentResult, record: TrainingRecord | None = None,
                       capture: Capture | None = None, k: int = 5, tokens: Sequence[int] | None = None
                       ) -> pd.DataFrame:
    """The first ``k`` values of a few tokens of each slot next to the same tokens at its matched position.

    The check people do by hand (``print(train[t, :5]); print(capture[p][t, :5])``). Rows
    come in pairs: training, then capture at the slot's best position. Tokens default to the
    first, middle and last compared token. A fitted post-norm match is shown against the raw
    state of that position (the fitted gain is not applied), so only the direction agrees.
    """
    import pandas as pd

    if record is None or capture is None:
        loaded = load_inputs(result)
        record, capture = record or loaded[0], capture or loaded[1]
    slots = record.slots(result.hidden_size)
    if [s.name for s in slots] != [m.name for m in result.matches]:
        raise ForensicsError("this training record's slots are not the ones the alignment placed", path=record.path)
    t = result.tokens
    picks = _sample_tokens(t.length, tokens)
    cache: dict[Position, Any] = {}
    rows: list[dict[str, Any]] = []
    cols = [f"v{j}" for j in range(k)]
    for s, m in zip(slots, result.matches):
        pos = m.best
        source = None if pos is None else pos if pos in capture.readers else Position(pos.p)
        if source is not None and source not in capture.readers:
            source = None
        if source is not None and source not in cache:
            cache[source] = as_array(capture.read(source))
        where = "-" if pos is None else pos.label + ("" if source == pos else f" (raw p{pos.p}; fitted norm not applied)")
        for tok in picks:
            tr, cr = t.train_start + tok, t.capture_start + tok
            ours = f32(as_array(s.data)[tr, :k]).astype(np.float64)
            theirs = f32(cache[source][cr, :k]).astype(np.float64) if source is not None else np.full(k, np.nan)
            base = {"slot": m.name, "matched": where, "confident": m.confident, "token": tok}
            rows.append({**base, "side": f"training row {tr}", **dict(zip(cols, ours)), "max |diff|": np.nan})
            rows.append({**base, "side": f"capture row {cr}", **dict(zip(cols, theirs)),
                         "max |diff|": float(np.nanmax(np.abs(ours - theirs))) if source is not None else np.nan})
    return pd.DataFrame(rows, columns=["slot", "matched", "confident", "token", "side", *cols, "max |diff|"])
