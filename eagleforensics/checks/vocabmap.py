"""The vocabulary map: a reduced draft vocabulary needs ``d2t`` offsets in the checkpoint, in the engines' convention.

``d2t-missing`` (error): ``draft_vocab_size`` < ``vocab_size`` and no ``d2t`` tensor, so SGLang and vLLM
read draft id i as target id i (a side file or a ``t2d`` alone does not help: both skip ``t2d``);
also (warning) a ``d2t`` of all zeros, the placeholder for "the first N ids".
``d2t-absolute`` (error): target ids stored where offsets belong (``arange`` written instead of
offsets: draft id i becomes i + id). ``d2t-invalid`` (error): not integers, a size unlike
``draft_vocab_size``, ids out of range, duplicates, or a ``d2t`` that disagrees with ``t2d``.
Engine facts: ``engines.embedrules.D2T_RULES``, one row per engine read at every release it spans (SGLang 0.4.10 -
0.5.23, vLLM 0.9.2 - 0.34.0). A message names the user's engine release (``--engine`` / ``--engine-version`` or the
log), the newest read when only the engine is known, both engines with none; a release not read is said so.
"""
from __future__ import annotations

from ..engines.embedrules import D2TReading, d2t_reading
from ..results import Finding
from .base import Artifacts, Check, CheckResult
from .draftvocab import MapDiagnosis, VocabMap, diagnose_map, read_vocab_map
from .registry import register

MISSING_THREADS = "vllm-project/vllm#18909, NVIDIA-NeMo/Automodel#2447, verl-project/verl-SpeCo#66"
ABSOLUTE_THREADS = "verl-project/verl-SpeCo#67, vllm-project/vllm#18909"
INVALID_THREADS = "SafeAILab/EAGLE#248, vllm-project/vllm#18909"
REBUILD = "d2t = nonzero(t2d) - arange(draft_vocab_size), int64, saved in the checkpoint as 'd2t'"


def diagnosis(art: Artifacts) -> tuple[VocabMap, MapDiagnosis]:
    """The drafter's vocabulary map and its diagnosis, computed once per doctor run (coverage reads it too)."""
    def make() -> tuple[VocabMap, MapDiagnosis]:
        vm = read_vocab_map(art)
        return vm, diagnose_map(vm)
    return art.memo("vocab-map", make)


def engines(reading: D2TReading, art: Artifacts) -> tuple[str, str]:
    """(lead, subject) for "{lead}{subject} serve(s) ...": the release asked and not read first, then the rows read;
    where the release came from (the log), or how to name it when the newest read is assumed."""
    lead = f"{reading.unread} is not read for this release; at the releases read, " if reading.unread else ""
    who = reading.who("the log does not say which: pass --engine-version" if art.inputs.log is not None else
                      "pass --engine-version or --log")
    if reading.release and art.engine_version_from:
        who += f" (version from {art.engine_version_from})"
    return lead, who


def run(art: Artifacts) -> CheckResult:
    """Diagnose ``d2t`` against ``draft_vocab_size``, the vocabulary and ``t2d``."""
    vm, dx = diagnosis(art)
    n, v = vm.draft_vocab_size, vm.vocab_size
    reading = d2t_reading(art.engine, art.engine_version)
    lead, who = engines(reading, art)
    plural = len(reading.rows) > 1
    data = {"vocab_size": v, "draft_vocab_size": n, "d2t": vm.d2t_name, "t2d": vm.t2d_name, "convention": dx.kind,
            "engine_rows": [f"{r.engine} {r.span()}" for r in reading.rows],
            "engine_rules": [r.detail for r in reading.rows], "release_assumed":
            reading.release if reading.assumed else None, "release_not_read": reading.unread or None, **dx.data}
    sizes = f"draft_vocab_size {n} < vocab_size {v}"
    if dx.kind == "full":
        return CheckResult((), f"no reduced vocabulary (draft_vocab_size {n} = vocab_size {v}): nothing to map", data)
    if dx.kind == "ok":
        return CheckResult((), f"d2t holds offsets for {n} draft ids, in range and distinct"
                           + (", and agrees with t2d" if vm.t2d is not None else ""), data)
    if dx.kind == "missing":
        extra = []
        if vm.t2d_name is not None:
            extra.append(f"the checkpoint has {vm.t2d_name} but {'they skip' if plural else 'it skips'} t2d at load")
        if vm.side_files:
            extra.append(f"{', '.join(vm.side_files)} beside the weights is never read (no release read loads a map "
                         "file for an EAGLE-3 drafter)")
        msg = (f"{sizes} and the drafter stores no d2t: {lead}{who} then {'take' if plural else 'takes'} draft id i "
               f"as target id i, so every draft lands on one of the first {n} target ids, mostly the wrong one"
               + ("; " + "; ".join(extra) if extra else "") + ".")
        fix = ("Write the map into the checkpoint: " + REBUILD + "." if vm.t2d_name is not None else
               "Export d2t with the weights (the trainer's vocabulary map, as offsets: target id - draft id), or "
               "retrain with the full vocabulary.")
        return CheckResult((Finding("d2t-missing", "error", msg, fix=fix,
                                    source=f"{MISSING_THREADS}; {reading.source()}", impact="collapse"),), data=data)
    if dx.kind == "placeholder":
        lost = dx.intended is not None and not (dx.intended == dx.served).all()
        msg = (f"{sizes} and every d2t offset is 0: the map says the draft vocabulary is the first {n} target ids, "
               "the placeholder an exporter or loader leaves when the real map is lost")
        if lost:
            msg += "; t2d names other ids, so the drafter's head was trained for a vocabulary the engines never map to"
        msg += "."
        return CheckResult((Finding(
            "d2t-missing", "error" if lost else "warning", msg,
            fix=("Write the real map: " + REBUILD + "." if lost else
                 "Export the trainer's real vocabulary map as d2t, or check the vocab-coverage row: the first ids "
                 "are rarely the tokens the target emits."),
            source=f"{MISSING_THREADS}; {reading.source()}", impact="collapse" if lost else "high"),), data=data)
    if dx.kind == "absolute":
        msg = (f"d2t holds target ids, not offsets from arange: {'; '.join(dx.evidence)}. {lead}{who} "
               f"{'serve' if plural else 'serves'} draft id i as target id i + d2t[i], so nearly every draft is a "
               "token the drafter never meant.")
        return CheckResult((Finding("d2t-absolute", "error", msg,
                                    fix="Store offsets: d2t = target_ids - arange(draft_vocab_size).",
                                    source=f"{ABSOLUTE_THREADS}; {reading.source()}", impact="collapse"),), data=data)
    msg = "d2t is not a usable map: " + "; ".join(dx.problems) + "."
    return CheckResult((Finding("d2t-invalid", "error", msg,
                                fix="Re-export d2t from the trainer's vocabulary: int64, one offset per draft id "
                                    f"({n}), target ids distinct and below {v}" +
                                    (f"; from t2d: {REBUILD}" if vm.t2d_name else "") + ".",
                                source=f"{INVALID_THREADS}; {reading.source()}", impact="collapse"),), data=data)


CHECK = register(Check("vocab-map", "d2t vocabulary map (draft id -> target id)",
                       ("d2t-missing", "d2t-absolute", "d2t-invalid"), ("drafter",), run, order=20))
