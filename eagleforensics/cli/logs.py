"""``eagleforensics logs``: compare runs by the acceptance and throughput their server logs report."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from ..errors import ForensicsError, printable
from .common import echo_text, run_guarded

if TYPE_CHECKING:  # pragma: no cover
    from ..report.pipeline import ReportOutcome


def _table(records: list[dict]) -> str:
    """The summary rows as the aligned text table the command prints."""
    import pandas as pd

    from ..engines.logs import ARGS_COLUMNS, SUMMARY_COLUMNS

    measured = [c for c in SUMMARY_COLUMNS[3:] if c not in ARGS_COLUMNS]
    df = pd.DataFrame(records, columns=SUMMARY_COLUMNS).astype({c: "float64" for c in measured})
    df["run"] = df["run"].map(printable)  # labels come from the command line: one row stays one line
    df["algorithm"] = df["algorithm"].map(lambda a: "n/a" if a is None else printable(a))
    for col in ARGS_COLUMNS[1:]:
        df[col] = df[col].map(lambda v: "n/a" if v is None or v != v else str(int(v)))
    return df.to_string(index=False, na_rep="n/a", float_format=lambda v: f"{v:.3f}")


@click.command("logs")
@click.argument("runs", nargs=-1, required=True, metavar="[LABEL=]PATH...")
@click.option("--baseline", metavar="LABEL", default=None,
              help="Run whose median tok/s the others are divided by (speedup column).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@click.option("--report", "report_path", metavar="OUT.html", is_flag=False, flag_value="", default=None,
              help="Also write the runs report (notebooks/runs.ipynb) as one offline HTML file; "
                   "a bare --report (last) writes reports/runs-<labels>.html.")
@click.option("--title", default=None, help="Report title; default 'Runs: <labels>'.")
@click.option("--with-input", is_flag=True, help="Keep the notebook's code cells in the report.")
@click.option("--keep-notebook", is_flag=True, help="Also write the executed notebook beside the report (.ipynb).")
def logs(runs: tuple[str, ...], baseline: str | None, as_json: bool, report_path: str | None, title: str | None,
         with_input: bool, keep_notebook: bool) -> None:
    """Summarise SGLang/vLLM server logs per run: median accept length, accept rate, tok/s, speed-up.

    Each RUN is LABEL=PATH, e.g. ``baseline=base.log broken=eagle.log fixed=eagle_fixed.log``, or a
    bare PATH labelled by its file name (``runs/fixed.log.gz`` -> ``fixed``). Only the engines'
    decode/metrics lines count; the server's arguments line gives each run's algorithm, steps, topk
    and draft tokens (JSON: ``server_args``). A log with the arguments line but no statistics yet
    (a server just started) gets a note saying when the engine prints them.
    With --report, the same numbers go into an HTML page with accept length and tok/s over time.
    Exit 0: done. 1: a run has no statistics yet (see its note). 2: bad input. 3: the report notebook crashed.
    """

    def body() -> tuple[dict, ReportOutcome | None]:
        from ..report.runs import (
            build_runs_report,
            load_runs,
            parse_runs,
            runs_summary,
            summarize,
            validate_params,
        )

        mapping = parse_runs(runs)
        if baseline is not None and baseline not in mapping:
            raise ForensicsError(f"--baseline {baseline!r} is not one of the run labels: {', '.join(mapping)}")
        if report_path is None:
            params = validate_params(mapping, baseline, title)
            return runs_summary(summarize(load_runs(params, allow_waiting=True), params), params), None
        if report_path and not report_path.lower().endswith((".html", ".htm")):
            raise ForensicsError(f"--report expects an .html file name, got {report_path!r} "
                                 "(a bare --report goes after the logs)")
        outcome = build_runs_report(mapping, report_path or None, baseline=baseline, title=title,
                                    with_input=with_input, keep_notebook=keep_notebook)
        return outcome.summary, outcome

    summary, outcome = run_guarded(body)
    records = summary["runs"]
    from ..engines.logs import SUMMARY_COLUMNS

    keys = [*SUMMARY_COLUMNS, "server_args", "note"]
    if as_json:
        echo_text(json.dumps([{k: r.get(k) for k in keys} for r in records], indent=2, default=str))
    else:
        echo_text(_table(records))
    notes = [f"{printable(r['run'])}: {printable(r['note'])}" for r in records if r.get("note")]
    for line in notes:  # on stderr with --json, so stdout stays one JSON document
        echo_text(line, err=as_json)
    for note in summary.get("notes", []):  # why a speed-up is n/a; on stderr with --json (stdout stays one document)
        echo_text(f"note: {printable(note)}", err=as_json)
    if outcome is not None:  # on stderr with --json, so stdout stays one JSON document
        for line in (f"VERDICT: {outcome.verdict}", f"report: {printable(outcome.html)}",
                     *([f"notebook: {printable(outcome.notebook)}"] if outcome.notebook is not None else [])):
            echo_text(line, err=as_json)
    if notes:
        sys.exit(1)
