"""The doctor pipeline: why does this drafter accept less than it should? Every check the inputs allow, ranked.

``diagnose(DoctorInputs(...))`` runs each registered check (``checks.registry``) whose inputs were
given, lists the others with the option that would enable them, and, with a record and a capture,
align's verdict on the wiring; with a drafter and a capture, replay's acceptance per wiring.
Findings are ranked most costly first: severity, then the likely cost in acceptance (``impact``).
The level follows align's rule: PROBLEM when something is broken (an error finding), ACTION when
something must be written or changed (a warning), OK otherwise; exit 0 / 1 / 1, 2 for bad input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .checks.base import CLEAN, FLAGGED, FOUND, INPUTS, NOT_RUN, Artifacts, Check, CheckOutcome, DoctorInputs
from .checks.registry import all_checks
from .errors import ForensicsError, printable
from .results import IMPACTS, Finding
from .verdict import ACTION, EXIT_CODES, OK, PROBLEM, SEVERITY_ORDER

SCHEMA = "eagleforensics-doctor-v1"
_LEVEL_RANK = {OK: 0, ACTION: 1, PROBLEM: 2}


@dataclass(frozen=True)
class RankedFinding:
    """A finding with the check that made it (the doctor's findings list)."""

    check: str
    finding: Finding

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, **self.finding.to_dict()}


def rank(outcomes: list[CheckOutcome]) -> list[RankedFinding]:
    """Every finding of every check, most severe first, then most costly, then in check order."""
    order = {o.name: i for i, o in enumerate(outcomes)}
    items = [RankedFinding(o.name, f) for o in outcomes for f in o.findings]
    return sorted(items, key=lambda r: (SEVERITY_ORDER.get(r.finding.severity, 9),
                                        IMPACTS.index(r.finding.impact) if r.finding.impact in IMPACTS else 9,
                                        order[r.check]))


@dataclass(frozen=True)
class DoctorReport:
    """The doctor's answer: every check's row, the ranked findings, and align's / replay's summaries."""

    inputs: DoctorInputs
    outcomes: list[CheckOutcome]
    align: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    extra_level: str = OK  # a pipeline's own level (align's ACTION with only info findings, say)
    findings: list[RankedFinding] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", rank(self.outcomes))

    @property
    def level(self) -> str:
        severities = {r.finding.severity for r in self.findings}
        level = PROBLEM if "error" in severities else ACTION if "warning" in severities else OK
        return max(level, self.extra_level, key=_LEVEL_RANK.__getitem__)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.level]

    def by_status(self, status: str) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def summary(self) -> str:
        flagged = [r for r in self.findings if r.finding.severity in FLAGGED]
        ran = len(self.outcomes) - len(self.by_status(NOT_RUN))
        if not ran:
            return "no check could run with these inputs (see 'not run' for what each needs)"
        if flagged:
            codes = list(dict.fromkeys(r.finding.code for r in flagged))
            head = f"{len(codes)} likely cause{'s' if len(codes) > 1 else ''} of low acceptance: " + ", ".join(codes)
        else:
            head = "no cause of low acceptance found by the checks that ran"
        clean, skipped = len(self.by_status(CLEAN)), len(self.by_status(NOT_RUN))
        tail = f"{clean} check{'' if clean == 1 else 's'} clean, {skipped} not run"
        return f"{head}; {tail}"

    @property
    def verdict(self) -> str:
        return f"{self.level}: {self.summary}"

    @property
    def todo(self) -> list[str]:
        """What to do, most costly first, one line per distinct fix."""
        return list(dict.fromkeys(r.finding.fix for r in self.findings
                                  if r.finding.fix and r.finding.severity in FLAGGED))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``schema``, ``verdict``, ``level``, ``exit_code``, ``todo``, ``findings`` (ranked; each
        ``check``, ``code``, ``severity``, ``message`` and when known ``fix``, ``source``, ``impact``),
        ``checks`` (one row per check: ``name``, ``title``, ``status`` found/clean/not-run, ``codes``, ``note``,
        ``reason``, ``data``), ``align`` and ``replay`` (their own JSON objects, or null), ``inputs``."""
        return {"schema": SCHEMA, "verdict": self.verdict, "level": self.level, "exit_code": self.exit_code,
                "todo": self.todo, "findings": [r.to_dict() for r in self.findings],
                "checks": [o.to_dict() for o in self.outcomes], "align": self.align, "replay": self.replay,
                "inputs": self.inputs.given()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=str)

    def to_text(self) -> str:
        return render_text(self)


def render_text(report: DoctorReport) -> str:
    """The verdict, the ranked findings with their fixes and sources, then one row per check."""
    given = report.inputs.given()
    lines = ["doctor: " + ", ".join(f"{k.replace('_', '-')} {printable(v)}" for k, v in given.items()),
             "", f"VERDICT: {report.verdict}"]
    if report.findings:
        lines += ["", "findings (most costly first):"]
        for i, r in enumerate(report.findings, 1):
            f = r.finding
            impact = f" ({f.impact})" if f.impact else ""
            lines.append(f"  {i}. [{f.severity}] {f.code}{impact}: {printable(f.message)}")
            if f.fix:
                lines.append(f"     fix: {printable(f.fix)}")
            if f.source:
                lines.append(f"     source: {printable(f.source)}")
    head = ("check", "status", "what")
    rows = [(o.name, o.status, ", ".join(sorted({f.code for f in o.findings if f.severity in FLAGGED}))
             or printable(o.note or o.reason)) for o in report.outcomes]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head[:2])]
    lines += ["", "checks:", "  " + "  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip(),
              "  " + "  ".join("-" * w for w in widths) + "  " + "-" * 4]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths + [0])).rstrip() for r in rows]
    return "\n".join(lines)


def _not_run(name: str, title: str, missing: list[str]) -> CheckOutcome:
    needs = "; ".join(" or ".join(INPUTS[alt] for alt in need.split("|")) for need in missing)
    return CheckOutcome(name, title, NOT_RUN, reason=f"needs {needs}")


def run_check(check: Check, art: Artifacts) -> CheckOutcome:
    """Run one check (or say which input it lacks); a finding code outside its contract is a bug."""
    missing = art.missing(check.needs)
    if missing:
        return _not_run(check.name, check.title, missing)
    result = check.run(art)
    if result.skipped:
        return CheckOutcome(check.name, check.title, NOT_RUN, reason=result.skipped, data=dict(result.data))
    stray = [f.code for f in result.findings if f.code not in check.codes]
    if stray:
        raise RuntimeError(f"doctor check {check.name!r} emitted codes outside its contract: {stray}")
    status = FOUND if any(f.severity in FLAGGED for f in result.findings) else CLEAN
    return CheckOutcome(check.name, check.title, status, tuple(result.findings), result.note, data=dict(result.data))


def _check_paths(inputs: DoctorInputs) -> None:
    """Bad paths are one line before any check runs."""
    for name, want_dir in (("drafter", True), ("target", True), ("train", None), ("capture", None),
                           ("draft_config", None), ("log", False), ("served_prompts", False)):
        value = getattr(inputs, name)
        if value is None:
            continue
        p = Path(value)
        if not p.exists():
            raise ForensicsError(f"--{name.replace('_', '-')}: no such file or directory", path=p)
        if want_dir is True and not p.is_dir():
            raise ForensicsError(f"--{name.replace('_', '-')} expects a directory (config.json + safetensors)", path=p)
        if want_dir is False and p.is_dir():
            raise ForensicsError(f"--{name.replace('_', '-')} expects a file, got a directory", path=p)
    if inputs.served_len is not None and inputs.served_len <= 0:
        raise ForensicsError(f"--served-len must be a positive number of tokens, got {inputs.served_len}")


Pipeline = Callable[[Artifacts], tuple[CheckOutcome, dict[str, Any] | None, str]]
WIRING_TITLE = "aux-layer wiring (align: record against capture)"


def wiring_row(art: Artifacts) -> tuple[CheckOutcome, dict[str, Any] | None, str]:
    """Align's verdict on the first training record against the capture, as one doctor row."""
    missing = art.missing(("train", "capture"))
    if missing:
        return _not_run("wiring", WIRING_TITLE, missing), None, OK
    from .alignment import align

    i = art.inputs
    engine = art.engine
    draft = (i.draft_config or i.drafter) if engine is not None else None
    result = align(art.record_paths[0], art.capture, engine=engine, draft_config=draft,
                   engine_version=i.engine_version if engine else None, model_type=i.model_type if engine else None,
                   vllm_runner=i.vllm_runner if engine == "vllm" else None, allow_unsafe=i.allow_unsafe)
    verdict = result.judge()
    fix = "; ".join(verdict.todo) if verdict.level == PROBLEM else "write the aux ids explicitly: " + "; ".join(
        f"{a.engine} {a.ids} in {a.key}" for a in verdict.actions if a.snippet) + " (align prints each snippet)"
    findings = tuple(Finding(f.code, f.severity, f.message, fix=fix if f.severity in FLAGGED else "",
                             source="align (content of the record against the capture)",
                             impact={"error": "collapse", "warning": "high"}.get(f.severity, ""))
                     for f in result.findings)
    status = FOUND if verdict.level != OK else CLEAN
    note = f"{verdict.level}: {verdict.summary}"
    return CheckOutcome("wiring", WIRING_TITLE, status, findings, note), result.to_dict(), verdict.level


DEFAULT_PIPELINES: tuple[Pipeline, ...] = (wiring_row,)


def diagnose(inputs: DoctorInputs, *, checks: list[Check] | None = None,
             pipelines: tuple[Pipeline, ...] = DEFAULT_PIPELINES) -> DoctorReport:
    """Run every check ``inputs`` allow (all registered ones unless ``checks`` is given) and rank the findings.

    ``pipelines`` are the rows that run a whole pipeline on the same artifacts (align's wiring verdict).
    """
    if not any(v is not None for v in (inputs.drafter, inputs.target, inputs.train, inputs.capture,
                                       inputs.draft_config, inputs.log, inputs.served_prompts)):
        raise ForensicsError("give at least one of --drafter, --target, --train, --capture, --draft-config, --log, "
                             "--served-prompts")
    _check_paths(inputs)
    art = Artifacts(inputs)
    outcomes = [run_check(c, art) for c in (all_checks() if checks is None else checks)]
    summaries: dict[str, dict[str, Any] | None] = {}
    extra = OK
    for pipe in pipelines:
        outcome, summary, level = pipe(art)
        outcomes.append(outcome)
        summaries[outcome.name] = summary
        extra = max(extra, level, key=_LEVEL_RANK.__getitem__)
    return DoctorReport(inputs, outcomes, align=summaries.get("wiring"), replay=summaries.get("replay"),
                        extra_level=extra)
