"""The doctor pipeline: why does this drafter accept less than it should? Every check the inputs allow, ranked.

``diagnose(DoctorInputs(...))`` runs each registered check (``checks.registry``) whose inputs were
given, lists the others with the option that would enable them, and, with a record and a capture,
align's verdict on the wiring; with a drafter and a capture, replay's acceptance per wiring.
Findings that share one root cause are one cause (``causes``: the grouping table and the cost rule),
ranked most costly first: severity, then the cost in acceptance, measured by replay where it ran.
The level follows align's rule (``verdict.LEVEL_OF_SEVERITY``): PROBLEM when something is broken
(an error cause), ACTION when something must be written or changed (a warning), OK otherwise; exit
0 / 1 / 1, 2 for bad input. The wiring row's cause takes align's own level as its severity.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .checks.base import (CLEAN, FLAGGED, FOUND, INPUTS, NOT_RUN, Artifacts, Check, CheckOutcome, DoctorInputs,
                          is_refusal)
from .causes import Cause
from .causes import build as build_causes
from .checks.drafterbaseline import as_served
from .checks.drafterbaseline import settle as settle_baseline
from .checks.registry import all_checks
from .errors import ForensicsError, printable
from .io.modeldir import MissingShard, ModelDir
from .results import IMPACTS, Finding
from .verdict import ACTION, EXIT_CODES, LEVEL_OF_SEVERITY, OK, PROBLEM, SEVERITY_OF_LEVEL, SEVERITY_ORDER

if TYPE_CHECKING:  # pragma: no cover
    from .results import AlignmentResult

SCHEMA = "eagleforensics-doctor-v1"
PIPELINE_ROWS = ("wiring", "replay")  # rows that run a whole pipeline (their info lines stay in their own JSON)
_LEVEL_RANK = {OK: 0, ACTION: 1, PROBLEM: 2}


@dataclass(frozen=True)
class RankedFinding:
    """A finding with the check that made it (the doctor's findings list)."""

    check: str
    finding: Finding
    cause: str = ""  # the root-cause key it belongs to (flagged findings only)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, **self.finding.to_dict(), **({"cause": self.cause} if self.cause else {})}


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
    causes: list[Cause] = field(init=False)

    def __post_init__(self) -> None:
        found = self.cause_rows
        # one severity on every surface: a warning or error of a row that names no cause (a clean row's, or the
        # replay row's, which measures) is a note, in the JSON as in the text (the row's verdict judged it)
        object.__setattr__(self, "outcomes", [o if o.name in found else _as_notes(o) for o in self.outcomes])
        ranked = rank(self.outcomes)
        flagged = [r for r in ranked if r.finding.severity in FLAGGED and r.check in found]
        floors = {o.name: SEVERITY_OF_LEVEL[o.data["level"]] for o in self.outcomes
                  if o.status == FOUND and o.data.get("level") in SEVERITY_OF_LEVEL}
        replay_row = next((o for o in self.outcomes if o.name == "replay"), None)
        reason = f"replay did not run: {replay_row.reason}" if replay_row is not None and replay_row.reason else ""
        causes = build_causes(((r.check, r.finding) for r in flagged), self.replay, floors, reason)
        of = {(c, id(f)): cause for cause in causes for c, f in cause.items}
        # a finding's impact is its cause's cost label: one number decides, on every surface
        ranked = [replace(r, finding=replace(r.finding, impact=of[r.check, id(r.finding)].cost.label),
                          cause=of[r.check, id(r.finding)].key) if (r.check, id(r.finding)) in of else r
                  for r in ranked]
        place = {c.key: i for i, c in enumerate(causes)}  # the causes' order: the findings follow it
        ranked = [r for _, r in sorted(enumerate(ranked), key=lambda x: (place.get(x[1].cause, len(place)), x[0]))]
        object.__setattr__(self, "causes", causes)
        object.__setattr__(self, "findings", ranked)

    @property
    def flagged(self) -> list[RankedFinding]:
        """The errors and warnings of rows that found something (a pipeline row's own verdict decides whether its
        warnings count: align can warn about a capture and still judge the wiring OK)."""
        found = self.cause_rows
        return [r for r in self.findings if r.finding.severity in FLAGGED and r.check in found]

    @property
    def cause_rows(self) -> set[str]:
        """The rows whose errors and warnings count as causes: those that found something, except replay's, which
        measures and is never a cause by itself (its warnings are about the replay, its symptom is info)."""
        return {o.name for o in self.outcomes if o.status == FOUND and o.name not in SYMPTOM_ROWS}

    @property
    def nothing_ran(self) -> bool:
        """No check could run with the inputs given."""
        return all(o.status == NOT_RUN for o in self.outcomes)

    @property
    def level(self) -> str:
        """PROBLEM on an error, ACTION on a warning, else OK; ACTION too when no check could run: nothing was
        checked, so OK would vouch for what was never looked at (the 'not run' rows say what to give)."""
        if self.nothing_ran:
            return max(ACTION, self.extra_level, key=_LEVEL_RANK.__getitem__)
        levels = [LEVEL_OF_SEVERITY.get(c.severity, OK) for c in self.causes]
        return max([OK, *levels, self.extra_level], key=_LEVEL_RANK.__getitem__)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.level]

    def rows(self) -> list[CheckOutcome]:
        """One row per check, most severe first: found (by worst severity, then cost), clean, not run."""
        def key(o: CheckOutcome) -> tuple[int, int, int]:
            worst = min((SEVERITY_ORDER.get(f.severity, 9) for f in o.findings if f.severity in FLAGGED), default=9)
            cost = min((IMPACTS.index(f.impact) if f.impact in IMPACTS else 9 for f in o.findings
                        if f.severity in FLAGGED), default=9)
            return ({FOUND: 0, CLEAN: 1, NOT_RUN: 2}.get(o.status, 3), worst, cost)
        return sorted(self.outcomes, key=key)  # stable: registry order within a tier

    def by_status(self, status: str) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def summary(self) -> str:
        flagged = self.flagged
        if self.nothing_ran:
            return "no check could run with these inputs: nothing was checked (see 'not run' for what each needs)"
        if flagged:
            causes = self.causes
            head = (f"{len(causes)} likely cause{'s' if len(causes) > 1 else ''} of low acceptance: "
                    + ", ".join(c.key if c.codes == [c.key] else f"{c.key} ({', '.join(c.codes)})" for c in causes))
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
        """What to do, most costly cause first, one line per distinct fix."""
        return list(dict.fromkeys(f.fix for c in self.causes for _, f in c.items if f.fix))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``schema``, ``verdict``, ``level``, ``exit_code``, ``todo``, ``causes`` (the root causes,
        most costly first: ``key``, ``title``, ``severity``, ``impact`` (the cost label), ``cost`` (``label``,
        ``measured``, ``lost`` and ``se`` in accept length, ``served``, ``trained``, ``source``, ``basis``, ``text``),
        ``codes``, ``checks``, ``fix``, ``findings``; see docs/cause-grouping.md), ``findings`` (ranked; each
        ``check``, ``code``, ``severity``, ``message`` and when known ``fix``, ``source``, ``impact`` (its cause's
        label), ``cause`` (its cause's key)),
        ``checks`` (one row per check: ``name``, ``title``, ``status`` found/clean/not-run, ``codes``, ``note``,
        ``reason``, ``data``), ``align`` and ``replay`` (their own JSON objects, or null), ``inputs``."""
        return {"schema": SCHEMA, "verdict": self.verdict, "level": self.level, "exit_code": self.exit_code,
                "todo": self.todo, "causes": [c.to_dict() for c in self.causes],
                "findings": [r.to_dict() for r in self.findings],
                "checks": [o.to_dict() for o in self.outcomes], "align": self.align, "replay": self.replay,
                "inputs": self.inputs.given()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=str)

    def to_text(self) -> str:
        return render_text(self)


NOTE_OF = " (a note: its row names no cause)"


def _as_notes(o: CheckOutcome) -> CheckOutcome:
    """Row ``o`` (one that names no cause) with its errors and warnings made info notes that say so."""
    if not any(f.severity in FLAGGED for f in o.findings):
        return o
    return replace(o, findings=tuple(replace(f, severity="info", impact="", message=f.message + NOTE_OF)
                                     if f.severity in FLAGGED else f for f in o.findings))


def render_text(report: DoctorReport) -> str:
    """The verdict, the ranked findings with their fixes and sources, then one row per check."""
    given = report.inputs.given()
    lines = ["doctor: " + ", ".join(f"{k.replace('_', '-')} {printable(v)}" for k, v in given.items()),
             "", f"VERDICT: {report.verdict}"]
    if report.causes:  # a clean pipeline row's warnings do not count (align judged them): in its JSON
        lines += ["", "causes (most costly first; the codes beneath each are its evidence):"]
        for i, c in enumerate(report.causes, 1):
            lines.append(f"  {i}. {printable(c.line)}")
            lines.append(f"     cost: {printable(c.cost.text)}")
            for _, f in c.items:
                lines.append(f"     - [{f.severity}] {f.code}: {printable(f.message)}")
            for fix in dict.fromkeys(f.fix for _, f in c.items if f.fix):
                lines.append(f"     fix: {printable(fix)}")
            for source in dict.fromkeys(f.source for _, f in c.items if f.source):
                lines.append(f"     source: {printable(source)}")
    context = [r for r in report.findings if r.finding.severity not in FLAGGED
               and (r.check not in PIPELINE_ROWS or r.finding.message.endswith(NOTE_OF))]
    if context:  # the checks' info lines and every note; align's and replay's own info lines are in their JSON
        lines += ["", "context:"] + [f"  - {r.finding.code}: {printable(r.finding.message)}" for r in context]
    head = ("check", "status", "what")
    rows = [(o.name, o.status, _what(o, report.cause_rows)) for o in report.rows()]
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
    try:
        result = check.run(art)
    except MissingShard as exc:  # a partial download: this check needs a shard the user has not fetched
        return CheckOutcome(check.name, check.title, NOT_RUN,
                            reason=f"needs {exc.shard} in {exc.path} (it holds {exc.tensor}; not downloaded)")
    except ForensicsError as exc:  # its own refusal (a rules table that stops short): this row only
        if not is_refusal(exc):
            raise
        return CheckOutcome(check.name, check.title, NOT_RUN, reason=f"cannot run: {exc.detail}")
    if result.skipped:
        return CheckOutcome(check.name, check.title, NOT_RUN, reason=result.skipped, data=dict(result.data))
    stray = [f.code for f in result.findings if f.code not in check.codes]
    if stray:
        raise RuntimeError(f"doctor check {check.name!r} emitted codes outside its contract: {stray}")
    status = FOUND if any(f.severity in FLAGGED for f in result.findings) else CLEAN
    return CheckOutcome(check.name, check.title, status, tuple(result.findings), result.note, data=dict(result.data))


def row_names(checks: list[Check], pipelines: tuple[Pipeline, ...]) -> list[str]:
    """The names ``--skip`` / ``--only`` accept: every check's and every pipeline row's (wiring, replay)."""
    return [c.name for c in checks] + [n for n in (getattr(p, "row_name", None) for p in pipelines) if n]


def selected(name: str, inputs: DoctorInputs) -> str:
    """Why row ``name`` is left out ("" when it runs): named by --skip, or not named by --only."""
    if name in inputs.skip:
        return f"skipped (--skip {name})"
    if inputs.only and name not in inputs.only:
        return "skipped (not named by --only)"
    return ""


def check_selection(inputs: DoctorInputs, known: list[str]) -> None:
    """Every name in --skip / --only is a row of the doctor; an unknown one is one line listing the known."""
    for option, names in (("--skip", inputs.skip), ("--only", inputs.only)):
        bad = [n for n in names if n not in known]
        if bad:
            raise ForensicsError(f"{option}: no doctor check named {printable(bad[0])!r}; known: {', '.join(known)}")
    if inputs.device not in ("cpu", "cuda") and not str(inputs.device).startswith("cuda:"):
        raise ForensicsError(f"--device must be cpu or cuda, got {printable(inputs.device)!r}")


def check_inputs(inputs: DoctorInputs) -> None:
    """Bad inputs are one line before any check runs (and before a report's kernel starts)."""
    if not any(v is not None for v in (inputs.drafter, inputs.target, inputs.train, inputs.capture,
                                       inputs.draft_config, inputs.log, inputs.served_prompts)):
        raise ForensicsError("give at least one of --drafter, --target, --train, --capture, --draft-config, --log, "
                             "--served-prompts")
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
    from .io.identify import check_models

    check_models(inputs.drafter, inputs.target)  # a target as --drafter (or the two swapped): one line, exit 2
    if inputs.target is not None:  # its shard index is read now: a refused index fails before any check runs
        _ = ModelDir(inputs.target, "target directory").index
    if inputs.served_len is not None and inputs.served_len <= 0:
        raise ForensicsError(f"--served-len must be a positive number of tokens, got {inputs.served_len}")
    if inputs.engine == "vllm" and inputs.vllm_runner is not None and (inputs.engine_version or inputs.log is None):
        from .engines.rules import NEWEST, check_vllm_runner

        # --vllm-runner v1 with a release that has none (vLLM 0.34.0 on, or no version and no log to give one)
        check_vllm_runner(inputs.engine_version or NEWEST["vllm"], inputs.vllm_runner)


Pipeline = Callable[[Artifacts], tuple[CheckOutcome, dict[str, Any] | None, str]]
WIRING_TITLE = "aux-layer wiring (align: record against capture)"


def wiring_row(art: Artifacts) -> tuple[CheckOutcome, dict[str, Any] | None, str]:
    """Align's verdict on the first training record against the capture, as one doctor row."""
    missing = art.missing(("train", "capture"))
    if missing:
        return _not_run("wiring", WIRING_TITLE, missing), None, OK
    result: AlignmentResult = art.aligned()
    verdict = result.judge()
    snippets = [f"{a.engine} {a.ids} in {a.key}" for a in verdict.actions if a.snippet]
    fix = ("; ".join(verdict.todo) if verdict.level == PROBLEM else
           "write the aux ids explicitly: " + "; ".join(snippets) + " (align prints each snippet)" if snippets else "")
    first = next((i for i, f in enumerate(result.findings) if f.severity in FLAGGED), None)
    findings = tuple(Finding(f.code, f.severity, f.message, fix=fix if i == first else "",  # one fix for the verdict
                             source="align (content of the record against the capture)",
                             impact={"error": "collapse", "warning": "high"}.get(f.severity, ""))
                     for i, f in enumerate(result.findings))
    unmatched = art.memoised("capture-record-note")
    if unmatched:  # --train DIR held no record of the captured sequence: said beside align's verdict
        findings += (Finding("capture-record-unmatched", "info", unmatched,
                             source="align (content of the record against the capture)"),)
    status = FOUND if verdict.level != OK else CLEAN
    note = f"{verdict.level}: {verdict.summary}"
    return (CheckOutcome("wiring", WIRING_TITLE, status, findings, note, data={"level": verdict.level}),
            result.to_dict(), verdict.level)


def _what(o: CheckOutcome, cause_rows: set[str]) -> str:
    """A checks-table row's last column: the codes of a row that names causes; for a row that found only what it
    states (a symptom, context), its codes and its note; else the note or why it did not run."""
    if o.status == FOUND:
        causes = sorted({f.code for f in o.findings if f.severity in FLAGGED}) if o.name in cause_rows else []
        if causes:
            return ", ".join(causes)
        codes = ", ".join(sorted({f.code for f in o.findings}))
        return printable(f"{codes}: {o.note}" if codes and o.note else codes or o.note)
    return printable(o.note or o.reason)


REPLAY_TITLE = "replay: the drafter's accept length per wiring (trained, engine, as served)"
SYMPTOM_ROWS = ("replay",)  # rows that measure: their findings never make a cause (``DoctorReport.cause_rows``)
def replay_row(art: Artifacts) -> tuple[CheckOutcome, dict[str, Any] | None, str]:
    """Replay's accept length per wiring on the capture, and, when the engine ignores a flag the drafter uses,
    the "as served" variant that drops it: the cost of ``flag-ignored`` (and of any wiring) as a number.

    Informative, never a cause by itself: its numbers are in the note and the JSON's ``replay``; the row is clean
    unless the drafter accepts almost nothing even as trained (``replay-accepts-nothing``, info: a symptom).
    A drafter replay cannot run (a refusal of its own: an unsupported layer, a map out of range) is "not run"
    with replay's reason; the other checks say what is wrong with it.
    """
    missing = art.missing(("drafter", "capture"))
    if missing:
        return _not_run("replay", REPLAY_TITLE, missing), None, OK
    from .replay import run_replay

    i = art.inputs
    dropped = sorted(as_served(art))  # flagrules names = replay names; the drafter-baseline check drops the same
    aligned = art.memoised("aligned")  # the wiring row's alignment, when it ran
    try:
        rep = run_replay(i.drafter, art.capture, target=i.target, train=aligned if aligned is not None else i.train,
                         engine=art.engine if art.engine != "trtllm" else None,
                         draft_config=i.draft_config, engine_version=art.engine_version,
                         model_type=i.model_type, convention=i.capture_convention, allow_unsafe=i.allow_unsafe,
                         served_without=tuple(dropped), device=i.device,
                         vllm_runner=art.vllm_runner if art.engine == "vllm" else None)
    except ForensicsError as exc:
        return CheckOutcome("replay", REPLAY_TITLE, NOT_RUN, reason=f"replay cannot run this drafter: {exc.detail}"), \
            None, OK
    summary = rep.to_dict()
    add_paired_se(summary, rep)
    art.memo("replay-report", lambda: rep)
    parts = []
    if art.memoised("capture-set"):  # a capture set: the figures above are one sequence's; replay pools them all
        from .replaypool import run_pooled

        pooled = run_pooled(i.drafter, i.capture, train=i.train, target=i.target, allow_unsafe=i.allow_unsafe,
                            convention=i.capture_convention, device=i.device)
        summary["pooled"] = pooled.to_dict()
        summary["pooled_capture"] = art.capture_path
        t = pooled.trained or (pooled.wirings[0] if pooled.wirings else None)
        if t is not None and t.accept_length is not None:
            parts.append(f"pooled over {len(pooled.sequences)} captures, {t.label}: accept length "
                         f"{t.accept_length:.2f} (acc@1 {t.acc[0]:.2f} over {t.rows[0]} rows); per capture below from "
                         f"{Path(art.capture_path).name}")
    for r in rep.results:
        tag = f" ({r.source})" if r.source else ""
        parts.append(f"{r.label}{tag}: accept length {r.accept_length:.2f} (acc@1 {r.acc[0]:.2f})")
    trained, served = rep.trained, getattr(rep, "served", None)
    if served is not None and trained is not None:
        parts.append(f"as served without {', '.join(served.served_without)}: {served.accept_length:.2f} against "
                     f"{trained.accept_length:.2f} as trained ({served.accept_length - trained.accept_length:+.2f})")
    findings = tuple(Finding(f.code, f.severity, f.message, source="replay (the drafter run offline on the capture)")
                     for f in rep.findings)
    nothing = accepts_nothing(served if served is not None else trained, rep.steps)  # what the engine runs
    if nothing is not None:  # not "clean" beside an accept length near 1: a symptom the causes above explain
        findings += (nothing,)
    return CheckOutcome("replay", REPLAY_TITLE, FOUND if nothing is not None else CLEAN, findings, "; ".join(parts),
                        data={"served_without": dropped}), summary, OK


def accepts_nothing(run: Any, steps: int) -> Finding | None:
    """``replay-accepts-nothing`` (info) when the drafter as the engine runs it (the "as served" row where the engine
    drops a feature, else the trained wiring) gains no more over 1 than ``causes.COLLAPSE_GAIN`` of the chain (the bar
    the causes use for a collapse): a symptom, not a cause; the causes and the drafter-baseline row say why."""
    from .causes import COLLAPSE_GAIN

    if run is None or not steps or run.accept_length - 1.0 > COLLAPSE_GAIN * steps:
        return None
    how = (f"as served without {', '.join(run.served_without)}" if getattr(run, "served_without", ())
           else "on the wiring it was trained on")
    return Finding("replay-accepts-nothing", "info", (
        f"replayed {how} ({run.label}), the drafter accepts almost nothing: accept length "
        f"{run.accept_length:.2f} for a chain of {steps} steps (no more than {COLLAPSE_GAIN:g} x {steps} over 1); "
        "a symptom: the causes, and the drafter-baseline row, say why"),
        source="replay (the drafter run offline on the capture)")


def add_paired_se(summary: dict[str, Any], rep: Any) -> None:
    """Beside each replayed wiring in the doctor's copy of replay's JSON: ``se`` (its accept length's standard
    error over the start rows) and ``se_vs_trained`` (the SE of its difference from the trained wiring, paired on
    the same start rows), which the causes' measured costs use (``causes.price``)."""
    from .causes import paired_se

    trained = rep.trained
    base = None if trained is None else trained.per_start
    for w, r in zip(summary.get("wirings") or [], rep.results):
        mine = getattr(r, "per_start", None)
        if mine is None:
            continue
        w["se"] = paired_se(mine, None)
        if base is not None and r is not trained:
            w["se_vs_trained"] = paired_se(base, mine)


wiring_row.row_name = "wiring"  # type: ignore[attr-defined]  # the name --skip / --only know it by
replay_row.row_name = "replay"  # type: ignore[attr-defined]
PIPELINE_TITLES = {"wiring": WIRING_TITLE, "replay": REPLAY_TITLE}
DEFAULT_PIPELINES: tuple[Pipeline, ...] = (wiring_row, replay_row)


def diagnose(inputs: DoctorInputs, *, checks: list[Check] | None = None,
             pipelines: tuple[Pipeline, ...] = DEFAULT_PIPELINES, aligned: AlignmentResult | None = None
             ) -> DoctorReport:
    """Run every check ``inputs`` allow (all registered ones unless ``checks`` is given) and rank the findings.

    ``pipelines`` are the rows that run a whole pipeline on the same artifacts (align's wiring verdict).
    ``aligned``: align's result on the same record and capture, already computed (the align notebook's),
    which the wiring row then reuses instead of aligning again.
    """
    checks = all_checks() if checks is None else checks
    check_selection(inputs, row_names(checks, pipelines))
    check_inputs(inputs)
    art = Artifacts(inputs)
    if aligned is not None:
        art.memo("aligned", lambda: aligned)
    if inputs.device != "cpu" and inputs.drafter is not None:  # the checks that use the GPU come after reads
        from .drafter.replay import start_cuda

        start_cuda(inputs.device)
    outcomes = [CheckOutcome(c.name, c.title, NOT_RUN, reason=selected(c.name, inputs)) if selected(c.name, inputs)
                else run_check(c, art) for c in checks]
    summaries: dict[str, dict[str, Any] | None] = {}
    extra = OK
    for pipe in pipelines:
        name = getattr(pipe, "row_name", None)
        if name and selected(name, inputs):
            outcomes.append(CheckOutcome(name, PIPELINE_TITLES[name], NOT_RUN, reason=selected(name, inputs)))
            summaries[name] = None
            continue
        try:
            outcome, summary, level = pipe(art)
        except ForensicsError as exc:  # the pipeline's own refusal: its row only, as for a check
            if not name or not is_refusal(exc):
                raise
            outcome, summary, level = CheckOutcome(name, PIPELINE_TITLES[name], NOT_RUN,
                                                   reason=f"cannot run: {exc.detail}"), None, OK
        outcomes.append(outcome)
        summaries[outcome.name] = summary
        extra = max(extra, level, key=_LEVEL_RANK.__getitem__)
    outcomes = settle_baseline(join_replay(outcomes, art.memoised("replay-report")), SYMPTOM_ROWS)
    if art.memoised("train-skipped"):
        outcomes.append(inputs_row(art.memoised("train-skipped")))
    return DoctorReport(inputs, outcomes, align=summaries.get("wiring"), replay=summaries.get("replay"),
                        extra_level=extra)


def inputs_row(skipped: list[str]) -> CheckOutcome:
    """The model directories found inside ``--train`` and skipped (records only are read there), said as context."""
    msg = (f"--train: skipped {len(skipped)} model director{'y' if len(skipped) == 1 else 'ies'} or capture sweep"
           f"{'' if len(skipped) == 1 else 's'} inside it ({', '.join(skipped[:8])}{' ...' if len(skipped) > 8 else ''})"
           ": only training record files are read there")
    return CheckOutcome("inputs", "the inputs, recognised by content", CLEAN,
                        (Finding("train-models-skipped", "info", msg),), msg)


def join_replay(outcomes: list[CheckOutcome], rep: Any) -> list[CheckOutcome]:
    """Put replay's numbers where they answer a check: the cost of the ignored flags in ``flag-ignored``'s
    message, and whether the drafter's acc@1 reaches the vocabulary's ceiling in the coverage row's note."""
    if rep is None or rep.trained is None:
        return outcomes
    trained, served = rep.trained, rep.served
    out = []
    for o in outcomes:
        if o.name == "flags" and served is not None:
            cost = (f" Replay on the capture: accept length {served.accept_length:.2f} as served (without "
                    f"{', '.join(served.served_without)}) against {trained.accept_length:.2f} as trained "
                    f"({served.accept_length - trained.accept_length:+.2f}).")
            o = replace(o, findings=tuple(replace(f, message=f.message + cost)
                                          if f.code == "flag-ignored" and f.severity == "warning" else f
                                          for f in o.findings))
        if o.name == "vocab-coverage" and "capture" in o.data.get("sources", {}):
            ceiling = o.data["sources"]["capture"]
            if ceiling["exact"] and ceiling["share"] < 1.0 and trained.acc[0] >= 0.9 * ceiling["share"]:
                o = replace(o, note=f"{o.note}; replay's acc@1 {trained.acc[0]:.2f} reaches the capture's ceiling "
                                    f"{ceiling['share']:.2f}: a larger draft vocabulary is what would raise it")
        out.append(o)
    return out
