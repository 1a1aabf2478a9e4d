"""Training data audit, per record and over a dataset: shape, target agreement, template skeletons; the findings.

Per record (``record_line``): real and supervised token counts, the target agreement sums of its
supervised tokens (``agreement.Agreement``, scored by the caller in batches), and the reading of
every supervised run against the target's chat-template skeleton (``templates.classify_runs``).
Over records (``AuditSummary``): the same sums merged, length percentiles, histograms of
skeletons and think states, and the judgement, as stable finding codes:

* ``data-not-from-target``: the supervised tokens are less likely under the target than its own
  samples would be (mean surprise above ``agreement.SURPRISE_MAX`` nats/token and z above
  ``agreement.Z_MIN``), dataset-wide or per record;
* ``template-mismatch``: the answers do not follow the target's assistant header (another
  template, or raw text), or the served prompts carry another template or none (raw completions);
* ``thinking-mismatch``: the records answer in another think mode than the one served;
* ``loss-mask-shifted``: supervised runs start one token after (or before) the header;
* ``train-shorter-than-served``: the served context is longer than any training record.
"""
from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

import numpy as np

from ..arrays import as_array
from ..records import Finding
from . import templates as tpl
from .agreement import MIN_TOKENS, SHAPE_CHI2, SURPRISE_MAX, Z_MIN, Agreement

ORIGIN_SOURCE = ("sgl-project/SpecForge#533, sgl-project/SpecForge#128, vllm-project/speculators#751, "
                 "SafeAILab/EAGLE#98 (docs/causes.md row 4)")
TEMPLATE_SOURCE = ("SafeAILab/EAGLE#196, sgl-project/SpecForge#296, lightseekorg/tokenspeed#1305 "
                   "(docs/causes.md row 6)")
SHIFT_SOURCE = "sgl-project/SpecForge#885 (fix proposed in #895); vllm-project/speculators#865"
LENGTH_SOURCE = "vllm-project/speculators#684, sgl-project/sglang#6783 (docs/causes.md row 7)"
SHIFT_SHARE = 0.05  # shifted runs among the runs near the header: above this is a pipeline bug, not noise
MAJORITY = 0.5


def real_length(record: Any) -> int:
    """Tokens before SpecForge's right padding (``input_ids == 0`` and ``loss_mask == 0`` at the end)."""
    n = int(record.num_tokens)
    ids, mask = record.input_ids, record.loss_mask
    if ids is None:
        return n
    ids = np.asarray(as_array(ids)).reshape(-1)
    pad = (ids == 0) if mask is None else (ids == 0) & (np.asarray(as_array(mask)).reshape(-1) == 0)
    live = np.flatnonzero(~pad)
    return 0 if live.size == 0 else int(live[-1]) + 1


def final_entry(record: Any, hidden: int) -> Any:
    """The record's final-state array [S, H] (the last entry whose role is ``final`` and width ``hidden``), or None."""
    finals = [e.data for e in record.entries if e.role == "final" and int(e.data.shape[1]) == hidden]
    return finals[-1] if finals else None


def template_summary(runs: list[tpl.Run]) -> dict[str, Any]:
    """One record's runs as counts (JSON-able): starts, ends, the state and skeleton of its last run, other contexts."""
    last = runs[-1] if runs else None
    return {"runs": len(runs), "starts": dict(Counter(r.start_kind for r in runs)),
            "ends": dict(Counter(r.end_kind for r in runs)), "state": None if last is None else last.state,
            "skeleton": None if last is None else last.skeleton,
            "skeletons": dict(Counter(r.skeleton for r in runs if r.skeleton))}


def shape_line(record: Any) -> dict[str, Any]:
    """Tokens, real (unpadded) tokens, supervised tokens and supervised runs of one record."""
    real = real_length(record)
    mask = record.loss_mask
    sup = 0 if mask is None else int((np.asarray(as_array(mask)).reshape(-1)[:real] != 0).sum())
    return {"tokens": int(record.num_tokens), "real": real, "supervised": sup,
            "has_mask": mask is not None, "has_ids": record.input_ids is not None}


# ---------------------------------------------------------------------- the dataset

class AuditRow(NamedTuple):
    """One record's audit cut to what the judgement needs (a tuple of interned strings and numbers: a scan of
    100k records keeps one per record)."""

    real: int
    supervised: int
    has_mask: bool
    agreement: tuple[Any, ...] | None  # the fields of an Agreement, in order
    skipped: str | None
    final_kind: str | None
    starts: tuple[tuple[str, int], ...]
    ends: tuple[tuple[str, int], ...]
    state: str | None
    skeleton: str | None


def _intern(text: Any) -> str | None:
    return None if text is None else sys.intern(str(text))


def audit_row(line: dict[str, Any]) -> AuditRow | None:
    """An audit line (``scan.audit.audit_records``) as an ``AuditRow``; None when it has no shape."""
    shape = line.get("shape")
    if not shape:
        return None
    ag = line.get("agreement")
    sums = None
    if isinstance(ag, dict):
        a = Agreement.from_dict(ag)
        sums = tuple(getattr(a, f) for f in Agreement.__dataclass_fields__)
    t = line.get("template") if isinstance(line.get("template"), dict) else {}
    return AuditRow(int(shape.get("real") or 0), int(shape.get("supervised") or 0), bool(shape.get("has_mask")), sums,
                    _intern(line.get("agreement_skipped")), _intern(line.get("final_kind")),
                    tuple((_intern(k), int(n)) for k, n in (t.get("starts") or {}).items()),
                    tuple((_intern(k), int(n)) for k, n in (t.get("ends") or {}).items()),
                    _intern(t.get("state")), _intern(t.get("skeleton")))


@dataclass
class AuditSummary:
    """The audit rows of many records merged: shape, agreement and skeleton histograms; the findings judge them."""

    records: int = 0
    lengths: list[int] = field(default_factory=list)
    supervised: int = 0
    no_mask: int = 0
    agreement: Agreement = field(default_factory=Agreement)
    per_record: list[tuple[str, Agreement]] = field(default_factory=list)
    final_kinds: Counter = field(default_factory=Counter)
    starts: Counter = field(default_factory=Counter)
    ends: Counter = field(default_factory=Counter)
    states: Counter = field(default_factory=Counter)
    skeletons: Counter = field(default_factory=Counter)
    shifted_records: list[str] = field(default_factory=list)
    agreement_skipped: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, lines: Iterable[dict[str, Any]]) -> "AuditSummary":
        """Merge the audit of many lines: an audit line itself (``path``, ``shape``, ...) or a scan line whose
        ``audit`` holds one (dict or ``AuditRow``); lines without one are skipped."""
        s = cls()
        for line in lines:
            row = line.get("audit", line)
            if isinstance(row, dict):
                row = audit_row(row)
            if isinstance(row, AuditRow):
                s.add(str(line.get("path")), row)
        return s

    def add(self, path: str, row: AuditRow) -> None:
        self.records += 1
        self.lengths.append(row.real)
        self.supervised += row.supervised
        self.no_mask += 0 if row.has_mask else 1
        if row.agreement is not None:
            a = Agreement(*row.agreement)
            self.agreement = self.agreement + a
            self.per_record.append((path, a))
        elif row.skipped:
            self.agreement_skipped[row.skipped] += 1
        if row.final_kind:
            self.final_kinds[row.final_kind] += 1
        starts = dict(row.starts)
        self.starts.update(starts)
        self.ends.update(dict(row.ends))
        if row.state:
            self.states[row.state] += 1
        if row.skeleton:
            self.skeletons[row.skeleton] += 1
        if starts.get(tpl.START_LATE) or starts.get(tpl.START_EARLY):
            self.shifted_records.append(path)

    # ------------------------------------------------------------------ figures
    def percentiles(self) -> dict[str, int | None]:
        """p50, p95 and max of the real record lengths."""
        if not self.lengths:
            return {"p50": None, "p95": None, "max": None}
        a = np.asarray(self.lengths)
        return {"p50": int(np.percentile(a, 50)), "p95": int(np.percentile(a, 95)), "max": int(a.max())}

    def flagged_records(self) -> list[tuple[str, Agreement]]:
        """Records whose own supervised tokens are judged not written by the target."""
        return [(p, a) for p, a in self.per_record if a.verdict == "not-from-target"]

    def bulk(self) -> Agreement:
        """The agreement of the records not flagged one by one (a few foreign records do not decide for the rest)."""
        return sum((a for _, a in self.per_record if a.verdict != "not-from-target"), Agreement())

    @property
    def origin_verdict(self) -> str:
        """``not-from-target`` when most records are flagged one by one or the rest together are; ``some-records``
        when a minority is flagged; else the pooled verdict (``from-target`` or ``too-few``)."""
        flagged = len(self.flagged_records())
        if not self.per_record:
            return "too-few"
        if flagged > MAJORITY * len(self.per_record) or self.bulk().verdict == "not-from-target":
            return "not-from-target"
        if flagged:
            return "some-records"
        return self.agreement.verdict

    def agreement_histogram(self, bins: int = 20) -> dict[str, list[float]]:
        """Per-record greedy agreement: bin edges and counts (records with scored tokens)."""
        values = [a.agreement for _, a in self.per_record if a.tokens]
        counts, edges = np.histogram(values, bins=bins, range=(0.0, 1.0))
        return {"edges": [round(float(e), 4) for e in edges], "counts": [int(c) for c in counts]}

    def to_dict(self) -> dict[str, Any]:
        """Everything for the JSON: counts, percentiles, agreement figures, histograms."""
        flagged = self.flagged_records()
        return {"records": self.records, "supervised_tokens": self.supervised, "records_without_loss_mask": self.no_mask,
                "length": self.percentiles(), "agreement": self.agreement.to_dict() if self.agreement.tokens else None,
                "origin_verdict": self.origin_verdict if self.agreement.tokens else None,
                "records_scored": len(self.per_record), "records_not_from_target": len(flagged),
                "agreement_skipped": dict(self.agreement_skipped), "final_state": dict(self.final_kinds),
                "agreement_histogram": self.agreement_histogram() if self.per_record else None,
                "run_starts": dict(self.starts), "run_ends": dict(self.ends), "answer_states": dict(self.states),
                "skeletons": dict(self.skeletons.most_common()), "shifted_records": len(self.shifted_records)}


# ---------------------------------------------------------------------- judgements

def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.0f}%" if total else "-"


def _figures(a: Agreement, records: int) -> str:
    return (f"over {a.tokens:,} supervised tokens of {records} records: greedy agreement {a.agreement:.1%}, mean "
            f"log-probability of the next token {a.mean_logprob:.2f} nats, {a.top5_miss:.1%} outside the target's "
            f"top 5; surprise {a.mean_surprise:+.2f} nats/token against the target's own samples (z {a.z:.1f}); "
            f"best-fitting sampling temperature {a.fitted_temperature:g} (its own samples there would agree "
            f"{a.expected_agreement:.1%}), PIT chi-square {a.shape_chi2:.0f} there")


RULE = (f"The target's own samples at temperature <= 1 (greedy included) have a surprise of 0 or less, and at their "
        f"temperature each token falls uniformly in the target's distribution (randomised PIT). Not from the target: "
        f"surprise above {SURPRISE_MAX} nats/token with z > {Z_MIN} (flatter than its samples), or a PIT chi-square "
        f"above {SHAPE_CHI2} (as confident, but choosing other tokens): people, another model, or the model before a "
        "fine-tune.")


def origin_findings(s: AuditSummary, *, show: int = 5) -> list[Finding]:
    """``data-not-from-target``: the whole dataset (most records, or the rest taken together), or single records."""
    a = s.agreement
    if not a.tokens:
        return []
    verdict = s.origin_verdict
    flagged = s.flagged_records()
    n = len(s.per_record)
    rule = RULE
    if verdict == "not-from-target":
        return [Finding(
            "data-not-from-target", "warning",
            f"the supervised tokens were not written by this target: {_figures(a, n)}; {len(flagged)} of {n} records "
            f"fail on their own. {rule}",
            fix="Regenerate the responses with the served target (SpecForge regenerate_train_data, speculators "
                "response regeneration) and retrain; for a fine-tuned target, regenerate with the fine-tuned weights.",
            source=ORIGIN_SOURCE, impact="high")]
    if verdict == "some-records":
        names = ", ".join(p for p, _ in flagged[:show]) + (", ..." if len(flagged) > show else "")
        rest = s.bulk()
        # the rest pass the rule, but "its own generation" only where their surprise is not above the bar (on few
        # tokens it can be, with a z short of Z_MIN: issue 43's four human-written records, +0.73 nats at z 2.8)
        lean = (rest.mean_surprise or 0.0) > SURPRISE_MAX
        said = (f"the other records lean the same way, short of the rule's z > {Z_MIN} on so few tokens" if lean
                else "the other records read as its own generation")
        return [Finding(
            "data-not-from-target", "warning",
            f"{len(flagged)} of {n} records hold answers this target did not write ({names}); {said} "
            f"({_figures(rest, n - len(flagged))}). {rule}",
            fix="Regenerate those records' responses with the served target, or drop them.",
            source=ORIGIN_SOURCE, impact="medium")]
    if verdict == "too-few":
        return [Finding("data-not-from-target", "info",
                        f"only {a.tokens} supervised tokens scored ({_figures(a, n)}): too few (< {MIN_TOKENS}) to "
                        "judge where the answers came from.")]
    return [Finding("data-not-from-target", "info",
                    f"nothing shows the supervised tokens came from another source than this target: {_figures(a, n)}; "
                    f"the target's mean entropy there is {a.mean_entropy:.2f} nats (the flatter the target, the less "
                    "these tests can tell its samples from any other text).")]


def shift_findings(s: AuditSummary, *, show: int = 5) -> list[Finding]:
    """``loss-mask-shifted``: runs that start one token after (or before) the target's header. An error when more than
    ``SHIFT_SHARE`` of the runs near the header are shifted (the pipeline shifts them all); a warning for a few."""
    late, early, ok = s.starts.get(tpl.START_LATE, 0), s.starts.get(tpl.START_EARLY, 0), s.starts.get(tpl.START_OK, 0)
    near = late + early + ok
    if not near or not late + early:
        return []
    names = ", ".join(s.shifted_records[:show]) + (", ..." if len(s.shifted_records) > show else "")
    if late >= early:
        what = (f"{late} of {near} supervised runs start one token AFTER the assistant header: the first answer "
                "token is never supervised (and the token after the end of turn is)")
    else:
        what = (f"{early} of {near} supervised runs start one token BEFORE the end of the assistant header: the "
                "header's last token is supervised as if it were the answer")
    many = late + early > SHIFT_SHARE * near
    return [Finding("loss-mask-shifted", "error" if many else "warning",
                    f"the loss mask is shifted against input_ids: {what}; records: {names}.",
                    fix="Shift loss_mask together with input_ids where the data pipeline shifts the ids "
                        "(mask[t] must mark input_ids[t]), regenerate the records, and retrain.",
                    source=SHIFT_SOURCE, impact="high" if many else "low")]


def length_findings(s: AuditSummary, served_len: int | None) -> list[Finding]:
    """``train-shorter-than-served``: the served context is longer than the longest training record."""
    pc = s.percentiles()
    if served_len is None or pc["max"] is None:
        return []
    if pc["max"] >= served_len:
        return []
    return [Finding(
        "train-shorter-than-served", "warning",
        f"the server accepts contexts of {served_len:,} tokens but the longest training record holds {pc['max']:,} "
        f"(p50 {pc['p50']:,}, p95 {pc['p95']:,}): the drafter never saw positions past {pc['max']:,}, and acceptance "
        "falls on longer prompts (2.3 at 2k to 1.08 at 20k in vllm-project/speculators#684).",
        fix="Add long training records (or train with a longer max length), or cap the served context where "
            "acceptance matters.", source=LENGTH_SOURCE, impact="medium")]


@dataclass
class ServedSummary:
    """What the served side opens, counted from prompts read by ``templates.classify_prompt`` (JSON round trip)."""

    source: str  # "--served-prompts FILE" and/or "--capture FILE"
    kinds: Counter = field(default_factory=Counter)  # generation | answered | other | raw
    states: Counter = field(default_factory=Counter)  # the answer state each prompt asks for
    skeletons: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, source: str, reads: Iterable[tpl.PromptRead]) -> "ServedSummary":
        s = cls(source)
        for r in reads:
            s.kinds[r.kind] += 1
            s.skeletons[r.skeleton] += 1
            if r.state is not None:
                s.states[r.state] += 1
        return s

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "prompts": self.total, "kinds": dict(self.kinds),
                "answer_states": dict(self.states), "skeletons": dict(self.skeletons.most_common())}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ServedSummary":
        return cls(str(d.get("source") or ""), Counter(d.get("kinds") or {}), Counter(d.get("answer_states") or {}),
                   Counter(d.get("skeletons") or {}))


@dataclass(frozen=True)
class TemplateFacts:
    """What the judgement needs of the target's template (``Skeleton.facts``; kept in a scan's header)."""

    header_text: str
    family: str | None
    thinks: bool
    default_state: str | None

    @classmethod
    def of(cls, skel: tpl.Skeleton) -> "TemplateFacts":
        return cls(skel.header_text, skel.family, skel.thinks, skel.served_state.get("default"))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TemplateFacts":
        return cls(str(d.get("header_text") or ""), d.get("family"), bool(d.get("thinks")), d.get("default_state"))


def _state_words(state: str | None) -> str:
    return {tpl.REASONING: "thinking (reasoning inside the think block)",
            tpl.EMPTY_THINK: "non-thinking (an empty think block, then the answer)",
            tpl.PLAIN: "plain answers (no think block)"}.get(state or "", "unknown")


def _identity(key: str | None) -> str | None:
    """A skeleton key reduced to which template it is: ``target``, ``raw`` or ``other:<text>``."""
    if key is None:
        return None
    return "target" if key.startswith("target:") else key


def _describe(identity: str, skel: TemplateFacts) -> str:
    if identity == "target":
        return f"the target's template `{skel.header_text}`" + (f" ({skel.family})" if skel.family else "")
    if identity == "raw":
        return "no template tokens at all (raw text)"
    text = identity[len("other:"):]
    fam = tpl.family_of(text)
    return f"`{text}`" + (f" ({fam})" if fam else "")


def template_findings(s: AuditSummary, skel: TemplateFacts, served: ServedSummary | None) -> list[Finding]:
    """``template-mismatch`` and ``thinking-mismatch``: records against the target's template and the served side."""
    out: list[Finding] = []
    runs = Counter()
    for key, n in s.skeletons.items():
        runs[_identity(key)] += n
    train_id, train_n, train_tot = tpl.majority(runs.elements())
    sv_id = sv_n = sv_tot = None
    if served is not None and served.total:
        ids = Counter()
        for key, n in served.skeletons.items():
            ids[_identity(key)] += n
        sv_id, sv_n, sv_tot = tpl.majority(ids.elements())
    fix_render = ("Render the training conversations with the chat template the server uses (by default the target's "
                  "own: tokenizer_config.json / chat_template.jinja), regenerate the responses and hidden states, and "
                  "retrain.")
    train_words = (f"{_pct(train_n, train_tot)} of {train_tot} records answer after "
                   f"{_describe(train_id, skel)}" if train_id else "")
    if sv_id is None:
        if train_id and train_id != "target":
            out.append(Finding(
                "template-mismatch", "error",
                f"{train_words}, not after the target's assistant header `{skel.header_text}`: the records were "
                "rendered with another chat template (or none), so the drafter learned a prompt format a server using "
                "the target's template never sends.", fix=fix_render, source=TEMPLATE_SOURCE, impact="high"))
    else:
        served_words = f"{_pct(sv_n, sv_tot)} of {sv_tot} served prompts ({served.source}) use {_describe(sv_id, skel)}"
        if train_id and train_id == sv_id and train_id != "target":
            out.append(Finding(
                "template-mismatch", "info",
                f"{train_words} and {served_words}: training and serving agree with each other, not with the "
                "target's own template (harmless for acceptance; the target may answer worse in that format).",
                source=TEMPLATE_SOURCE))
        elif train_id and train_id != sv_id and sv_id == "raw":
            out.append(Finding(
                "template-mismatch", "warning",
                f"{served_words}: raw completions, while {train_words[0].lower() + train_words[1:]}. Acceptance measured "
                "on raw completions is not comparable (it can read ~1, or fake-high on degenerate loops).",
                fix="Send chat requests (/v1/chat/completions), or benchmark with the chat template applied "
                    "(e.g. --use-chat-template / apply_chat_template).", source=TEMPLATE_SOURCE, impact="high"))
        elif train_id and train_id != sv_id:
            fix = fix_render if sv_id == "target" else (
                "Serve with the template the records were rendered with (for the target's own: drop --chat-template "
                "overrides), or re-render the training data with the template the server uses, and retrain.")
            out.append(Finding(
                "template-mismatch", "error", f"{train_words}; {served_words}: the drafter learned a prompt format the "
                "server does not send.", fix=fix, source=TEMPLATE_SOURCE, impact="high"))
    # thinking: what the records answer in against what the server asks for
    tr_state, tr_n, tr_tot = tpl.majority(s.states.elements())
    if served is None or not served.total:
        default_state = skel.default_state
        if skel.thinks and tr_state and default_state and tr_state != default_state and tr_n > MAJORITY * tr_tot:
            out.append(Finding(
                "thinking-mismatch", "info",
                f"{_pct(tr_n, tr_tot)} of {tr_tot} records answer {_state_words(tr_state)}; the template's default "
                f"generation prompt asks for {_state_words(default_state)}. Give the served prompts (--served-prompts "
                "or --capture) to check what the server really sends.", source=TEMPLATE_SOURCE))
        return out
    sv_state, sv_sn, sv_stot = tpl.majority(served.states.elements())
    if tr_state and sv_state and tr_state != sv_state and tr_n > MAJORITY * tr_tot and sv_sn > MAJORITY * sv_stot:
        if sv_state == tpl.REASONING:
            fix = ("Serve with enable_thinking=false (chat_template_kwargs) to match the data, or regenerate the data "
                   "with thinking on and retrain.")
        elif sv_state == tpl.EMPTY_THINK:
            fix = ("Serve with thinking on to match the data, or regenerate the data with enable_thinking=false "
                   "(an empty think block before each answer) and retrain.")
        else:
            fix = "Render the training data in the think mode the server uses, and retrain."
        out.append(Finding(
            "thinking-mismatch", "error",
            f"{_pct(tr_n, tr_tot)} of {tr_tot} training records answer {_state_words(tr_state)}; "
            f"{_pct(sv_sn, sv_stot)} of {sv_stot} served prompts ({served.source}) ask for {_state_words(sv_state)}: "
            "the drafter never saw the text it is asked to draft.", fix=fix, source=TEMPLATE_SOURCE, impact="high"))
    return out


def fmt_float(v: float | None, spec: str = ".3f") -> str:
    """``v`` formatted, or '-' when missing or not finite."""
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)
