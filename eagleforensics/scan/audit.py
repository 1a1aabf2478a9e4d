"""The training-data audit against a target, for a batch of records: what ``doctor --train --target`` and ``scan --target`` share.

``TargetAudit.load(TARGET_DIR)`` reads what the audit needs once: where the lm_head and final norm
are (``agreement.head_spec``; the weights themselves are read by each worker a vocabulary chunk at
a time) and, when the directory holds a tokenizer with a chat template, its skeleton
(``templates.learn_skeleton``). It is small and picklable, so a scan ships it to its workers.
``audit_records`` turns loaded records into audit lines (``dataaudit``): each record's shape and
template reading, and the agreement of up to ``max_tokens`` supervised tokens per record, scored
in ONE pass over the lm_head for the whole batch (a 128k x 4096 head is read once per batch, not
once per record).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import as_array, f32
from ..errors import ForensicsError
from ..dataaudit import audit as da
from ..dataaudit import templates as tpl
from ..dataaudit.agreement import Agreement, HeadSpec, TargetHead, head_spec, supervised_positions
from ..io.modeldir import ModelDir

DEFAULT_MAX_TOKENS = 256  # supervised tokens scored per record (evenly spread); enough for a 3% standard error


@dataclass
class TargetAudit:
    """What the audit knows of the target: its head (where), its template skeleton (or why there is none)."""

    path: str
    head: HeadSpec | None
    head_error: str | None
    skeleton: tpl.Skeleton | None
    skeleton_error: str | None
    controls: frozenset[int] = frozenset()  # added tokens of the tokenizer but BOS/pad: "template tokens"
    tokenizer_dir: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    _scorer: Any = field(default=None, repr=False)
    _tok: Any = field(default=None, repr=False)

    @classmethod
    def load(cls, target: str | Path, *, max_tokens: int = DEFAULT_MAX_TOKENS, tokenizer: str | Path | None = None
             ) -> "TargetAudit":
        """Read the target's head location and its chat template; a part that cannot be read is recorded, not raised,
        so the other part still runs (a target without tokenizer.json still gets the agreement)."""
        from ..io.tokenizer import has_tokenizer, load_tokenizer

        model = ModelDir(target, "target directory")
        head = head_err = None
        try:
            head = head_spec(model)
        except ForensicsError as exc:
            head_err = exc.detail
        skel = skel_err = None
        controls: frozenset[int] = frozenset()
        tok_dir = Path(tokenizer) if tokenizer is not None else Path(target)
        missing = [m for m in ("tokenizers", "jinja2") if importlib.util.find_spec(m) is None]
        if missing:
            skel_err = (f"reading the target's tokenizer and chat template needs {' and '.join(missing)}: "
                        "pip install 'eagleforensics[audit]'")
        elif has_tokenizer(tok_dir):
            tok = load_tokenizer(tok_dir)
            if tok.chat_template is None:
                skel_err = "the target's tokenizer has no chat template (a base model?): nothing to compare records with"
            else:
                skel = tpl.learn_skeleton(tok)
            specials = {tok.token_id(tok.specials[k]) for k in ("bos_token", "pad_token") if k in tok.specials}
            controls = frozenset(tok.added_ids - specials)
        else:
            skel_err = f"no tokenizer.json in {tok_dir}: the template checks need the target's tokenizer files"
        return cls(str(target), head, head_err, skel, skel_err, controls, str(tok_dir) if skel or controls else None,
                   max_tokens)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_scorer", "_tok")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._scorer = None
        self._tok = None

    @property
    def scorer(self) -> TargetHead:
        if self._scorer is None:
            assert self.head is not None
            self._scorer = TargetHead(self.head)
        return self._scorer

    @property
    def tokenizer(self) -> Any:
        if self._tok is None and self.tokenizer_dir is not None:
            from ..io.tokenizer import load_tokenizer

            self._tok = load_tokenizer(self.tokenizer_dir)
        return self._tok

    def decode(self, ids: Any) -> str:
        tok = self.tokenizer
        return tok.decode(ids) if tok is not None else " ".join(str(int(i)) for i in ids)

    def to_dict(self) -> dict[str, Any]:
        tok = self.tokenizer if self.skeleton is not None else None
        return {"path": self.path, "head": None if self.head is None else self.head.__dict__,
                "head_error": self.head_error, "skeleton_error": self.skeleton_error, "max_tokens": self.max_tokens,
                "skeleton": None if self.skeleton is None else self.skeleton.to_dict(tok.decode if tok else None)}


def _agreement_rows(record: Any, audit: TargetAudit, real: int, runs: list[tpl.Run] | None
                    ) -> tuple[np.ndarray, np.ndarray, str] | str:
    """(normalised final states [T, H], next ids [T], final kind) for a record's scored positions, or why none."""
    if record.loss_mask is None:
        return "no loss_mask: answers cannot be told from prompts"
    if record.input_ids is None:
        return "no input_ids"
    assert audit.head is not None
    final = da.final_entry(record, audit.head.hidden)
    if final is None:
        return f"no final hidden state {audit.head.hidden} wide (the target's hidden size)"
    skip = None
    if runs:
        skip = np.zeros(real, bool)
        for r in runs:
            skip[r.start:r.start + r.written_head] = True
            skip[max(r.start, r.stop - r.written_tail):r.stop] = True
    pos = supervised_positions(record.loss_mask, real, audit.max_tokens, input_ids=record.input_ids,
                               skip_ids=audit.controls, skip=skip)
    if not pos.size:
        return "no supervised tokens"
    data = as_array(final)
    live = data[:real]
    wide = f32(live)  # widened once (a Kimi-size record's final is 58 MB as float32)
    ok = np.isfinite(wide).all(-1) & (wide != 0).any(-1)
    del wide
    post, why = audit.scorer.state_kind(live[ok])
    rows = f32(data[pos], copy=True)
    keep = np.isfinite(rows).all(-1)
    # a row that is all zeros (or constant: nothing but a bias) makes the lm_head's logits flat or the same for
    # every position: every token ties for first and is "as likely as the target's own", so it would read as
    # 100% agreement. Such rows are no evidence of who wrote the answer: left out, and said so when all are.
    with np.errstate(invalid="ignore", over="ignore"):
        keep &= np.ptp(np.where(np.isfinite(rows), rows, 0.0), axis=-1) > 0
    degenerate = int(np.isfinite(rows).all(-1).sum() - keep.sum())
    rows, pos = rows[keep], pos[keep]
    if not pos.size and degenerate:
        return (f"the final hidden states at all {degenerate} scored supervised positions are zero or constant: no "
                "evidence of who wrote the answers (was the final state filled when the records were dumped?)")
    if pos.size >= 2 and bool((rows == rows[:1]).all()):  # one state repeated: the same distribution everywhere
        return (f"the final hidden state is the same vector at all {pos.size} scored supervised positions: no "
                "evidence of who wrote the answers (a state broadcast or copied when the records were dumped?)")
    x = rows if post else audit.scorer.normalize(rows)
    ids = np.asarray(as_array(record.input_ids)).reshape(-1)
    return x, ids[pos + 1], "post-norm" if post else "raw"


@dataclass
class Prepared:
    """One record's audit line and the rows its agreement needs, kept instead of the record itself (a scan batch
    holds at most ``max_tokens`` rows of H floats per record, never whole records)."""

    line: dict[str, Any]
    x: np.ndarray | None = None  # normalised final states [T, H] float32
    nxt: np.ndarray | None = None  # the ids that follow them [T]


def prepare(path: str, record: Any, audit: TargetAudit) -> Prepared:
    """Shape and template reading of a record, and its scored rows (the lm_head pass comes later, per batch)."""
    shape = da.shape_line(record)
    line: dict[str, Any] = {"path": path, "shape": shape}
    runs = None
    if audit.skeleton is not None and record.input_ids is not None and record.loss_mask is not None:
        runs = tpl.classify_runs(record.input_ids, record.loss_mask, audit.skeleton, real=shape["real"],
                                 template=audit.controls, decode=audit.decode)
        line["template"] = da.template_summary(runs)
    if audit.head is None:
        return Prepared(line)
    try:
        got = _agreement_rows(record, audit, shape["real"], runs)
    except ForensicsError as exc:
        got = exc.detail
    if isinstance(got, str):
        line["agreement_skipped"] = got
        return Prepared(line)
    x, nxt, kind = got
    line["final_kind"] = kind
    return Prepared(line, x, nxt)


def score_prepared(batch: list[Prepared], audit: TargetAudit) -> list[dict[str, Any]]:
    """Score every prepared record's rows in one pass over the lm_head; returns the finished audit lines."""
    todo = [p for p in batch if p.x is not None and p.x.shape[0]]
    if todo:
        xs = np.concatenate([p.x for p in todo])
        ns = np.concatenate([p.nxt for p in todo])
        try:
            scores = audit.scorer.score(xs, ns)
        except ForensicsError as exc:
            for p in todo:
                p.line["agreement_skipped"] = exc.detail
        else:
            at = 0
            for p in todo:
                n = p.x.shape[0]
                p.line["agreement"] = Agreement.of(scores.take(at, at + n)).to_dict()
                at += n
    for p in batch:
        if p.x is not None and not p.x.shape[0]:
            p.line["agreement_skipped"] = "no scorable supervised tokens"
        p.x = p.nxt = None
    return [p.line for p in batch]


def audit_records(records: list[tuple[str, Any]], audit: TargetAudit) -> list[dict[str, Any]]:
    """Audit lines of ``(path, TrainingRecord)`` pairs: shape, template reading and target agreement (one head pass)."""
    return score_prepared([prepare(path, record, audit) for path, record in records], audit)


def served_summary(audit: TargetAudit, prompts: list[Any] | None = None, capture_ids: Any = None,
                   source: str = "") -> da.ServedSummary | None:
    """The served side read against the skeleton: prompts (``io.servedprompts.ServedPrompt``) or a capture's ids."""
    if audit.skeleton is None:
        return None
    reads: list[tpl.PromptRead] = []
    tok = audit.tokenizer
    for p in prompts or []:
        ids = p.token_ids(tok)
        reads.append(tpl.classify_prompt(ids, audit.skeleton, template=audit.controls, decode=audit.decode))
    if capture_ids is not None:
        reads.append(tpl.classify_prompt(capture_ids, audit.skeleton, template=audit.controls, decode=audit.decode))
    return da.ServedSummary.of(source, reads) if reads else None


def audit_context(audit: TargetAudit, served_prompts: str | Path | None = None, served_len: int | None = None
                  ) -> dict[str, Any]:
    """What a dataset-wide judgement needs besides the lines (kept in a scan's header): the target, its template
    facts, the served side read against the skeleton, the served length."""
    from ..io.servedprompts import load_served_prompts

    served = None
    if served_prompts is not None:
        prompts = load_served_prompts(served_prompts)
        if audit.skeleton is not None:
            s = served_summary(audit, prompts, source=f"--served-prompts {Path(served_prompts).name}")
            served = None if s is None else s.to_dict()
    return {"target": str(Path(audit.path).resolve()), "agreement_tokens": audit.max_tokens,
            "template": None if audit.skeleton is None else da.TemplateFacts.of(audit.skeleton).to_dict(),
            "head_error": audit.head_error, "skeleton_error": audit.skeleton_error, "served": served,
            "served_len": served_len}
