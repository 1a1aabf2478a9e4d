"""The Replay section of the align report: accept length per wiring (trained one highlighted) and the per-step table."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .plots import esc

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from ..io.capture import Capture
    from ..results import AlignmentResult
    from .pipeline import ReportParams
    from ..replay import ReplayReport

TRAINED_COLOUR = "#1a9850"
OTHER_COLOUR = "#969696"


def _fmt(x: float | None, pattern: str) -> str:
    """A figure, or n/a where replay could not count a row."""
    return "n/a" if x is None else pattern.format(x)


def accept_length_chart(rep: ReplayReport) -> go.Figure:
    """Bars of accept length per wiring; the trained wiring green, the others grey, per-step reach in the hover."""
    import plotly.graph_objects as go

    trained = rep.trained
    shown = [r for r in rep.results if r.measured]  # a wiring no row could be counted for has no bar
    labels = [f"{esc(r.label)}<br>({esc(r.source)})" for r in shown]
    fig = go.Figure(go.Bar(
        x=labels, y=[r.accept_length for r in shown],
        marker_color=[TRAINED_COLOUR if r is trained else OTHER_COLOUR for r in shown],
        text=[_fmt(r.accept_length, "{:.2f}") for r in shown], textposition="outside",
        customdata=[[", ".join(_fmt(a, "{:.2f}") for a in r.acc), _fmt(r.speedup(rep.cost_ratio), "{:.2f}x")]
                    for r in shown],
        hovertemplate="%{x}<br>accept length %{y:.3f}<br>step acceptance %{customdata[0]}<br>"
                      "speed-up %{customdata[1]}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555", annotation_text="no draft accepted (1.0)")
    fig.update_layout(title=f"Replayed accept length per wiring (chain of {rep.steps}; green = trained)",
                      yaxis_title="accept length (tokens per verify)", xaxis_title="wiring fed to the drafter's fc",
                      height=420, margin={"t": 60, "b": 80}, showlegend=False)
    return fig


def replay_table_html(rep: ReplayReport) -> str:
    """Per-wiring figures as an escaped HTML table."""
    head = ["wiring", "source", "starts"] + [f"acc@{k}" for k in range(1, rep.steps + 1)] + \
        [f"reach@{k}" for k in range(1, rep.steps + 1)] + ["accept length", f"speed-up (c={rep.cost_ratio:g})"]
    rows = []
    for r in rep.results:
        cells = [r.label + (" (trained)" if r is rep.trained else ""), r.source, r.starts] + \
            [_fmt(a, "{:.3f}") for a in r.acc] + [_fmt(a, "{:.3f}") for a in r.reach] + \
            [_fmt(r.accept_length, "{:.3f}"), _fmt(r.speedup(rep.cost_ratio), "{:.2f}x")]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def replay_section(params: ReportParams, result: AlignmentResult, capture: Capture) -> ReplayReport | None:
    """Run the replay for the report's drafter (nothing without one) and display verdict, chart, table, findings."""
    drafter = getattr(params, "drafter", None)
    if not drafter:
        return None
    from . import nbview
    from ..replay import run_replay

    rep = run_replay(drafter, capture, target=getattr(params, "target", None), train=result,
                     engine=params.engine, draft_config=params.draft_config, engine_version=params.engine_version,
                     model_type=params.model_type, max_tokens=params.max_tokens)
    summary: dict[str, Any] = rep.to_dict()
    nbview.html(f"<h2>Replay</h2><p><b>{esc(rep.verdict)}</b></p><p>targets: {esc(rep.token_source)}</p>"
                f"<p>counted: {esc(rep.counting)}</p>",
                "REPLAY: " + rep.verdict, {"eagleforensics": summary})
    nbview.show(accept_length_chart(rep))
    nbview.html(replay_table_html(rep), rep.to_text())
    if rep.findings:
        nbview.html("<ul>" + "".join(f"<li>[{esc(f.severity)}] {esc(f.code)}: {esc(f.message)}</li>"
                                     for f in rep.findings) + "</ul>")
    return rep
