"""The plan's figures: predicted tok/s per step count with the measured runs on it, and the fitted round time.

plotly is imported inside each function so that importing this module stays cheap. Every label a
file or the command line controls goes through ``plots.esc`` (plotly renders HTML in labels).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .plots import esc

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from ..plan import PlanReport, Prediction

CURVE = "#2166ac"
BAND = "rgba(33,102,172,0.15)"
ALT = ("#1a9850", "#762a83")
MEASURED = "#d73027"
BASELINE = "#555555"


def _chains(preds: list[Prediction]) -> list[Prediction]:
    return sorted((p for p in preds if p.config.chain and p.tok_s is not None), key=lambda p: p.config.steps)


def _band(fig: go.Figure, xs: list[int], lo: list[float], hi: list[float], name: str) -> None:
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=xs + xs[::-1], y=hi + lo[::-1], fill="toself", fillcolor=BAND,
                             line={"width": 0}, hoverinfo="skip", name=name, showlegend=True))


def tok_s_curve(rep: PlanReport) -> go.Figure:
    """Predicted tok/s per chain step count (band: what the runs allow), the measured runs, the baseline, the best."""
    import plotly.graph_objects as go

    fig = go.Figure()
    chain = _chains(rep.predictions)
    xs = [p.config.steps for p in chain]
    if chain:
        lo = [p.tok_lo if p.tok_lo is not None else p.tok_s for p in chain]
        hi = [p.tok_hi if p.tok_hi is not None else p.tok_s for p in chain]
        if any(h - lw > 1e-9 for lw, h in zip(lo, hi)):
            _band(fig, xs, lo, hi, "range the runs allow")
        fig.add_trace(go.Scatter(
            x=xs, y=[p.tok_s for p in chain], mode="lines+markers", name="predicted", line={"color": CURVE},
            customdata=[[p.config.verified, 1e3 * p.round_s, p.accept or 0.0, p.accept_how or ""] for p in chain],
            hovertemplate="%{x} steps (%{customdata[0]} draft tokens)<br>%{y:.1f} tok/s<br>round %{customdata[1]:.2f} "
                          "ms<br>accept length %{customdata[2]:.2f} (%{customdata[3]})<extra></extra>"))
    for i, (name, preds) in enumerate(rep.alt_predictions.items()):
        alt = _chains(preds)
        if alt:
            fig.add_trace(go.Scatter(x=[p.config.steps for p in alt], y=[p.tok_s for p in alt], mode="lines",
                                     name=esc(name), line={"color": ALT[i % len(ALT)], "dash": "dash"}))
    measured = [r for r in rep.runs if r.role in ("fit", "served") and r.config is not None and r.config.chain]
    if measured:
        fig.add_trace(go.Scatter(
            x=[r.config.steps for r in measured], y=[r.tok_s for r in measured], mode="markers+text",
            name="measured runs", marker={"color": MEASURED, "size": 11, "symbol": "diamond"},
            text=[esc(r.label) + (" (served)" if r.role == "served" else "") for r in measured],
            textposition="top center",
            error_y={"type": "data", "array": [2 * r.tok_s_se if r.tok_s_se == r.tok_s_se else 0 for r in measured]},
            hovertemplate="%{text}: %{y:.1f} tok/s measured<extra></extra>"))
    if rep.baseline is not None:
        name = "baseline" if rep.baseline.label == "baseline" else f"baseline ({esc(rep.baseline.label)})"
        fig.add_hline(y=rep.baseline.tok_s, line_dash="dot", line_color=BASELINE,
                      annotation_text=f"{name}: {rep.baseline.tok_s:.1f} tok/s")
    best = rep.best
    if best is not None and best.config.chain:
        fig.add_trace(go.Scatter(x=[best.config.steps], y=[best.tok_s], mode="markers", name="best",
                                 marker={"color": CURVE, "size": 16, "symbol": "star"}))
    fig.update_layout(title="Predicted tok/s per step count (chain, topk 1)", xaxis_title="draft steps (num_steps)",
                      yaxis_title="tokens/s", xaxis={"dtick": 1}, height=460, legend_title="")
    return fig


def round_time_curve(rep: PlanReport) -> go.Figure:
    """The fitted round time per chain step count (band where the runs leave it open) and the runs' own round times."""
    import plotly.graph_objects as go

    fig = go.Figure()
    chain = sorted((p for p in rep.predictions if p.config.chain), key=lambda p: p.config.steps)
    xs = [p.config.steps for p in chain]
    if chain:
        lo, hi = [1e3 * p.round_lo for p in chain], [1e3 * p.round_hi for p in chain]
        if any(h - lw > 1e-6 for lw, h in zip(lo, hi)):
            _band(fig, xs, lo, hi, "range the runs allow")
        fig.add_trace(go.Scatter(x=xs, y=[1e3 * p.round_s for p in chain], mode="lines+markers", name="fitted round",
                                 line={"color": CURVE}))
        share = [100 * rep.fit.point.verify_share(p.config) for p in chain]
        row = chain[0].config.row().copy()
        row[2] = 0.0
        split = "" if rep.fit.pins(row) else " (split assumed)"
        fig.add_trace(go.Scatter(x=xs, y=[1e3 * rep.fit.point.verify_pass_s(p.config) for p in chain], mode="lines",
                                 name=f"of which the verify pass{split}", line={"color": CURVE, "dash": "dot"},
                                 customdata=share, hovertemplate="%{y:.2f} ms (%{customdata:.0f}% of the round)"
                                                                 "<extra></extra>"))
    runs = [r for r in rep.runs if r.role in ("fit", "served") and r.config is not None and r.config.chain]
    if runs:
        fig.add_trace(go.Scatter(x=[r.config.steps for r in runs], y=[1e3 * r.round_s for r in runs],
                                 mode="markers+text", text=[esc(r.label) for r in runs], textposition="top center",
                                 name="measured runs", marker={"color": MEASURED, "size": 10, "symbol": "diamond"}))
    if rep.baseline is not None:
        step = 1e3 * rep.baseline.batch / rep.baseline.tok_s
        fig.add_hline(y=step, line_dash="dot", line_color=BASELINE, annotation_text=f"baseline decode step {step:.2f} ms")
    fig.update_layout(title="Cost of one round: verify pass + k draft steps", xaxis_title="draft steps (num_steps)",
                      yaxis_title="ms per round", xaxis={"dtick": 1}, height=420, legend_title="")
    return fig
