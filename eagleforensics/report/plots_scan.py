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


# ---------------------------------------------------------------------- training data against the target

def agreement_histograms(result: ScanResult, bins: int = 40) -> go.Figure | None:
    """Per record: greedy agreement with the target and surprise against its own samples; records the audit
    flags as not written by the target in red. None when the scan had no target or scored nothing."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = result.audit_summary()
    if s is None or not s.per_record:
        return None
    flagged = {p for p, _ in s.flagged_records()}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("greedy agreement with the target (per record)",
                                                        "surprise vs the target's own samples, nats/token"))
    for col, (label, get) in enumerate((("agreement", lambda a: a.agreement),
                                        ("surprise", lambda a: a.mean_surprise)), 1):
        ok = [get(a) for p, a in s.per_record if p not in flagged and a.tokens]
        bad = [(p, get(a)) for p, a in s.per_record if p in flagged and a.tokens]
        fig.add_trace(go.Histogram(x=ok, nbinsx=bins, marker_color="#4575b4", name=f"{label}: from the target",
                                   showlegend=col == 1), row=1, col=col)
        if bad:
            fig.add_trace(go.Histogram(x=[v for _, v in bad], nbinsx=bins, marker_color="#d73027",
                                       name="not from the target", showlegend=col == 1,
                                       hovertext=[html.escape(p) for p, _ in bad]), row=1, col=col)
    fig.update_layout(barmode="stack", bargap=0.02, height=360, margin={"t": 60},
                      title="Training answers against the target")
    return fig


def training_data_section(result: ScanResult) -> None:
    """The audit's findings, figures and skeleton table (all text escaped); says so when the scan had no target."""
    import pandas as pd

    s = result.audit_summary()
    if s is None:
        nbview.html("<p>No target given: set <code>target</code> to the target model directory to audit the training "
                    "data (agreement with its lm_head; chat template, thinking mode and loss mask).</p>",
                    "No target given.")
        return
    ctx = result.audit or {}
    pc = s.percentiles()
    a = s.agreement
    items = [f"{s.records} records, {s.supervised:,} supervised tokens; length p50 {pc['p50']}, p95 {pc['p95']}, "
             f"max {pc['max']}" + (f"; served length {ctx['served_len']:,}" if ctx.get("served_len") else "")]
    if a.tokens:
        items.append(f"agreement over {a.tokens:,} tokens of {len(s.per_record)} records: greedy {a.agreement:.1%}, "
                     f"mean log p {a.mean_logprob:.2f}, outside top 5 {a.top5_miss:.1%}, surprise "
                     f"{a.mean_surprise:+.3f} nats/token (z {a.z:.1f}), best-fitting temperature "
                     f"{a.fitted_temperature:g}; {len(s.flagged_records())} records not from the target")
    for key in ("head_error", "skeleton_error"):
        if ctx.get(key):
            items.append(f"not checked: {ctx[key]}")
    body = "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"
    found = result.audit_findings()
    if found:
        body += "<ul>" + "".join(
            f"<li><b>[{html.escape(f.severity)}] {html.escape(f.code)}</b>: {html.escape(f.message)}"
            + (f"<br><i>fix:</i> {html.escape(f.fix)}" if f.fix else "") + "</li>" for f in found) + "</ul>"
    nbview.html(body, "\n".join(items + [f"[{f.severity}] {f.code}: {f.message}" for f in found]))
    if s.skeletons:
        total = sum(s.skeletons.values())
        nbview.table(pd.DataFrame([{"answers follow": k, "records": n, "share": n / total}
                                   for k, n in s.skeletons.most_common()]), precision=3)
    if s.starts:
        runs = pd.DataFrame([{"supervised runs": "start " + k, "count": n} for k, n in s.starts.most_common()]
                            + [{"supervised runs": "end " + k, "count": n} for k, n in s.ends.most_common()]
                            + [{"supervised runs": "answer " + k, "count": n} for k, n in s.states.most_common()])
        nbview.table(runs, precision=0)
