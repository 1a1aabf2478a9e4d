"""The plan report: labelled server logs (and a replay JSON) -> the predicted tok/s curve with the measured runs on it.

Parameters are checked here before any kernel starts; ``build_plan_report`` runs
``notebooks/plan.ipynb`` through the align report's papermill -> nbconvert pipeline
(``pipeline.render``). The notebook records the plan's JSON (``PlanReport.to_dict``, schema
``plan.SCHEMA``) in its verdict output's metadata; the display helpers below are what its cells
call, so the notebook stays a list of calls.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ForensicsError
from ..io import physical
from .pipeline import ReportOutcome, find_notebook, input_path, render, safe_stem

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..serving.roundcost import RoundConfig
    from ..plan import PlanReport

NOTEBOOK = "plan.ipynb"
_INCIDENT = Path(__file__).resolve().parents[2] / "data_samples" / "incident"
DEMO = {"logs": {"baseline": "baseline.log", "tuned": "tuned.log", "tuned_3steps": "tuned_3steps.log"},
        "baseline": "baseline", "served": "tuned", "replay": "replay_fixed.json"}


def parse_launch(text: str) -> RoundConfig:
    """``3`` or ``5,4,8`` (steps[,topk[,draft tokens]]) -> RoundConfig; a bad one is a ForensicsError."""
    from ..serving.roundcost import RoundConfig

    parts = [p.strip() for p in str(text).split(",")]
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ForensicsError(f"launch {text!r}: expected STEPS[,TOPK[,DRAFT_TOKENS]], e.g. 3 or 5,4,8")
    steps, topk = int(parts[0]), int(parts[1]) if len(parts) > 1 else 1
    tokens = int(parts[2]) if len(parts) > 2 else None
    if topk > 1 and tokens is None:
        raise ForensicsError(f"launch {text!r}: a tree (topk > 1) needs its draft tokens: STEPS,TOPK,DRAFT_TOKENS")
    why = physical.steps_problem(steps)
    if why:
        raise ForensicsError(f"launch {text!r}: {why}")
    return RoundConfig(steps, topk, tokens)


@dataclass(frozen=True)
class PlanParams:
    """The plan notebook's parameters after validation (absolute paths, checked numbers)."""

    logs: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    served: str | None = None
    replay: str | None = None
    wiring: str | None = None
    verify_share: float | None = None
    launch: dict[str, str] = field(default_factory=dict)
    title: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"logs": dict(self.logs), "baseline": self.baseline, "served": self.served, "replay": self.replay,
                "wiring": self.wiring, "verify_share": self.verify_share, "launch": dict(self.launch),
                "title": self.title}

    @property
    def heading(self) -> str:
        return self.title or f"Plan: {', '.join(self.logs)}"

    def inputs(self) -> Any:
        from ..plan import PlanInputs

        return PlanInputs(self.logs, baseline=self.baseline, served=self.served, replay=self.replay,
                          wiring=self.wiring, verify_share=self.verify_share,
                          launch={k: parse_launch(v) for k, v in self.launch.items()})


def _label(value: Any, name: str, labels: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in labels:
        raise ForensicsError(f"parameter {name} {value!r} is not one of the run labels: {', '.join(labels)}")
    return value


def validate_params(logs: Any = None, baseline: Any = None, served: Any = None, replay: Any = None,
                    wiring: Any = None, verify_share: Any = None, launch: Any = None, title: Any = None) -> PlanParams:
    """Check the plan parameters before any log is read; ``logs`` None selects the README's incident (after tuning)."""
    from .runs import _logs_mapping

    if logs is None:
        if not _INCIDENT.is_dir():
            raise ForensicsError("parameter logs is required (no data_samples/incident next to this installation)")
        logs = {k: str(_INCIDENT / v) for k, v in DEMO["logs"].items()}
        baseline = DEMO["baseline"] if baseline is None else baseline
        served = DEMO["served"] if served is None else served
        replay = str(_INCIDENT / DEMO["replay"]) if replay is None else replay
    mapping = _logs_mapping(logs)
    if not mapping:
        raise ForensicsError("parameter logs names no run; give at least one label=path")
    paths = {label: input_path(path, f"logs[{label!r}]", want_file=True) for label, path in mapping.items()}
    labels = list(paths)
    share = None
    if verify_share is not None:
        if isinstance(verify_share, bool) or not isinstance(verify_share, (int, float)) or \
                not 0.0 < float(verify_share) < 1.0:
            raise ForensicsError(f"parameter verify_share must be a fraction between 0 and 1, got {verify_share!r}")
        share = float(verify_share)
    launch_map: dict[str, str] = {}
    if launch is not None:
        if not isinstance(launch, Mapping):
            raise ForensicsError(f"parameter launch must be a dict label -> 'steps[,topk,draft_tokens]', got {launch!r}")
        for k, v in launch.items():
            _label(k, "launch", labels)
            parse_launch(str(v))
            launch_map[str(k)] = str(v)
    for name, value in (("wiring", wiring), ("title", title)):
        if value is not None and not isinstance(value, str):
            raise ForensicsError(f"parameter {name} must be a string or None, got {value!r}")
    return PlanParams(paths, _label(baseline, "baseline", labels), _label(served, "served", labels),
                      None if replay is None else input_path(replay, "replay", want_file=True), wiring, share,
                      launch_map, title)


def run_plan(params: PlanParams) -> PlanReport:
    """The plan for validated parameters."""
    from ..plan import make_plan

    return make_plan(params.inputs())


def summary(rep: PlanReport, params: PlanParams) -> dict[str, Any]:
    """What the notebook records: the plan's JSON object plus the parameters."""
    return {**rep.to_dict(), "parameters": params.as_dict()}


# --- what the notebook displays --------------------------------------------------------------------

def show_header(params: PlanParams) -> None:
    from . import nbview
    from .plots import esc

    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{esc(k)}</th><td>{esc(v)}</td></tr>"
                   for k, v in [*((f"run {label}", path) for label, path in params.logs.items()),
                                ("replay", params.replay or "-"),
                                ("verify share", params.verify_share if params.verify_share is not None else "-")])
    nbview.html(f"<h1>{esc(params.heading)}</h1><table>{rows}</table>", params.heading)


def show_verdict(rep: PlanReport, params: PlanParams) -> None:
    """The verdict line and what to do, carrying the recorded summary in the output's metadata (the glue)."""
    from . import nbview
    from .pipeline import SUMMARY_KEY
    from .plots import esc

    record = summary(rep, params)
    colour = "#e08214" if rep.exit_code else "#1a9850"
    todo = "".join(f"<li>{esc(t)}</li>" for t in rep.todo)
    markup = (f"<div class='ef-verdict' style='border-left:6px solid {colour};padding:0.4em 1em;background:#f7f7f7'>"
              f"<p style='font-size:1.15em'><b>Verdict:</b> {esc(rep.verdict)}</p>"
              + (f"<p><b>What to do</b></p><ul>{todo}</ul>" if todo else "") + "</div>")
    nbview.html(markup, "VERDICT: " + rep.verdict, {SUMMARY_KEY: record})


def _fmt(point: float | None, lo: float | None, hi: float | None, spec: str, scale: float = 1.0) -> str:
    if point is None or not math.isfinite(point):
        return "-"
    text = f"{scale * point:{spec}}"
    if lo is not None and hi is not None and (hi - lo) * scale > 0.005 * max(abs(scale * point), 1e-9):
        text += f" [{scale * lo:{spec}} - {scale * hi:{spec}}]"
    return text


def predictions_table(rep: PlanReport, chain: bool = True) -> pd.DataFrame:
    """The predictions as text cells (pandas escapes them in HTML): chains, or the configurations with topk > 1."""
    import pandas as pd

    best = rep.best
    best_tok = best.tok_s if best is not None else None
    rows = []
    for p in rep.predictions:
        if p.config.chain != chain:
            continue
        mark = ("served " if p.config == rep.served.config else "") + ("best" if best is not None and p is best else "")
        rows.append({
            "steps": p.config.steps, "topk": p.config.topk, "draft tokens": p.config.verified,
            "round ms": _fmt(p.round_s, p.round_lo, p.round_hi, ".2f", 1e3),
            "accept length": _fmt(p.accept, p.accept_lo, p.accept_hi, ".2f") if p.accept is not None else
            (f"needs >= {p.break_even(best_tok):.2f}" if best_tok else "-"),
            "from": p.accept_how or "-", "tok/s": _fmt(p.tok_s, p.tok_lo, p.tok_hi, ".1f"),
            "speed-up": "-" if p.speedup is None else f"{p.speedup:.2f}x",
            "measured tok/s": "-" if p.measured_tok_s is None else f"{p.measured_tok_s:.1f} ({p.measured_by})",
            "": mark.strip()})
    return pd.DataFrame(rows)


def runs_table(rep: PlanReport) -> pd.DataFrame:
    import pandas as pd

    def f(x: float, spec: str) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x:{spec}}"

    return pd.DataFrame([{
        "run": r.label, "role": r.role, "engine": r.engine or "?", "launch": r.launch_text, "lines": r.lines,
        "accept length": f(r.accept_length, ".3f"), "tok/s": f(r.tok_s, ".1f"),
        "round ms": f(1e3 * r.round_s, ".2f") if r.speculative and math.isfinite(r.accept_length) else "-",
        "note": r.note or ""} for r in rep.runs])


def show_costs(rep: PlanReport) -> None:
    from . import nbview
    from .plots import esc
    from ..serving.roundcost import ASSUMPTIONS

    fit = rep.fit
    items = []
    for i, (name, desc) in enumerate((("V", "verify pass of one token"), ("v", "each further verified token"),
                                      ("d", "one draft step"))):
        p = fit.param(i)
        span = "" if p["pinned"] else f" (not pinned: {p['lo']:.2f} - {p['hi']:.2f})"
        se = f" ± {p['se']:.2f}" if p["pinned"] and p["se"] is not None else ""
        items.append(f"<li><b>{name}</b> = {p['point']:.2f} ms{se}{span}: {esc(desc)}</li>")
    assumed = "".join(f"<li><code>{esc(c)}</code>: {esc(ASSUMPTIONS[c])}</li>" for c in fit.assumptions)
    notes = "".join(f"<li>{esc(n)}</li>" for n in fit.notes)
    nbview.html("<p>round = V + v (M - 1) + d k</p><ul>" + "".join(items) + "</ul>"
                + (f"<p>Assumed where the runs leave a cost open:</p><ul>{assumed}</ul>" if assumed else
                   "<p>Every cost is pinned by the runs.</p>") + (f"<ul>{notes}</ul>" if notes else ""),
                "\n".join(fit.assumptions))


def show_findings(rep: PlanReport) -> None:
    from . import nbview
    from .nbview import _SEVERITY_COLOUR
    from .plots import esc

    if not rep.findings:
        nbview.html("<p>No findings.</p>", "no findings")
        return
    items = "".join(f"<li><span style='color:{_SEVERITY_COLOUR.get(f.severity, '#333')}'>[{esc(f.severity)}]</span> "
                    f"<code>{esc(f.code)}</code>: {esc(f.message)}"
                    + (f"<br><i>fix:</i> {esc(f.fix)}" if f.fix else "")
                    + (f"<br><i>source:</i> {esc(f.source)}" if f.source else "") + "</li>" for f in rep.findings)
    nbview.html(f"<ul>{items}</ul>", "\n".join(f"[{f.severity}] {f.code}: {f.message}" for f in rep.findings))


def show_gap(rep: PlanReport) -> None:
    from . import nbview
    from .plots import esc

    if rep.gap is None:
        nbview.html(f"<p>Not tested: {esc(rep.gap_note or 'no replay JSON given (--replay)')}.</p>", "gap not tested")
        return
    g = rep.gap
    text = (f"Measured accept length {g.measured:.2f} against replay's {g.expected:.2f} for {rep.gap_wiring} "
            f"({rep.gap_note}): gap {g.gap:+.2f}, bar {g.bar:.2f} (the larger of {g.floor:g} and 3 standard errors, "
            f"{g.noise_bar:.2f}). " + ("A serving gap: the loss is in the serving path." if g.found else
                                       "No serving gap."))
    rows = ""
    if g.found:
        rows = "<table><tr><th>suspect</th><th>this run</th><th>try</th><th>sources</th></tr>" + "".join(
            f"<tr><td>{esc(m.suspect.code)} ({esc(m.status)})</td><td>{esc(m.this_run)}</td>"
            f"<td>{esc(m.suspect.try_)}</td><td>{esc(', '.join(m.suspect.sources))}</td></tr>" for m in rep.suspects) \
            + "</table>"
    nbview.html(f"<p>{esc(text)}</p>{rows}", text)


def default_output(params: PlanParams, cwd: Path | None = None) -> Path:
    """``reports/plan-<labels>.html`` under the current directory: never beside the logs."""
    return (cwd or Path.cwd()) / "reports" / f"plan-{safe_stem('-'.join(params.logs), 'logs')}.html"


def build_plan_report(logs: Any, out: str | os.PathLike[str] | None = None, *, baseline: str | None = None,
                      served: str | None = None, replay: str | None = None, wiring: str | None = None,
                      verify_share: float | None = None, launch: Mapping[str, str] | None = None,
                      title: str | None = None, with_input: bool = False, keep_notebook: bool = False,
                      notebook: str | os.PathLike[str] | None = None) -> ReportOutcome:
    """Validate, execute plan.ipynb, write one offline HTML file (the align report's pipeline)."""
    from ..plan import SCHEMA

    params = validate_params(logs, baseline, served, replay, wiring, verify_share, launch, title)
    html_path = Path(out) if out is not None else default_output(params)
    source = Path(notebook) if notebook is not None else find_notebook(NOTEBOOK)
    inputs = [*params.logs.values(), *([params.replay] if params.replay else [])]
    roles = [(f"log {label}", path) for label, path in params.logs.items()] + \
        ([("replay JSON", params.replay)] if params.replay else [])
    return render(source, params.as_dict(), html_path, schema=SCHEMA, heading=params.heading, inputs=inputs,
                  with_input=with_input, keep_notebook=keep_notebook, roles=roles)
