"""What the notebooks display: escaped HTML blocks, plotly figures with plotly.js inline, the recorded summary.

Each call displays through IPython and returns nothing the notebook must handle, so the
notebooks stay a list of library calls. Figures go out as a bundle of the plotly mimetype
(JupyterLab draws it with its plotly extension) and an HTML div that an exported page
draws with the plotly.js that ``setup`` embedded once: no CDN, works offline. Every
string from the inputs is escaped (``plots.esc``) before it becomes HTML.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .pipeline import SUMMARY_KEY, ReportParams, notebook_summary
from .plots import esc

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import plotly.graph_objects as go

    from ..doctor import DoctorReport
    from ..results import AlignmentResult
    from .doctorreport import DoctorParams
    from .runs import RunsParams

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
_SEVERITY_COLOUR = {"error": "#d73027", "warning": "#e08214", "info": "#4575b4"}
LEVEL_COLOUR = {"OK": "#1a9850", "ACTION": "#e08214", "PROBLEM": "#d73027"}
# Plain inline script, no network: copy a snippet (clipboard API, else a selection and execCommand)
# and sort a table by a clicked header (numbers as numbers, "-" last).
_PAGE_JS = r"""
function efCopy(btn){var pre=document.getElementById(btn.getAttribute('data-target'));if(!pre)return;
var text=pre.textContent,done=function(){btn.textContent='copied';setTimeout(function(){btn.textContent='copy'},1500)};
if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(text).then(done,function(){efSelect(pre,done)})}
else{efSelect(pre,done)}}
function efSelect(pre,done){var r=document.createRange();r.selectNodeContents(pre);var s=window.getSelection();
s.removeAllRanges();s.addRange(r);try{document.execCommand('copy');done()}catch(e){}}
function efSort(th){var table=th.closest('table'),body=table.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th);
var asc=th.getAttribute('data-asc')!=='1';th.setAttribute('data-asc',asc?'1':'0');
var key=function(tr){var t=(tr.children[i]||{}).textContent||'';var n=parseFloat(t.replace(/,/g,''));
return t.trim()==='-'?[2,0]:(isNaN(n)||!/^\s*[-+0-9.]/.test(t))?[1,t]:[0,n]};
var rows=Array.prototype.slice.call(body.rows);rows.sort(function(a,b){var x=key(a),y=key(b);
if(x[0]!==y[0])return x[0]-y[0];var c=x[1]<y[1]?-1:x[1]>y[1]?1:0;return asc?c:-c});
rows.forEach(function(r){body.appendChild(r)})}
"""
def _assets() -> str:
    """The inline script and style the verdict and tables use: carried by each output (a few hundred
    bytes), so a notebook that shows a table without ``setup`` still sorts and wraps it."""
    return f'<script type="text/javascript">{_PAGE_JS}</script>{_TABLE_CSS}'


_TABLE_CSS = ("<style>.ef-table{border-collapse:collapse;margin:0.5em 0}.ef-table th,.ef-table td{"
              "white-space:normal!important;overflow-wrap:break-word;max-width:42em;text-align:left!important;"
              "vertical-align:top;padding:0.2em 0.6em;border-bottom:1px solid #ddd}"
              ".ef-table th{white-space:nowrap!important}.ef-table th.ef-sort{cursor:pointer}.ef-table th.ef-sort:after{content:' \\2195';color:#999}"
              ".ef-snippet{background:#f4f4f4;border:1px solid #ddd;padding:0.5em;margin:0.2em 0 0.6em;"
              "white-space:pre-wrap}.ef-copy{margin-left:0.6em;cursor:pointer}</style>")


def _display(data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
    from IPython.display import display

    display(data, raw=True, metadata=metadata or {})


def setup() -> None:
    """Embed plotly.js once, inline, so an exported HTML page draws its figures without any network."""
    from plotly.offline import get_plotlyjs

    _display({"text/html": f'<script type="text/javascript">{get_plotlyjs()}</script>',
              "text/plain": "plotly.js embedded"})


def show(fig: go.Figure) -> None:
    """Display a figure: plotly mimetype for JupyterLab, an inline-plotly HTML div for exported pages."""
    div = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, config=PLOTLY_CONFIG)
    _display({"application/vnd.plotly.v1+json": {**json.loads(fig.to_json()), "config": PLOTLY_CONFIG},
              "text/html": div, "text/plain": f"<plotly figure: {fig.layout.title.text or 'untitled'}>"})


def html(markup: str, plain: str = "", metadata: dict[str, Any] | None = None) -> None:
    """Display HTML the caller has already escaped, with a plain-text fallback."""
    _display({"text/html": markup, "text/plain": plain or markup}, metadata)


def _rows(pairs: list[tuple[str, Any]]) -> str:
    return "".join(f"<tr><th style='text-align:left;padding-right:1em'>{esc(k)}</th><td style='text-align:left'>"
                   f"{esc('-' if v is None else v)}</td></tr>" for k, v in pairs)


def header(params: ReportParams, result: AlignmentResult) -> None:
    """Title, inputs, parameters and the record's metadata, all escaped."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("eagleforensics")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled checkout
        ours = "unknown"
    t = result.tokens
    pairs = [("training record", f"{params.shard} ({result.train_format})"),
             ("capture", f"{params.capture} (convention {result.capture_convention})"),
             ("model", f"N={result.num_layers} layers ({result.num_layers_source}), hidden size {result.hidden_size}"),
             ("tokens compared", f"{t.length} ({t.method}): {t.note}"),
             ("engine of interest", params.engine or "all")]
    if params.engine is not None:
        pairs += [("draft config", params.draft_config or "none given: the engine's default ids"),
                  ("engine version", params.engine_version or "not given"),
                  ("model type", params.model_type or "not given")]
    pairs += [("max_tokens", params.max_tokens),
             ("device", params.device), ("eagleforensics", ours)]
    pairs += [(f"metadata: {k}", v) for k, v in result.metadata.items()]
    html(f"<h1>{esc(params.heading)}</h1><table>{_rows(pairs)}</table>", params.heading)


def verdict(result: AlignmentResult, params: ReportParams | None = None) -> None:
    """The verdict level and line, per engine the snippet to write (with a copy button) or what to do,
    then the findings most severe first; carries the recorded summary in its output metadata (the glue)."""
    from ..verdict import by_severity

    v = result.judge()
    colour = LEVEL_COLOUR.get(v.level, "#000")
    parts = [f"<p style='font-size:1.2em;margin:0.2em 0'><b style='color:{colour}'>Verdict: {esc(v.level)}</b> "
             f"{esc(v.summary)}</p>"]
    engine = params.engine if params is not None else None
    if engine is not None:
        parts.append(f"<p>{esc(engine_advice(result, engine))}</p>")
    todo = "<p><b>What to do</b></p><ul>" + "".join(f"<li>{esc(t)}</li>" for t in v.todo) + "</ul>"
    if v.todo and v.level == "PROBLEM":
        parts.append(todo)
    if v.actions:
        lead = ("Write these ids</b> (each engine reads its own key; paste the snippet into the file named):"
                if v.level != "PROBLEM" else "Only these engines can serve the record as it is</b>:")
        parts.append(f"<p><b>{lead}</p>")
    for k, a in enumerate(v.actions):
        pid = f"ef-snippet-{k}"
        parts.append(f"<div class='ef-action'><b>{esc(a.engine)}</b> {esc(a.syntax.upper())} for {esc(a.where)}"
                     f"<button type='button' class='ef-copy' data-target='{pid}' onclick='efCopy(this)'>copy</button>"
                     f"<pre class='ef-snippet' id='{pid}'>{esc(a.snippet)}</pre></div>")
    if v.todo and v.level != "PROBLEM":
        parts.append(todo)
    items = "".join(
        f"<li><b style='color:{_SEVERITY_COLOUR.get(f.severity, '#000')}'>{esc(f.severity)}</b> "
        f"<code>{esc(f.code)}</code>: {esc(f.message)}</li>" for f in by_severity(result.findings))
    if items:
        parts.append(f"<details open><summary><b>Findings</b> (most severe first)</summary><ul>{items}</ul></details>")
    markup = (f"<div class='ef-verdict ef-level-{esc(v.level)}' style='border-left:8px solid {colour};"
              f"padding:0.4em 1em;background:#f7f7f7'>{''.join(parts)}</div>")
    plain = "\n".join(["VERDICT: " + v.line] + [f"{a.engine}: {a.snippet}" for a in v.actions]
                      + [f"- {t}" for t in v.todo])
    html(_assets() + markup, plain, {SUMMARY_KEY: notebook_summary(result, params)})


class VerdictNotOK(RuntimeError):
    """Raised by a strict notebook's last cell when the verdict is not OK, so papermill exits non-zero."""


def strict_check(result: AlignmentResult, strict: bool) -> None:
    """With ``strict``, fail with the verdict's one line unless the verdict is OK (the notebook's last cell)."""
    if strict and result.level != "OK":
        raise VerdictNotOK(result.verdict)


def _cell(value: Any, precision: int) -> str:
    """One table cell for people: '-' for missing, yes/no, floats at ``precision`` (tiny/huge in e-notation)."""
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return "yes" if value else "no"
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        x = float(value)
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 10 ** -precision):
            return f"{x:.3e}"
        return f"{x:.{precision}f}"
    try:
        import pandas as pd

        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return str(value)


def table(df: pd.DataFrame, precision: int = 4, sortable: bool = True) -> None:
    """Display a DataFrame for people: no index, '-' for missing, wrapped text, ``precision`` decimals.

    Rendered by pandas (``to_html``, escaped) from cells formatted here; header clicks sort
    the rows (the page's inline script). The plain-text form is the same cells, for terminals.
    """
    import pandas as pd

    shown = df.reset_index(drop=df.index.name is None and not isinstance(df.index, pd.MultiIndex))
    shown = pd.DataFrame({str(c): [_cell(v, precision) for v in shown[c].tolist()] for c in shown.columns},
                         columns=[str(c) for c in shown.columns])
    with pd.option_context("display.max_colwidth", None):
        markup = shown.to_html(index=False, escape=True, border=0, classes="ef-table", na_rep="-")
        plain = shown.to_string(index=False)
    if sortable:
        markup = markup.replace("<th>", "<th class='ef-sort' onclick='efSort(this)'>")
    html(_assets() + markup, plain)


def target_label(result: AlignmentResult, engine: str) -> str:
    """The engine rule that applies: the serving check's (model type and version picked it), else ``engine``'s."""
    if result.serving is not None and result.serving.engine == engine:
        return result.serving.target
    return engine


def engine_advice(result: AlignmentResult, engine: str) -> str:
    """One sentence: the id list ``engine`` needs and where it reads it, or why none works."""
    from ..engines.rules import ALL_TARGETS

    label = target_label(result, engine)
    target = next((t for t in ALL_TARGETS if t.label == label), None)
    if not result.engine_ids:
        return f"{label}: the record has no aux slots, so no id list applies."
    if label not in result.engine_ids and result.serving is not None and result.serving.fix_ids is not None:
        return f"{label}: set {result.serving.fix_key} = {result.serving.fix_ids}."
    ids = result.engine_ids.get(label)
    if ids is None:
        return f"{label}: no id list captures these slots ({'; '.join(result.engine_notes.get(label, []))})."
    return f"{label} ({target.description if target else label}): set {target.id_key if target else 'ids'} = {ids}."


def mapping_table(result: AlignmentResult) -> pd.DataFrame:
    """Slot -> position table (score, margin, confident, what the position holds)."""
    df = result.table()
    df["best candidate"] = [m.best.label if m.best is not None else None for m in result.matches]
    return df


def engine_table(result: AlignmentResult, engine: str | None = None) -> pd.DataFrame:
    """The id list each engine needs (``eagle_aux_hidden_state_layer_ids``), with the key it reads."""
    import pandas as pd

    from ..engines.rules import ENGINE_TARGETS

    label = None if engine is None else target_label(result, engine)
    rows = [{"engine": t.label, "ids": "none works" if result.engine_ids.get(t.label) is None
             else str(result.engine_ids[t.label]), "reads": t.id_key,
             "notes": "; ".join(result.engine_notes.get(t.label, []))}
            for t in ENGINE_TARGETS if t.label in result.engine_ids and (label is None or t.label == label)]
    return pd.DataFrame(rows, columns=["engine", "ids", "reads", "notes"])


def findings(result: AlignmentResult) -> None:
    """The findings in words, most severe first."""
    order = {"error": 0, "warning": 1, "info": 2}
    items = "".join(
        f"<li><b style='color:{_SEVERITY_COLOUR.get(f.severity, '#000')}'>{esc(f.severity)}</b> "
        f"<code>{esc(f.code)}</code>: {esc(f.message)}</li>"
        for f in sorted(result.findings, key=lambda f: order.get(f.severity, 3)))
    html(f"<ul>{items}</ul>" if items else "<p>No findings.</p>",
         "\n".join(f"[{f.severity}] {f.code}: {f.message}" for f in result.findings))


_STATUS = {"match": ("MATCH", "#1a9850", "the engine feeds the drafter the states it was trained on"),
           "mismatch": ("MISMATCH", "#d73027", "the engine will feed the drafter other states than it was trained on"),
           "cannot-judge": ("CANNOT JUDGE", "#e08214", "")}


def serving(result: AlignmentResult) -> None:
    """The "Serving" section (only with an engine): served vs trained positions per aux slot, the fix to paste."""
    from itertools import zip_longest

    check = result.serving
    if check is None:
        return
    word, colour, meaning = _STATUS.get(check.status, (check.status.upper(), "#000", ""))
    if check.status == "cannot-judge":
        meaning = next((f.message for f in check.findings
                        if f.code in ("serving-unjudged", "num-layers-disagree")), "")
    version = f" {check.version}" if check.version else ""
    info = [("engine", f"{check.engine}{version} (rule {check.target}, N={check.num_layers})"),
            ("draft config", check.draft_path or "none given: the engine's default ids"),
            ("ids used", f"{check.ids_used} (read from {check.key_read or 'nowhere: engine default'})")]
    slots = [m.name for m in result.matches if m.role == "aux"]
    trained = check.positions_trained or []
    rows = "".join(
        f"<tr><td>{esc(name or '-')}</td><td>{esc(s.label if s else '-')}</td><td>{esc(t.label if t else '-')}</td>"
        f"<td>{'yes' if s is not None and s == t else '<b>no</b>'}</td></tr>"
        for name, s, t in zip_longest(slots, check.positions_served, trained))
    parts = [f"<h2>Serving</h2><p style='font-size:1.1em'><b style='color:{colour}'>{word}</b>: {esc(meaning)}</p>",
             f"<table>{_rows(info)}</table>",
             "<table><tr><th>aux slot</th><th>engine captures</th><th>training holds</th><th>same</th></tr>"
             f"{rows}</table>"]
    if check.fix_snippet is not None:
        where = check.to_dict()["fix"]["where"]
        parts.append(f"<p>Set <code>{esc(check.fix_key)}</code> = {esc(check.fix_ids)} in {esc(where)}:</p>"
                     f"<pre class='ef-fix' style='background:#f4f4f4;border:1px solid #ddd;padding:0.5em'>"
                     f"{esc(check.fix_snippet)}</pre>")
    elif check.status == "mismatch":
        parts.append("<p>No id list on this engine captures the trained positions.</p>")
    if check.fix_notes:
        parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in check.fix_notes) + "</ul>")
    html("".join(parts), check.to_text())


def runs_header(params: RunsParams) -> None:
    """Title and the log behind each run label, escaped."""
    pairs = [(f"run {label}" + (" (baseline)" if label == params.baseline else ""), path)
             for label, path in params.logs.items()]
    html(f"<h1>{esc(params.heading)}</h1><table>{_rows(pairs)}</table>", params.heading)


def runs_verdict(summary: pd.DataFrame, params: RunsParams) -> None:
    """The runs' one-sentence verdict, carrying the recorded runs summary in its output metadata (the glue)."""
    from .runs import runs_summary

    record = runs_summary(summary, params)
    markup = (f"<div class='ef-verdict' style='border-left:6px solid #4575b4;padding:0.4em 1em;background:#f7f7f7'>"
              f"<p style='font-size:1.15em'><b>Verdict:</b> {esc(record['verdict'])}</p></div>")
    html(markup, "VERDICT: " + record["verdict"], {SUMMARY_KEY: record})


def doctor_header(params: DoctorParams) -> None:
    """Title and the doctor's inputs, escaped."""
    pairs = [(k.replace("_", " "), v) for k, v in params.inputs.given().items()]
    html(f"<h1>{esc(params.heading)}</h1><table>{_rows(pairs)}</table>", params.heading)


def doctor_verdict(report: DoctorReport, params: DoctorParams | None = None) -> None:
    """The doctor's verdict and what to do, most costly first; carries the doctor's JSON in its output metadata."""
    from .doctorreport import doctor_summary

    colour = LEVEL_COLOUR.get(report.level, "#000")
    parts = [f"<p style='font-size:1.2em;margin:0.2em 0'><b style='color:{colour}'>Verdict: {esc(report.level)}</b> "
             f"{esc(report.summary)}</p>"]
    if report.todo:
        parts.append("<p><b>What to do</b> (most costly first)</p><ol>"
                     + "".join(f"<li>{esc(t)}</li>" for t in report.todo) + "</ol>")
    markup = (f"<div class='ef-verdict ef-level-{esc(report.level)}' style='border-left:8px solid {colour};"
              f"padding:0.4em 1em;background:#f7f7f7'>{''.join(parts)}</div>")
    plain = "\n".join(["VERDICT: " + report.verdict] + [f"- {t}" for t in report.todo])
    html(_assets() + markup, plain, {SUMMARY_KEY: doctor_summary(report, params)})


def doctor_checks(report: DoctorReport) -> None:
    """The causes (one row per root cause, its codes beneath), then one row per check, most severe first: found /
    clean / not run and why (escaped by pandas)."""
    from .doctorreport import causes_table, checks_table

    if report.causes:
        table(causes_table(report))
    table(checks_table(report))
