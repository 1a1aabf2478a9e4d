"""``eagleforensics plan``: from measured runs, the tok/s of every step count, the best one, and the serving gap."""
from __future__ import annotations

import sys

import click

from ..errors import ForensicsError, printable
from .common import echo_text, run_guarded


@click.command("plan")
@click.argument("runs", nargs=-1, required=True, metavar="[LABEL=]PATH...")
@click.option("--baseline", metavar="LABEL", default=None,
              help="The run without speculation (default: the run whose arguments line has no speculative algorithm).")
@click.option("--served", metavar="LABEL", default=None, help="The run to plan for (default: the last speculative run).")
@click.option("--replay", "replay_json", type=click.Path(), default=None,
              help="`eagleforensics replay --json` output: accept length per step count for the wiring the engine "
                   "feeds, and the serving-gap test.")
@click.option("--wiring", metavar="LABEL", default=None,
              help="The replay wiring the engine feeds (default: the one replay names for the served engine, else the "
                   "trained one).")
@click.option("--verify-share", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=None,
              help="From a profile: the verify pass's share of a served round (e.g. 0.95); pins the draft step's cost.")
@click.option("--launch", "launches", multiple=True, metavar="LABEL=STEPS[,TOPK,DRAFT_TOKENS]",
              help="A run's launch when its log has no arguments line (repeatable).")
@click.option("--max-steps", type=click.IntRange(1, 32), default=8, show_default=True)
@click.option("--max-topk", type=click.IntRange(1, 32), default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema eagleforensics-plan-v1).")
@click.option("--report", "report_path", metavar="OUT.html", is_flag=False, flag_value="", default=None,
              help="Also write the plan report (notebooks/plan.ipynb) as one offline HTML file; a bare --report (last) "
                   "writes reports/plan-<labels>.html.")
@click.option("--title", default=None, help="Report title; default 'Plan: <labels>'.")
def plan(runs: tuple[str, ...], baseline: str | None, served: str | None, replay_json: str | None,
         wiring: str | None, verify_share: float | None, launches: tuple[str, ...], max_steps: int, max_topk: int,
         as_json: bool, report_path: str | None, title: str | None) -> None:
    """Fit what a speculative round costs from server logs and predict tok/s for every step count and topk.

    Each run is LABEL=PATH or PATH (label: the file name), e.g. ``baseline.log eagle_3steps.log``.
    Steps, topk and draft tokens come from each log's arguments line; accept length and tok/s from
    its decode / metrics lines. With --replay, replay's reach@k gives the accept length of every
    step count and a serving gap is tested. Where the runs leave a cost open, the answer says which
    assumption it used and the range it leaves.

    Exit 0: nothing to do. 1: something to do (a faster configuration than the served one, a
    serving gap, a costly wiring, speculation slower than the baseline, a pick that needs one more
    run). 2: bad input. 3: internal error (or the report notebook crashed).
    """

    def body():  # type: ignore[no-untyped-def]
        from ..plan import PlanInputs
        from ..plan import make_plan
        from ..report.plan import parse_launch
        from ..report.runs import parse_runs

        mapping = parse_runs(runs)
        launch = {}
        for item in launches:
            label, sep, spec = item.partition("=")
            if not sep or not label.strip():
                raise ForensicsError(f"--launch expects LABEL=STEPS[,TOPK,DRAFT_TOKENS], got {item!r}")
            launch[label.strip()] = spec.strip()
        inputs = PlanInputs(mapping, baseline=baseline, served=served, replay=replay_json, wiring=wiring,
                            verify_share=verify_share, launch={k: parse_launch(v) for k, v in launch.items()},
                            max_steps=max_steps, max_topk=max_topk)
        rep = make_plan(inputs)
        outcome = None
        if report_path is not None:
            if report_path and not report_path.lower().endswith((".html", ".htm")):
                raise ForensicsError(f"--report expects an .html file name, got {report_path!r} "
                                     "(a bare --report goes after the logs)")
            from ..report.plan import build_plan_report

            outcome = build_plan_report(mapping, report_path or None, baseline=baseline, served=served,
                                        replay=replay_json, wiring=wiring, verify_share=verify_share, launch=launch,
                                        title=title)
        return rep, outcome

    rep, outcome = run_guarded(body)
    echo_text(rep.to_json() if as_json else rep.to_text())
    if outcome is not None:  # on stderr with --json, so stdout stays one JSON document
        echo_text(f"report: {printable(outcome.html)}", err=as_json)
    sys.exit(rep.exit_code)
