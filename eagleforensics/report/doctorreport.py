"""The doctor in reports: ``doctor --report OUT.html`` (notebooks/doctor.ipynb) and the Doctor section of the align report.

Parameters are the doctor's inputs, checked here before any kernel starts (paths made absolute;
a bad one is a one-line ForensicsError). The table has one row per check, most severe first:
found (its findings, what to do, the source), clean (what was checked) or not run (the input that
would enable it). The page goes through the align report's pipeline (``pipeline.render``:
papermill -> nbconvert, one offline HTML file); the summary it records is the doctor's own JSON.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks.base import FLAGGED, NOT_RUN, DoctorInputs
from ..errors import ForensicsError
from .pipeline import SAMPLES_DIR, ReportOutcome, ReportParams, find_notebook, input_path, render, safe_stem

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..doctor import DoctorReport
    from ..results import AlignmentResult

NOTEBOOK = "doctor.ipynb"
PATH_PARAMS = {"drafter": False, "target": False, "train": False, "capture": False, "draft_config": False,
               "log": True, "served_prompts": True}  # name -> must be a file


@dataclass(frozen=True)
class DoctorParams:
    """The doctor notebook's parameters after validation: the doctor's inputs (absolute paths) and a title."""

    inputs: DoctorInputs
    title: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The notebook's parameters: JSON values (the check-name tuples as lists, as papermill carries them)."""
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.inputs).items()}
        return {**values, "title": self.title}

    @property
    def heading(self) -> str:
        """The report's title: the given one, else ``Doctor: <drafter or first input>``."""
        if self.title:
            return self.title
        first = next((v for k, v in self.inputs.given().items() if k in PATH_PARAMS), "inputs")
        return f"Doctor: {Path(str(first)).name}"


def validate_params(title: Any = None, **values: Any) -> DoctorParams:
    """Check every doctor parameter before anything is read; ``values`` are ``DoctorInputs`` fields."""
    known = {f.name for f in fields(DoctorInputs)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ForensicsError(f"unknown doctor parameter(s): {', '.join(unknown)}")
    clean: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in PATH_PARAMS:
            clean[name] = input_path(value, name, want_file=PATH_PARAMS[name])
        elif name in ("skip", "only"):  # check names: papermill hands a tuple over as a list
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ForensicsError(f"parameter {name} must be a list of check names, got {value!r}")
            clean[name] = tuple(value)
        else:
            clean[name] = value
    served = clean.get("served_len")
    if served is not None and (isinstance(served, bool) or not isinstance(served, int) or served < 1):
        raise ForensicsError(f"parameter served_len must be a whole number >= 1 or None, got {served!r}")
    if title is not None and not isinstance(title, str):
        raise ForensicsError(f"parameter title must be a string or None, got {type(title).__name__} {title!r}")
    if not any(name in clean for name in PATH_PARAMS):  # the demo: the bundled samples
        clean.update({k: input_path(v, k, want_file=False) for k, v in sample_inputs().items()})
    return DoctorParams(DoctorInputs(**clean), title)


def sample_inputs() -> dict[str, str]:
    """The bundled demo (data_samples' drafter, target, incident record and capture) of a source checkout."""
    found = {"drafter": SAMPLES_DIR / "drafter", "target": SAMPLES_DIR / "target",
             "train": SAMPLES_DIR / "record_layer_outputs.pt", "capture": SAMPLES_DIR / "capture.pt"}
    if not all(p.exists() for p in found.values()):
        raise ForensicsError("give at least one of drafter, target, train, capture, draft_config, log (no "
                             "data_samples/ next to this installation for the demo)")
    return {k: str(p) for k, p in found.items()}


def run_doctor(params: DoctorParams) -> DoctorReport:
    """The doctor on the notebook's inputs."""
    from ..doctor import diagnose

    return diagnose(params.inputs)


def doctor_summary(report: DoctorReport, params: DoctorParams | None = None) -> dict[str, Any]:
    """What doctor.ipynb records for tests and the CLI: the doctor's JSON object and the parameters."""
    return {**report.to_dict(), "parameters": None if params is None else params.as_dict()}


def checks_table(report: DoctorReport) -> pd.DataFrame:
    """One row per check, most severe first: status, what it found (or checked, or needs), what to do, the source."""
    import pandas as pd

    rows = []
    worst = {}  # check -> its most costly cause (causes come most costly first): severity and cost label from it
    for c in report.causes:
        for name in c.checks:
            worst.setdefault(name, c)
    for o in report.rows():
        flagged = [f for f in o.findings if f.severity in FLAGGED] if o.name in report.cause_rows else []
        shown = flagged or [f for f in o.findings if o.name != "wiring"]  # align's info lines stay in its section
        cause = worst.get(o.name)
        severity = cause.severity if cause is not None else "-"
        if o.status == NOT_RUN:
            what = f"not run: {o.reason}"
        else:
            what = " | ".join(f"{f.code}: {f.message}" for f in shown) or o.note
            if o.note and shown and (o.status != "found" or not flagged):
                what = f"{o.note} | {what}"
        rows.append({"check": o.name, "status": o.status.replace("-", " "), "severity": severity,
                     "impact": cause.cost.label if cause is not None else "-", "what": what,
                     "what to do": " | ".join(dict.fromkeys(f.fix for f in flagged if f.fix)) or "-",
                     "source": " | ".join(dict.fromkeys(f.source for f in shown if f.source)) or "-"})
    return pd.DataFrame(rows, columns=["check", "status", "severity", "impact", "what", "what to do", "source"])


def causes_table(report: DoctorReport) -> pd.DataFrame:
    """One row per root cause, most costly first: severity, cost label, the cost (measured or expected), the codes
    beneath it, what to do: the same grouping as the text's causes and the JSON's ``causes``."""
    import pandas as pd

    rows = [{"cause": c.key, "severity": c.severity, "impact": c.cost.label or "-", "what": c.title,
             "cost": c.cost.text, "codes": ", ".join(c.codes), "what to do": c.fix or "-"} for c in report.causes]
    return pd.DataFrame(rows, columns=["cause", "severity", "impact", "what", "cost", "codes", "what to do"])


def align_doctor(params: ReportParams, result: AlignmentResult) -> DoctorReport:
    """The doctor on the align report's inputs (record, capture, drafter, target, engine), reusing its alignment."""
    from ..doctor import diagnose

    inputs = DoctorInputs(drafter=params.drafter, target=params.target, train=params.shard, capture=params.capture,
                          draft_config=params.draft_config, engine=params.engine,
                          engine_version=params.engine_version, model_type=params.model_type,
                          capture_convention=params.capture_convention)
    return diagnose(inputs, aligned=result)


def default_output(params: DoctorParams, cwd: Path | None = None) -> Path:
    """``reports/doctor-<drafter or first input>.html`` under the current directory: never beside the inputs."""
    first = next((v for k, v in params.inputs.given().items() if k in PATH_PARAMS), "inputs")
    return (cwd or Path.cwd()) / "reports" / f"doctor-{safe_stem(Path(str(first)).name, 'inputs')}.html"


def build_doctor_report(inputs: DoctorInputs, out: str | os.PathLike[str] | None = None, *, title: str | None = None,
                        with_input: bool = False, keep_notebook: bool = False,
                        notebook: str | os.PathLike[str] | None = None, command: list[str] | None = None
                        ) -> ReportOutcome:
    """Validate, execute doctor.ipynb, write one offline HTML file (the align report's pipeline)."""
    from ..doctor import check_inputs

    check_inputs(inputs)
    values = {f.name: getattr(inputs, f.name) for f in fields(DoctorInputs)}
    params = validate_params(title, **values)
    html_path = Path(out) if out is not None else default_output(params)
    source = Path(notebook) if notebook is not None else find_notebook(NOTEBOOK)
    given = {k: v for k, v in params.inputs.given().items() if k in PATH_PARAMS}
    from ..doctor import SCHEMA

    return render(source, params.as_dict(), html_path, schema=SCHEMA, heading=params.heading,
                  inputs=list(given.values()), with_input=with_input, keep_notebook=keep_notebook,
                  roles=[(k.replace("_", " "), v) for k, v in given.items()], command=command)
