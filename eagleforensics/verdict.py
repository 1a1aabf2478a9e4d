"""Verdict levels: will this deployment work as trained? OK, ACTION or PROBLEM, with what to do.

* ``OK``: every slot placed, nothing miswired, and the record is served as trained by the
  engine asked about (``--engine``), or, with no engine named, by every engine's default ids.
* ``ACTION``: every slot placed, but an engine must be told the ids: ``actions`` holds, per
  engine, the exact snippet to write (JSON for a draft config, YAML for TensorRT-LLM).
* ``PROBLEM``: a slot unplaced, a miswiring no id list can fix, too few tokens, or a record
  and capture that are not the same data. ``todo`` says what to do.

Exit codes follow the levels: 0 for OK (nothing to do), 1 for ACTION and PROBLEM (something to
do); 2 stays "bad input", decided before any verdict exists. This module sits at the bottom
with ``results``: it reads the result's records only, so the report and the CLI share one rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .records import SEVERITY_ORDER, EngineAdvice, Finding, SlotMatch, by_severity  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # pragma: no cover
    from .evidence.confidence import Thresholds
    from .evidence.tokens import TokenAlignment
    from .records import CrossCheck


class Aligned(Protocol):
    """What ``judge`` reads of an alignment (``results.AlignmentResult`` is one): named by its parts, so this
    module need not import ``results``, which imports it."""

    matches: list[SlotMatch]
    findings: list[Finding]
    serving: CrossCheck | None
    thresholds: Thresholds
    tokens: TokenAlignment

OK, ACTION, PROBLEM = "OK", "ACTION", "PROBLEM"
LEVELS = (OK, ACTION, PROBLEM)
EXIT_CODES = {OK: 0, ACTION: 1, PROBLEM: 1}
# the one severity mapping every surface shares (align, doctor, the report, the JSON): an error is something broken
# that no setting fixes (PROBLEM), a warning something to write or change (ACTION), info context (OK)
LEVEL_OF_SEVERITY = {"error": PROBLEM, "warning": ACTION, "info": OK}
SEVERITY_OF_LEVEL = {level: severity for severity, level in LEVEL_OF_SEVERITY.items()}
# serving-mismatch is a warning where a snippet fixes it and an error where nothing does; the serving
# check's own status decides the level (ACTION or PROBLEM), so its severity already agrees with it
_SERVING_CODES = ("serving-mismatch",)


@dataclass(frozen=True)
class Verdict:
    """The level, a one-line summary, the snippets to write (ACTION) and what to do (PROBLEM)."""

    level: str
    summary: str
    actions: list[EngineAdvice] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.level]

    @property
    def line(self) -> str:
        """``LEVEL: summary``: the one line the CLI, the report and strict notebooks print."""
        return f"{self.level}: {self.summary}"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "summary": self.summary, "exit_code": self.exit_code,
                "actions": [a.to_dict() for a in self.actions], "todo": list(self.todo)}


def _placed(result: Aligned) -> str:
    return "; ".join(f"{m.name} = {m.position.label}" for m in result.matches if m.position is not None)


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".")


def _loose_todo(m: SlotMatch) -> str:
    """What to do about one slot that is not placed, by why its identity is open."""
    cand = m.best.label if m.best else "none"
    if m.identity == "best-among-captured":
        return (f"{m.name}: {m.reason}. Capture every position (a full sweep, p = 0..N) so the match can be "
                "compared with its neighbours.")
    if m.identity == "ambiguous":
        return (f"{m.name}: {m.reason}. The capture cannot tell these positions apart; check in the dumper's code "
                "which layer it read, and set the ids for that one.")
    if m.identity == "between":
        return (f"{m.name}: {m.reason}. Check where the dumper reads it (a hook inside the decoder layer, or the "
                "residual returned by a fused add-norm) and dump a layer boundary instead.")
    if m.identity == "position-unknown":
        return (f"{m.name}: {m.reason}. Capture a full sweep (p = 0..N, e.g. with eagleforensics capture), or pass "
                "--capture-convention for what the capture's integers mean.")
    if m.identity == "rows-unverified":
        return (f"{m.name}: {m.reason}. Store the token ids with the record and the capture, so rows pair by id.")
    return (f"{m.name}: best candidate {cand} is not confident ({m.reason}); capture the record's own prompt on "
            "the model the record was dumped from.")


def judge(result: Aligned) -> Verdict:
    """The verdict of one alignment (see the module docstring for the levels)."""
    r = result
    n = len(r.matches)
    loose = [m for m in r.matches if not m.confident]
    errors = [f for f in by_severity(r.findings) if f.severity == "error" and f.code not in _SERVING_CODES]
    advice = list(getattr(r, "advice", []) or [])
    workable = [a for a in advice if a.snippet is not None]
    swapped = [f for f in r.findings if f.code == "possibly-swapped"]
    if swapped:  # every remedy below would be for inputs given the wrong way round: the hint comes first
        return Verdict(PROBLEM, _first_sentence(swapped[0].message) + ".",
                       todo=["Check the order: align TRAIN CAPTURE takes the training record first and the capture "
                             "sweep second; run it again with the two swapped."])
    if r.tokens.length < r.thresholds.min_tokens:
        return Verdict(PROBLEM, f"only {r.tokens.length} tokens could be paired ({r.tokens.note}), too few to place "
                                "any slot.", todo=["Capture the same prompt the record holds (a longer one), so at "
                                                   f"least {r.thresholds.min_tokens} tokens pair up."])
    open_kinds = {m.identity for m in loose} & {"position-unknown", "between", "rows-unverified"}
    if loose and len(loose) == n and open_kinds:
        why = {"position-unknown": "slots match capture entries whose labels give no position",
               "between": "slots sit between two positions (mid-layer states)",
               "rows-unverified": "the rows were paired without ids and nothing vouches for them"}
        return Verdict(PROBLEM, "no slot has a confident position: " + "; ".join(why[k] for k in sorted(open_kinds))
                       + ".", todo=[_loose_todo(m) for m in loose])
    if loose and len(loose) == n:
        return Verdict(PROBLEM, "no slot has a confident match: this record and this capture do not come from the "
                                "same model and prompt, or the capture misses the layers the record holds.",
                       todo=["Check that the capture is of the target model the drafter was trained for, on a "
                             "prompt the record holds, with every layer (p = 0..N) dumped."])
    if errors or loose:
        parts = []
        if errors:
            parts.append(f"miswired: {_first_sentence(errors[0].message)}.")
        if loose:
            parts.append(f"{len(loose)} of {n} slots have no confident match ({', '.join(m.name for m in loose)}).")
        todo = [f.message for f in errors]
        todo += [_loose_todo(m) for m in loose]
        if errors and workable and len(workable) < len(advice):
            names = ", ".join(a.engine for a in workable)
            todo.append(f"Only {names} can serve this record as trained (its snippet is shown with the verdict); "
                        "better: regenerate the training data at the layers the engines capture.")
        return Verdict(PROBLEM, " ".join(parts) + (f" Placed: {_placed(r)}." if _placed(r) else ""),
                       actions=workable if errors else [], todo=todo)
    check = r.serving
    if check is not None:
        who = f"{check.target}" + (f" {check.version}" if check.version else "")
        if check.status == "match":
            return Verdict(OK, f"all {n} slots placed ({_placed(r)}); {who} serves them as trained.")
        if workable:
            return Verdict(ACTION, f"all {n} slots placed ({_placed(r)}), but {who} will capture other layers: "
                                   f"write the ids below ({', '.join(f'{a.engine} {a.ids}' for a in workable)}).",
                           actions=workable)
        why = next((f.message for f in check.findings if f.severity == "error" or f.code == "serving-unjudged"),
                   "no id list on this engine captures the trained positions")
        return Verdict(PROBLEM, f"{who} cannot serve what was trained: {_first_sentence(why)}.", todo=[why])
    todo_now = [a for a in advice if not a.at_default]
    if not advice or not todo_now:
        where = "every engine's default ids serve them as trained" if advice else "no aux slots, so no ids apply"
        return Verdict(OK, f"all {n} slots placed ({_placed(r)}); {where}.")
    if not workable:
        return Verdict(PROBLEM, f"all {n} slots placed ({_placed(r)}), but no engine can capture them.",
                       todo=[f"{a.engine}: {'; '.join(a.notes)}" for a in advice])
    needed = [a for a in todo_now if a.snippet is not None]
    cannot = [a for a in advice if a.snippet is None]
    todo = [f"{a.engine} cannot serve it: {'; '.join(a.notes) or 'no id list captures these positions'}"
            for a in cannot]
    return Verdict(ACTION, f"all {n} slots placed ({_placed(r)}), but not at the engines' default layers: write "
                           f"the ids explicitly ({', '.join(f'{a.engine} {a.ids}' for a in needed)}).",
                   actions=needed, todo=todo)
