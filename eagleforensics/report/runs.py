"""The runs report: labelled server logs -> accept length and tok/s per run, speed-up over a baseline, one HTML page.

Parameters are checked here before any kernel starts; ``build_runs_report`` then runs
``notebooks/runs.ipynb`` through the same papermill -> nbconvert pipeline as the align report
(``report.render``). The notebook records ``runs_summary`` (schema ``RUNS_SCHEMA``) in its
verdict output's metadata: per run the median accept length, accept rate and tok/s and the
speed-up over the baseline (``logs.summarize_runs``), each run's launch arguments as its log
states them (``server_args``, from ``engines.serverargs``), the one-sentence verdict, the parameters.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..errors import ForensicsError
from .pipeline import ReportOutcome, find_notebook, input_path, render, safe_stem

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

RUNS_SCHEMA = "eagleforensics-runs-summary-v1"
NOTEBOOK = "runs.ipynb"
# The demo a source checkout runs when no logs are given: the three SGLang fixture logs.
_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "logs"
DEMO_LOGS = {"baseline": "sglang_0.4_baseline.log", "broken": "sglang_0.5.5_broken.log",
             "fixed": "sglang_0.5.23_fixed.log"}
DEMO_BASELINE = "baseline"


@dataclass(frozen=True)
class RunsParams:
    """The runs notebook's parameters after validation: label -> absolute log path (given order), baseline, title."""

    logs: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    title: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"logs": dict(self.logs), "baseline": self.baseline, "title": self.title}

    @property
    def heading(self) -> str:
        """The report's title: the given one, else ``Runs: a, b, c``."""
        return self.title or f"Runs: {', '.join(self.logs)}"


def parse_runs(pairs: Iterable[str]) -> dict[str, str]:
    """``["fixed=a.log", "b.log"]`` -> ``{"fixed": "a.log", "b": "b.log"}``, in order; bad or repeated labels fail.

    A bare PATH (no ``=``) takes its file name as label (``runs/fixed.log.gz`` -> ``fixed``).
    """
    from ..engines.logs import default_label

    runs: dict[str, str] = {}
    for pair in pairs:
        label, sep, path = str(pair).partition("=")
        label, path = label.strip(), path.strip()
        if not sep:
            label, path = default_label(label), label
        if not label or not path:
            raise ForensicsError(f"expected LABEL=PATH or PATH, got {pair!r}")
        if label in runs:
            raise ForensicsError(f"run label {label!r} given twice" + ("" if sep else " (two files of that name: "
                                                                      "give LABEL=PATH)"))
        runs[label] = path
    return runs


def _logs_mapping(logs: Any) -> dict[str, Any]:
    """The ``logs`` parameter as label -> path: a dict, or a ``"label=path,label=path"`` string."""
    if isinstance(logs, str):
        return parse_runs(part for part in logs.split(",") if part.strip())
    if isinstance(logs, Mapping):
        for label in logs:
            if not isinstance(label, str) or not label.strip():
                raise ForensicsError(f"parameter logs: run labels must be non-empty strings, got {label!r}")
        return {label.strip(): path for label, path in logs.items()}
    raise ForensicsError("parameter logs must be a dict label -> path or a 'label=path,label=path' string, "
                         f"got {type(logs).__name__} {logs!r}")


def demo_logs() -> dict[str, str]:
    """The bundled demo runs (baseline, broken, fixed SGLang logs) of a source checkout."""
    found = {label: _FIXTURES / name for label, name in DEMO_LOGS.items()}
    if not all(p.is_file() for p in found.values()):
        raise ForensicsError("parameter logs is required (no tests/fixtures/logs next to this installation)")
    return {label: str(p) for label, p in found.items()}


def validate_params(logs: Any = None, baseline: Any = None, title: Any = None) -> RunsParams:
    """Check the runs parameters before any log is read; a bad one is a one-line ForensicsError.

    ``logs`` None selects the demo (three SGLang fixture logs, baseline ``baseline``).
    """
    if logs is None:
        logs, baseline = demo_logs(), DEMO_BASELINE if baseline is None else baseline
    mapping = _logs_mapping(logs)
    if not mapping:
        raise ForensicsError("parameter logs names no run; give at least one label=path")
    paths = {label: input_path(path, f"logs[{label!r}]", want_file=True) for label, path in mapping.items()}
    if baseline is not None and (not isinstance(baseline, str) or baseline not in paths):
        raise ForensicsError(f"parameter baseline {baseline!r} is not one of the run labels: {', '.join(paths)}")
    if title is not None and not isinstance(title, str):
        raise ForensicsError(f"parameter title must be a string or None, got {type(title).__name__} {title!r}")
    return RunsParams(paths, baseline, title)


def load_runs(params: RunsParams, allow_waiting: bool = False) -> pd.DataFrame:
    """Every data line of every log (``logs.parse_logs``); a log without one names the file and why.

    A log with the server's arguments line but no decode or metrics line yet (a server just
    started) says so (``logs.waiting_message``); with ``allow_waiting`` such a run is kept (no
    rows) for the caller to report instead. A log with neither is bad input.
    """
    from ..engines.logs import parse_logs, waiting_message

    df = parse_logs(params.logs)
    by_run = df.attrs.get("server_args_by_run", {})
    for label in df.attrs.get("empty_runs", []):
        args = by_run.get(label)
        if args is None:
            raise ForensicsError("no SGLang 'Decode batch' or vLLM metrics line found (is this the server log?)",
                                 path=params.logs[label])
        if not allow_waiting:
            raise ForensicsError(waiting_message(args), path=params.logs[label])
    return df


def waiting_notes(summary: pd.DataFrame) -> dict[str, str]:
    """Run label -> the 'server started ...; no statistics yet' note, for runs with no data line but launch arguments."""
    from ..engines.logs import waiting_message

    by_run = summary.attrs.get("server_args_by_run", {})
    return {str(r["run"]): waiting_message(by_run[r["run"]]) for r in summary.to_dict(orient="records")
            if int(r["n_lines"]) == 0 and by_run.get(r["run"]) is not None}


def summarize(df: pd.DataFrame, params: RunsParams) -> pd.DataFrame:
    """One row per run: median accept length, accept rate, tok/s and the speed-up over the baseline."""
    from ..engines.logs import summarize_runs

    return summarize_runs(df, baseline=params.baseline)


def _num(value: Any) -> float | None:
    """A finite float, or None for NaN/missing (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _run_phrase(row: Mapping[str, Any], baseline: str | None) -> str:
    """``fixed: accept length 3.21, 150.6 tok/s, 1.67x the baseline``; the baseline's is its tok/s only."""
    parts = []
    is_base = row["run"] == baseline
    if _num(row["median_accept_length"]) is not None:
        parts.append(f"accept length {row['median_accept_length']:.2f}")
    elif not is_base:
        parts.append("no accept length logged")
    if _num(row["median_tok_s"]) is not None:
        parts.append(f"{row['median_tok_s']:.1f} tok/s")
    speedup = _num(row["speedup"])
    if not is_base and speedup is not None:
        parts.append(f"{speedup:.2f}x the baseline" + (" (slower)" if speedup < 1 else ""))
    name = str(row["run"]) if not is_base or row["run"] == "baseline" else f"{row['run']} (the baseline)"
    return f"{name}: {', '.join(parts) or 'no values'}"


def verdict_text(summary: pd.DataFrame, baseline: str | None) -> str:
    """One sentence: each run's accept length, tok/s and speed-up, fastest first, then the baseline's tok/s."""
    rows = summary.to_dict(orient="records")
    others = [r for r in rows if r["run"] != baseline]
    if baseline is not None:
        others.sort(key=lambda r: -(_num(r["speedup"]) if _num(r["speedup"]) is not None else -math.inf))
    phrases = [_run_phrase(r, baseline) for r in others]
    phrases += [_run_phrase(r, baseline) for r in rows if r["run"] == baseline]
    notes = [f" Note: {n}." for n in summary.attrs.get("notes", [])]  # why a speed-up is n/a
    return "; ".join(phrases) + "." + "".join(notes)


def runs_summary(summary: pd.DataFrame, params: RunsParams) -> dict[str, Any]:
    """What runs.ipynb records for tests and the CLI: per-run medians and speed-ups, the verdict, the parameters.

    Each run also carries ``server_args`` (the launch arguments its log states, ``ServerArgs.to_dict()``,
    or None) and ``note`` (why a run has no data line yet, or None); ``exit_code`` is 1 when a run
    has launch arguments but no statistics yet (send a longer request), else 0.
    """
    by_run = summary.attrs.get("server_args_by_run", {})
    notes = waiting_notes(summary)
    runs = [{k: (_num(v) if k.startswith("median_") or k == "speedup" else v) for k, v in r.items()}
            for r in summary.to_dict(orient="records")]
    for r in runs:
        r["n_lines"] = int(r["n_lines"])
        r["path"] = params.logs.get(str(r["run"]))
        for col in ("num_steps", "topk", "num_draft_tokens"):
            r[col] = None if r.get(col) is None or r[col] != r[col] else int(r[col])
        args = by_run.get(r["run"])
        r["server_args"] = None if args is None else args.to_dict()
        r["note"] = notes.get(str(r["run"]))
    return {"schema": RUNS_SCHEMA, "verdict": verdict_text(summary, params.baseline), "exit_code": 1 if notes else 0,
            "baseline": params.baseline, "runs": runs, "notes": list(summary.attrs.get("notes", [])),
            "parameters": params.as_dict()}


def display_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with readable headers and units, values as text (pandas escapes it in HTML)."""
    import pandas as pd

    def fmt(value: Any, spec: str, suffix: str = "") -> str:
        v = _num(value)
        return "-" if v is None else f"{v:{spec}}{suffix}"

    return pd.DataFrame({
        "run": summary["run"].astype(str).tolist(), "engine": summary["engine"].fillna("?").astype(str),
        "data lines": summary["n_lines"],
        "median accept length": [fmt(v, ".2f") for v in summary["median_accept_length"]],
        "median accept rate": [fmt(v, ".2f") for v in summary["median_accept_rate"]],
        "median tok/s": [fmt(v, ".1f") for v in summary["median_tok_s"]],
        "speed-up over baseline": [fmt(v, ".2f", "x") for v in summary["speedup"]],
        "launch": [_launch_text(summary.attrs.get("server_args_by_run", {}).get(r)) for r in summary["run"]],
    }).set_index("run")


def _launch_text(args: Any) -> str:
    """``EAGLE3: steps 3, topk 1, draft tokens 4`` from a run's ``ServerArgs``; '-' when its log has none."""
    if args is None:
        return "-"
    if not args.speculative:
        return "no speculation"
    parts = [f"{name} {value}" for name, value in (("steps", args.num_steps), ("topk", args.topk),
                                                     ("draft tokens", args.num_draft_tokens)) if value is not None]
    return f"{args.algorithm_raw or args.algorithm}: " + ", ".join(parts)


def default_output(params: RunsParams, cwd: Path | None = None) -> Path:
    """``reports/runs-<labels>.html`` under the current directory: never beside the logs."""
    return (cwd or Path.cwd()) / "reports" / f"runs-{safe_stem('-'.join(params.logs), 'logs')}.html"


def build_runs_report(logs: Any, out: str | os.PathLike[str] | None = None, *, baseline: str | None = None,
                      title: str | None = None, with_input: bool = False, keep_notebook: bool = False,
                      notebook: str | os.PathLike[str] | None = None) -> ReportOutcome:
    """Validate, execute runs.ipynb, write one offline HTML file (the align report's pipeline)."""
    params = validate_params(logs, baseline, title)
    html_path = Path(out) if out is not None else default_output(params)
    source = Path(notebook) if notebook is not None else find_notebook(NOTEBOOK)
    return render(source, params.as_dict(), html_path, schema=RUNS_SCHEMA, heading=params.heading,
                  inputs=params.logs.values(), with_input=with_input, keep_notebook=keep_notebook,
                  roles=[(f"log {label}", path) for label, path in params.logs.items()])
