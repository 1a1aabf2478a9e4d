"""Figures and notebook output for a dataset scan: signature histograms per slot, outlier table, recorded summary.

plotly and IPython are imported inside the functions so importing this module stays cheap.
Every string that comes from the dataset (paths, reasons, the title) is escaped before it
becomes HTML or hover text.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from . import nbview

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from ..scan.runner import ScanResult

from .pipeline import (
    SUMMARY_KEY,  # the output-metadata glue every notebook of ours uses
)

SUMMARY_SCHEMA = "eagleforensics-scan-summary-v1"
PANELS = (("log_norm", "mean log norm"), ("norm_cv", "norm CV"), ("first_excess", "first-token excess"))


def signature_histograms(result: ScanResult, bins: int = 60) -> go.Figure:
    """One histogram per slot (columns) and signature statistic (rows); records with a reason naming the slot in red."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    slots = result.slots
    names = list(dict.fromkeys(slots["slot"]))
    fig = make_subplots(rows=len(PANELS), cols=max(1, len(names)), column_titles=[html.escape(n) for n in names],
                        row_titles=[label for _, label in PANELS], vertical_spacing=0.08, horizontal_spacing=0.04)
    for c, name in enumerate(names, 1):
        g = slots[slots["slot"] == name]
        outlier_paths = {p for p, reasons in result.outliers.items() if any(name in r for r in reasons)}
        for r, (feat, label) in enumerate(PANELS, 1):
            vals = g[feat].dropna()
            fig.add_trace(go.Histogram(x=vals.tolist(), nbinsx=bins, marker_color="#4575b4", showlegend=False,
                                       name=f"{name} {label}"), row=r, col=c)
            bad = g[g["path"].isin(outlier_paths) & g[feat].notna()]
            if len(bad):
                fig.add_trace(go.Scatter(
                    x=bad[feat].tolist(), y=[0] * len(bad), mode="markers", showlegend=False,
                    marker={"color": "#d73027", "size": 10, "symbol": "x"},
                    hovertext=[html.escape(p) for p in bad["path"]], hoverinfo="text+x", name="outlier"), row=r, col=c)
    fig.update_layout(title="Norm signature per slot (outlier records as red crosses)", bargap=0.02,
                      height=260 * len(PANELS), margin={"t": 80})
    return fig


def outlier_table(result: ScanResult) -> None:
    """Display the outlier records, one row each, every reason on its own line (all text escaped)."""
    import pandas as pd

    rows = [{"record": html.escape(p), "reasons": "<br>".join(html.escape(r) for r in reasons)}
            for p, reasons in result.outliers.items()]
    if not rows:
        nbview.html("<p>No outlier records.</p>", "No outlier records.")
        return
    table = pd.DataFrame(rows).to_html(index=False, escape=False, justify="left", border=0)
    table = table.replace("<td>", '<td style="text-align:left; vertical-align:top">')
    nbview.html(table, result.outlier_table().to_string(index=False))


def notebook_summary(result: ScanResult, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the notebook records in its output metadata: the overview, the outliers, the parameters."""
    return {"schema": SUMMARY_SCHEMA, **result.to_dict(), "parameters": params or {}}


def headline(result: ScanResult, title: str, params: dict[str, Any] | None = None) -> None:
    """Display the title and the headline, recording the summary in the output metadata."""
    o = result.overview()
    body = (f"<h2>{html.escape(title)}</h2><p><b>{html.escape(result.headline())}</b></p>"
            f"<p>reference: {html.escape(str(o['reference'] or 'none (records judged against the dataset itself)'))}"
            f"; results file: {html.escape(str(o['output'] or 'not written'))}</p>")
    nbview.html(body, f"{title}\n{result.headline()}",
             {SUMMARY_KEY: notebook_summary(result, params)})
