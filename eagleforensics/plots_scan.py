"""Figures and notebook output for a dataset scan: signature histograms per slot, outlier table, recorded summary.

plotly and IPython are imported inside the functions so importing this module stays cheap.
Every string that comes from the dataset (paths, reasons, the title) is escaped before it
becomes HTML or hover text.
"""
from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from .scan import ScanResult

SUMMARY_KEY = "eagleforensics"  # output-metadata key, the same glue the align notebook uses
SUMMARY_SCHEMA = "eagleforensics-scan-summary-v1"
PANELS = (("log_norm", "mean log norm"), ("norm_cv", "norm CV"), ("first_excess", "first-token excess"))
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


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
        _display({"text/html": "<p>No outlier records.</p>", "text/plain": "No outlier records."})
        return
    table = pd.DataFrame(rows).to_html(index=False, escape=False, justify="left", border=0)
    table = table.replace("<td>", '<td style="text-align:left; vertical-align:top">')
    _display({"text/html": table, "text/plain": result.outlier_table().to_string(index=False)})


def notebook_summary(result: ScanResult, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the notebook records in its output metadata: the overview, the outliers, the parameters."""
    return {"schema": SUMMARY_SCHEMA, **result.to_dict(), "parameters": params or {}}


def _display(data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
    from IPython.display import display

    display(data, raw=True, metadata=metadata or {})


def embed_plotlyjs() -> None:
    """Put plotly.js inline once, so an exported HTML page draws the figures without any network."""
    from plotly.offline import get_plotlyjs

    _display({"text/html": f'<script type="text/javascript">{get_plotlyjs()}</script>', "text/plain": "plotly.js embedded"})


def show(fig: go.Figure) -> None:
    """Display a figure as the plotly mimetype (JupyterLab) plus an HTML div (exported pages)."""
    div = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, config=PLOTLY_CONFIG)
    _display({"application/vnd.plotly.v1+json": {**json.loads(fig.to_json()), "config": PLOTLY_CONFIG},
              "text/html": div, "text/plain": f"<plotly figure: {fig.layout.title.text or 'untitled'}>"})


def headline(result: ScanResult, title: str, params: dict[str, Any] | None = None) -> None:
    """Display the title and the headline, recording the summary in the output metadata."""
    o = result.overview()
    body = (f"<h2>{html.escape(title)}</h2><p><b>{html.escape(result.headline())}</b></p>"
            f"<p>reference: {html.escape(str(o['reference'] or 'none (records judged against the dataset itself)'))}"
            f"; results file: {html.escape(str(o['output'] or 'not written'))}</p>")
    _display({"text/html": body, "text/plain": f"{title}\n{result.headline()}"},
             {SUMMARY_KEY: notebook_summary(result, params)})


def read_summary(nb: Any) -> dict[str, Any] | None:
    """The recorded scan summary of an executed notebook (nbformat node or dict), or None."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            meta = (out.get("metadata") or {}).get(SUMMARY_KEY)
            if isinstance(meta, dict) and meta.get("schema") == SUMMARY_SCHEMA:
                return meta
    return None
