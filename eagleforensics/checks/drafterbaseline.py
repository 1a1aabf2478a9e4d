"""Replay judged: is the drafter better than a lookup table on its own training records and on the capture?

The drafter is run teacher-forced (``drafter.replay``) on each training record's own aux states
(its loss mask counts, as the trainers count acc_1) and on the capture's trained wiring, and its
step-1 acceptance is compared on the very same rows with three baselines that need no drafter
(``drafter.baseline``). Not better beyond two standard errors: ``drafter-no-better-than-baseline``,
with what the weights show (``checks.drafterweights``: missing or never-trained parts) as its likely
reason. Fewer than ``MIN_ROWS`` counted rows are reported, never judged.
"""
from __future__ import annotations

from typing import Any

from ..errors import ForensicsError
from ..drafter.baseline import MIN_ROWS, BigramTable, Judgement, judge, pooled, step1_rows
from ..results import Finding
from .base import Artifacts, Check, CheckResult, is_refusal
from .registry import register

MAX_RECORDS = 4  # records replayed (each a step-1 forward over its first RECORD_ROWS rows)
# rows replayed: a judgement needs hundreds of rows (MIN_ROWS, two SE), while a Kimi-size drafter's step-1 forward
# (twice: the drafter's own states and another row's) and the target's lm_head cost ~6 GFLOP a row: all rows of
# 4 records and the capture at T=2048 were 60 TFLOP, 10 minutes of a 2-core machine
RECORD_ROWS = 128  # of each record (512 over four)
CAPTURE_ROWS = 512
SOURCE = ("replay (the drafter teacher-forced on the same rows as the baselines: most frequent token, repeat the "
          "last token, bigram table fitted on the records' supervised rows, the drafter fed another row's states)")


def _weights_reason(art: Artifacts) -> str:
    """What the drafter-weights check sees, as the likely reason (empty when the weights look trained)."""
    from .drafterweights import missing_parts, random_parts

    missing = missing_parts(art)
    if missing:
        return f"the checkpoint lacks {', '.join(missing[:3])} (drafter-weights-missing)"
    flagged, _ = random_parts(art)
    if flagged:
        return f"its {', '.join(flagged)} never left the init (drafter-weights-random)"
    return ""


def as_served(art: Artifacts) -> frozenset[str]:
    """The drafter features the named engine drops (``io.served.SERVED_FEATURES`` names, its own embedding where
    the engine uses the target's): the baselines and replay's "as served" row run the drafter as that engine does,
    not as the checkpoint holds it (a random embedding SGLang replaces costs nothing there). The target's embedding
    stands in only when a target is given; a flags table that stops short of the release drops nothing."""
    from ..io.served import OWN_EMBEDDING, SERVED_FEATURES
    from .flags import served_without

    try:
        dropped = served_without(art)
    except ForensicsError as exc:  # the flags table stops short of this release: run as the checkpoint holds it
        if not is_refusal(exc):
            raise
        return frozenset()
    return frozenset(f for f in dropped if f in SERVED_FEATURES and (f != OWN_EMBEDDING or art.inputs.target))


def judgements(art: Artifacts, skipped: list[str] | None = None) -> list[Judgement]:
    """The records' and the capture's judgements (each present when that input was given and could be replayed);
    records that cannot be replayed as their own trained wiring are named in ``skipped``."""
    skipped = [] if skipped is None else skipped
    import torch

    from ..drafter.replay import DraftForward
    from ..io.drafter import check_finite, load_drafter, load_target
    from ..io.served import OWN_EMBEDDING
    from ..replay import capture_inputs, record_sequence

    i = art.inputs
    drop = as_served(art)
    on_host = i.device == "cpu"  # as replay loads it: embeddings and lm_head left in their files, read as used
    drafter = load_drafter(i.drafter, target=i.target, target_embed=OWN_EMBEDDING in drop, lazy=True,
                           check_finite=on_host)
    spec = drafter.spec
    head = None if i.target is None else load_target(
        i.target, embed=False, expect={"lm_head": (spec.vocab_size, spec.target_hidden_size),
                                       "norm": (spec.target_hidden_size,)}, lazy=True)
    fwd = DraftForward.of(drafter, i.device, drop, consume=True)  # widened in place: no stored copy beside it
    if not on_host:
        check_finite(fwd.w, i.drafter)
    table = BigramTable()
    fitted: list[Any] = []
    fitted_ids: list[Any] = []  # the ids each fitted record's rows came from
    records = art.records[:MAX_RECORDS] if art.available("train") else []
    for rec in records:
        try:  # a record replay cannot read as the trained wiring (a list layout of unnamed states) is left out
            seq, aux_rows, y, _ = record_sequence(rec, spec, head, i.device, RECORD_ROWS)
        except ForensicsError as exc:
            skipped.append(f"{rec.path}: {exc.detail}")
            continue
        mask = seq.loss_mask
        rows = step1_rows(fwd, aux_rows, seq.ids, y, mask, fitted=True)
        table.add(rows.prev, rows.want)
        fitted.append(rows)
        fitted_ids.append(seq.ids)
    out = [judge("records", fitted, table)] if fitted else []
    if art.available("capture"):
        # the trained wiring from the wiring row's alignment (computed once per run), as replay reads it
        trained: Any = records[0] if records else None
        if records and art.record_paths:
            try:
                trained = art.aligned()
            except ForensicsError:  # the wiring row says why; the record is aligned here without the engine's check
                pass
        inp = capture_inputs(art.capture, spec, head, trained, [], None, None, None, None,
                              i.device, CAPTURE_ROWS, 0.0, i.allow_unsafe)
        jobs = [j for j in inp.jobs if "trained" in j[0].sources] or inp.jobs[:1]
        if jobs:
            w, reader, label = jobs[0]
            mask = inp.seq.loss_mask
            if mask is not None and not bool(torch.as_tensor(mask).bool().any()):
                mask = None  # a capture of the prompt only: every row counts (as replay does)
            rows = step1_rows(fwd, reader, inp.seq.ids, inp.y, mask, fitted=False)
            trained = "trained" in w.sources
            out.append(judge("capture", [rows], _table_without(fitted, fitted_ids, inp.seq.ids, table),
                             f"{label}, {'the trained wiring' if trained else 'the engines default wiring'}"))
    return out


def _table_without(fitted: list[Any], fitted_ids: list[Any], capture_ids: Any, table: BigramTable) -> BigramTable:
    """The bigram table for the capture's rows, fitted on the records that do not hold the captured sequence: a
    table fitted on the very rows it scores would have memorised them (leave-one-out, as on the records)."""
    from ..evidence.recordmatch import same_sequence

    keep = [rows for rows, ids in zip(fitted, fitted_ids) if not same_sequence(ids, capture_ids)]
    if len(keep) == len(fitted):
        return table
    out = BigramTable()
    for rows in keep:
        out.add(rows.prev, rows.want)
    return out


def run(art: Artifacts) -> CheckResult:
    left_out: list[str] = []
    try:
        found = judgements(art, left_out)
    except ForensicsError as exc:
        return CheckResult(skipped=f"replay cannot run this drafter: {exc.detail}")
    if not found:
        return CheckResult(skipped="no record or capture could be replayed: " + "; ".join(left_out[:2]))
    drop = sorted(as_served(art))
    data = {"judgements": [j.to_dict() for j in found], "min_rows": MIN_ROWS, "records_left_out": left_out,
            "served_without": drop}
    both = pooled(found)  # one verdict over all rows: records and capture judged together
    data["pooled"] = both.to_dict()
    bad = ([j for j in found if j.no_better] or found) if both.no_better else []
    served = f"as {art.engine} serves it (without {', '.join(drop)}): " if drop else ""
    note = served + "; ".join(j.text() + ("" if j.judged else f" (fewer than {MIN_ROWS} rows or a lookup table "
                                                              "predicts them already: not judged)") for j in found)
    if not bad:
        return CheckResult((), note, data)
    reason = _weights_reason(art)
    why = (f"; the weights say why: {reason}" if reason else
           "; its weights look trained, so the likely reasons are states unlike those it learned on (see the wiring "
           "row), an fc, head or layer swapped in from another checkpoint, or a drafter trained for another target"
           + (" (it does no better on the target's states than on another row's: its fc reads nothing from them)"
              if any(j.best == "shuffled" for j in bad) else ""))
    msg = (f"the drafter{' ' + served.rstrip(': ') if served else ''} is no better than a lookup table: "
           + "; ".join(j.text() for j in bad) + why)
    return CheckResult((Finding(
        "drafter-no-better-than-baseline", "error", msg,
        fix="Serve a drafter that was trained for this target and exported whole (replay it on its own training "
            "record: a trained drafter beats these baselines by far there).",
        source=SOURCE, impact="collapse"),), note, data)


CHECK = register(Check("drafter-baseline", "replay judged: the drafter against baselines on the same rows",
                       ("drafter-no-better-than-baseline",), ("drafter", "train|capture"), run, order=16))


def settle(outcomes: list[Any], symptom_rows: tuple[str, ...] = ()) -> list[Any]:
    """One cause is one cause: where another check (not the weights, which say why, nor the ``symptom_rows`` that
    only measure, such as replay's) already names a cause, the drafter's failing against the baselines is that
    cause's measured symptom, kept as context that names it."""
    from dataclasses import replace

    from .base import FLAGGED, FOUND

    others = sorted({f.code for o in outcomes if o.name not in (CHECK.name, "drafter-weights", *symptom_rows)
                     and o.status == FOUND
                     for f in o.findings if f.severity in FLAGGED})  # a clean row's warnings name no cause
    if not others:
        return outcomes
    out = []
    for o in outcomes:
        if o.name == CHECK.name and any(f.code == "drafter-no-better-than-baseline" for f in o.findings):
            o = replace(o, status=FOUND, findings=tuple(  # found, as info: not "clean" beside what it says
                replace(f, severity="info", message=f"{f.message}; explained by {', '.join(others)}", fix="",
                        impact="") for f in o.findings))
        out.append(o)
    return out
