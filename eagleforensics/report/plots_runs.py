"""Per-run line charts of parsed server logs (see ``eagleforensics.logs``): did the fix move the curve?

plotly is imported inside each function so that importing this module stays cheap.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


def _x_axis(df: "pd.DataFrame", relative: bool) -> tuple[str, str]:
    """Pick one x axis for every run: time (or seconds since each run's first line) if all runs have times, else line."""
    has_time = "time" in df.columns and bool(len(df)) and bool(
        df.groupby("run", sort=False)["time"].apply(lambda s: s.notna().any()).all()
    )
    if not has_time:
        return "line", "log line number"
    return ("elapsed_s", "seconds since the run's first data line") if relative else ("time", "time")


def _run_figure(df: "pd.DataFrame", column: str, title: str, y_title: str, relative: bool) -> "go.Figure":
    """One line per run of ``column`` against the chosen x axis; runs without values keep an empty trace."""
    import plotly.graph_objects as go

    x_col, x_title = _x_axis(df, relative)
    fig = go.Figure()
    for run, sub in df.groupby("run", sort=False):
        if x_col == "elapsed_s":
            sub = sub.assign(elapsed_s=(sub["time"] - sub["time"].min()).dt.total_seconds())
        points = sub[sub[column].notna()]
        label = str(run) if len(points) else f"{run} (no {y_title.lower()})"
        fig.add_trace(go.Scatter(
            x=points[x_col].tolist(), y=points[column].tolist(), mode="lines+markers", name=label
        ))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, legend_title="run")
    return fig


def accept_length_over_time(df: "pd.DataFrame", relative: bool = False) -> "go.Figure":
    """Accept length per data line, one line per run: the first thing a broken drafter moves."""
    return _run_figure(df, "accept_length", "Accept length per run", "Accept length", relative)


def throughput_over_time(df: "pd.DataFrame", relative: bool = False) -> "go.Figure":
    """Generation throughput (tok/s) per data line, one line per run: what the user feels."""
    return _run_figure(df, "gen_throughput", "Generation throughput per run", "Tokens/s", relative)
