"""Causes, not codes: the findings that share one root cause are one cause, and what that cause costs.

Codes stay the contract; a *cause* groups them. The grouping is a table, never a match on
messages: ``ROOT_CAUSE`` gives a code its root-cause key, ``CHECK_CAUSE`` gives every code of a
check one key (align's wiring row: everything align says is about one wiring), and a code in
neither is a cause of its own. ``SYMPTOMS`` are codes that report low acceptance without saying
why (a log's accept length 1.00); they join the most costly cause found beside them that can
explain them. A new code joins a cause with one line in ``ROOT_CAUSE``; a new cause is one line
in ``CAUSES`` (how replay sees it, and its expected cost where the checks' own is not the one).

The cost of a cause is measured where replay ran on the same inputs and priced it (``price``):
the accept-length difference between the drafter as the engine would serve it and as trained,
with its standard error; its label follows from that number by one rule (``label_of``). Where
replay did not price it, the cost is the expected one (the checks' ``impact`` and ``source``),
marked "not measured", and never called a collapse beside a replayed accept length that is not
one. Severity says what kind of change it takes and is the same on every surface
(``verdict.LEVEL_OF_SEVERITY``): error = broken, no setting fixes it (PROBLEM); warning = a change
fixes it (ACTION); info = context (OK).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from .records import IMPACTS, Finding

# how replay sees a cause
WIRING = "wiring"  # replay runs the engine's wiring beside the trained one: their difference is the cost
SERVED = "served"  # replay runs the drafter as served (an ignored flag dropped) beside it as trained
CARRIED = "carried"  # replay runs the drafter with the cause in it: the replayed accept length bounds its cost
OUTSIDE = "outside"  # replay does not model it (a launch argument, the training data, longer contexts)


@dataclass(frozen=True)
class CauseKind:
    """One root cause: its title, how replay sees it, and an expected cost where the checks' impact is not it."""

    title: str
    replay: str = OUTSIDE
    expected: str = ""  # label when not measured ("" = the worst impact of its findings)
    source: str = ""  # where the expected label comes from ("" = its findings' sources)


_PR50170 = "vllm-project/vllm#50170 (1.2% acceptance with the default layers; docs/causes.md row 1)"
CAUSES: dict[str, CauseKind] = {
    "aux-wiring": CauseKind("the engine feeds the drafter other layers than it was trained on (aux-layer wiring)",
                            WIRING, "collapse", _PR50170),
    "draft-embedding": CauseKind("the drafter's own token embedding is not the target's", CARRIED),
    "lm-head-not-target": CauseKind("the drafter's lm_head is not the target's head", CARRIED),
    "flag-ignored": CauseKind("the engine ignores a feature the drafter was trained with", SERVED),
    "rope-mismatch": CauseKind("the draft's RoPE differs from the target's", CARRIED),
    "d2t-absolute": CauseKind("the d2t map holds target ids where offsets belong", CARRIED),
    "d2t-invalid": CauseKind("the d2t map is not a valid map", CARRIED),
    "vocab-coverage": CauseKind("the draft vocabulary misses the target's frequent tokens", CARRIED),
    "pp-drops-aux": CauseKind("pipeline parallelism drops the aux states before the drafter", OUTSIDE),
    "wiring-unjudged": CauseKind("align cannot place the record's slots on this capture, so the wiring is not "
                                 "judged (the record and the capture do not pair up, or the evidence is too weak)"),
    "record-wiring": CauseKind("the training record's slots hold states the drafter should not be trained on (the "
                               "embedding, a post-norm state, a wrong order or layer)"),
    "record-states": CauseKind("the training record's hidden states are corrupt or misaligned with its tokens"),
    "drafter-weights": CauseKind("the drafter's weights are missing or still at their init", CARRIED),
    "d2t-missing": CauseKind("the drafter's checkpoint has no d2t map for its reduced vocabulary", CARRIED),
    "size-mismatch": CauseKind("the drafter's sizes do not fit the target", CARRIED),
    "dtype-mismatch": CauseKind("the drafter's dtype differs from the target's", OUTSIDE),
    "algorithm-mismatch": CauseKind("the server runs another speculative algorithm than the drafter's", OUTSIDE),
    "draft-path-missing": CauseKind("the server was launched without the drafter", OUTSIDE),
    "draft-is-target": CauseKind("the server was given the target as its drafter", OUTSIDE),
    "accept-len-one": CauseKind("the server's log shows nothing accepted", OUTSIDE),
    "engine-refused": CauseKind("the server refused to start or died (its own failure line)", OUTSIDE),
    "max-positions-short": CauseKind("the draft's max positions are shorter than the served context", OUTSIDE),
    "train-shorter-than-served": CauseKind("the training records are shorter than the served context", OUTSIDE),
    "data-not-from-target": CauseKind("the training answers were not written by this target", OUTSIDE),
    "template-mismatch": CauseKind("the training chat template differs from the served one", OUTSIDE),
    "thinking-mismatch": CauseKind("the training thinking mode differs from the served one", OUTSIDE),
    "loss-mask-shifted": CauseKind("the training loss mask is shifted off the answers", OUTSIDE),
}
ROOT_CAUSE: dict[str, str] = {  # code -> root-cause key (a code not here, nor in CHECK_CAUSE's checks, is its own)
    # the aux-ids wiring: the draft config read, the engine's fallback, the positions served
    "serving-mismatch": "aux-wiring", "serving-unjudged": "wiring-unjudged", "off-by-default": "aux-wiring",
    "nested-ignored": "aux-wiring", "top-level-ignored": "aux-wiring", "key-ignored": "aux-wiring",
    "default-fallback": "aux-wiring", "draft-ids-ignored": "aux-wiring", "keys-disagree": "aux-wiring",
    "engine-cannot-serve": "aux-wiring", "engine-captures-nothing": "aux-wiring", "aux-capture-off": "aux-wiring",
    "trtllm-arch-forces-ids": "aux-wiring", "order-differs": "aux-wiring", "empty-id-list": "aux-wiring",
    "negative-id": "aux-wiring", "duplicate-id": "aux-wiring", "id-raises": "aux-wiring",
    "id-captures-nothing": "aux-wiring", "fc-width-mismatch": "aux-wiring", "version-dependent": "aux-wiring",
    # the record's own slots hold what an EAGLE-3 drafter should not be trained on
    "embedding-included": "record-wiring", "aux-post-norm": "record-wiring", "concat-order": "record-wiring",
    "duplicate-position": "record-wiring", "final-wrong-layer": "record-wiring",
    # the drafter's embedding: a fresh init and another model's are one defect with one fix
    "embedding-random": "draft-embedding", "embedding-not-target": "draft-embedding",
    # align's row, when it says something other than the engine's layers: its evidence cannot place the slots ...
    "possibly-swapped": "wiring-unjudged", "no-confident-match": "wiring-unjudged", "token-mismatch": "wiring-unjudged",
    "ambiguous-position": "wiring-unjudged", "between-positions": "wiring-unjudged",
    "position-unknown": "wiring-unjudged", "rows-unverified": "wiring-unjudged",
    "neighbours-not-captured": "wiring-unjudged", "capture-read-as-labelled": "wiring-unjudged",
    "convention-content": "wiring-unjudged", "few-distinct-tokens": "wiring-unjudged",
    "nonfinite-capture": "wiring-unjudged", "num-layers-disagree": "wiring-unjudged",
    "trained-wiring-unknown": "wiring-unjudged", "tokens-assumed-greedy": "wiring-unjudged",
    "loss-mask-empty": "wiring-unjudged", "loss-mask-unpaired": "wiring-unjudged", "loss-mask-unread": "wiring-unjudged",
    # ... or the record's own states are broken (docs/causes.md row 9)
    "rows-differ": "record-states", "token-misalignment": "record-states", "nonfinite-training": "record-states",
    # the drafter's weights (replay judged against baselines)
    "drafter-weights-random": "drafter-weights", "drafter-weights-missing": "drafter-weights",
}
# check -> key for every code it emits not in ROOT_CAUSE (align's other codes are notes on its evidence)
CHECK_CAUSE: dict[str, str] = {"wiring": "wiring-unjudged"}
# symptom code -> the causes it may join (replay views or cause keys): the most costly one found beside it
SYMPTOMS: dict[str, tuple[str, ...]] = {
    "accept-len-one": (WIRING, SERVED, CARRIED, "algorithm-mismatch", "draft-path-missing", "draft-is-target",
                       "pp-drops-aux"),
    "drafter-no-better-than-baseline": (CARRIED,),
}

# the label rule: the share of the trained drafter's gain (accept length - 1) that is lost, most first
LABEL_SHARE: tuple[tuple[str, float], ...] = (("collapse", 0.9), ("high", 0.5), ("medium", 0.2), ("low", 0.0))
Z = 2.0  # a measured loss within Z standard errors of none is said to be weak evidence
COLLAPSE_GAIN = 0.1  # a replayed accept length whose gain stays above this share of the chain is not a collapse


def cause_key(code: str, check: str = "") -> str:
    """The root-cause key of ``code`` as ``check`` emitted it (the tables above)."""
    return ROOT_CAUSE.get(code) or CHECK_CAUSE.get(check) or code


def kind_of(key: str) -> CauseKind:
    return CAUSES.get(key, CauseKind(key))


def label_of(lost: float, gain: float) -> str:
    """THE rule: of the trained drafter's gain ``gain`` (accept length - 1), the share ``lost`` (accept length,
    trained minus as served) picks the first label of ``LABEL_SHARE`` it reaches: collapse >= 90% of the gain,
    high >= 50%, medium >= 20%, else low. Whether the loss is beyond noise is said beside it (``Cost.weak``)."""
    share = lost / gain if gain > 0 else 1.0
    return next((label for label, floor in LABEL_SHARE if share >= floor), "low")


def accept_se(wiring: dict[str, Any]) -> float | None:
    """Standard error of a replayed accept length, from its reach@k (P(accepted >= k)) over its start rows, rows
    taken as independent: Var = sum (2k-1) reach_k - (sum reach_k)^2."""
    reach, n = wiring.get("reach") or [], wiring.get("starts") or 0
    if not reach or n <= 1 or any(r is None for r in reach):
        return None
    mean = sum(reach)
    var = max(0.0, sum((2 * k - 1) * r for k, r in enumerate(reach, 1)) - mean * mean)
    return math.sqrt(var / n)


def paired_se(a: Any, b: Any | None) -> float | None:
    """SE of the mean of ``a`` (tokens accepted per start row, NaN where none starts), or of ``a - b`` over the rows
    both count (the same rows replayed on two wirings: a paired difference); None with fewer than 2 rows."""
    import numpy as np

    x = np.asarray(a, dtype=np.float64)
    if b is not None:
        x = x - np.asarray(b, dtype=np.float64)
    x = x[np.isfinite(x)]
    return None if x.size < 2 else float(x.std(ddof=1) / math.sqrt(x.size))


@dataclass(frozen=True)
class Cost:
    """What a cause costs: ``label`` (collapse/high/medium/low) and how it is known.

    ``measured`` True: ``lost`` (accept length, trained minus as served) and ``se`` from replay, ``served``
    and ``trained`` the two accept lengths, ``basis`` the wirings compared. False: the expected label and
    its ``source``; ``basis`` says why replay did not price it.
    """

    label: str
    measured: bool
    source: str = ""
    basis: str = ""
    lost: float | None = None
    se: float | None = None
    served: float | None = None
    trained: float | None = None

    @property
    def weak(self) -> bool:
        """A measured loss within Z standard errors of none: the label rests on weak evidence."""
        return bool(self.measured and self.lost is not None and self.se is not None and abs(self.lost) <= Z * self.se)

    @property
    def text(self) -> str:
        """``medium, measured: accept length 2.43 against 2.92 as trained (-0.49 ± 0.10; ...)`` or
        ``collapse, expected (not measured: ...): source``."""
        if self.measured:
            weak = f"; within {Z:g} SE of no loss: weak evidence" if self.weak else ""
            return (f"{self.label}, measured: accept length {self.served:.2f} against {self.trained:.2f} as trained "
                    f"({-self.lost:+.2f} ± {self.se:.2f} SE{weak}; {self.basis})")
        return f"{self.label or 'unrated'}, expected (not measured: {self.basis})" + (
            f"; {self.source}" if self.source else "")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "measured": self.measured, "source": self.source or None,
                "basis": self.basis, "lost": _r(self.lost), "se": _r(self.se), "served": _r(self.served),
                "trained": _r(self.trained), "weak": self.weak, "text": self.text}


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


@dataclass(frozen=True)
class Cause:
    """One root cause: its findings (each with the check that made it), its severity and its cost."""

    key: str
    title: str
    severity: str
    cost: Cost
    items: tuple[tuple[str, Finding], ...] = field(default_factory=tuple)

    @property
    def codes(self) -> list[str]:
        return list(dict.fromkeys(f.code for _, f in self.items))

    @property
    def checks(self) -> list[str]:
        return list(dict.fromkeys(c for c, _ in self.items))

    @property
    def fix(self) -> str:
        return "; ".join(dict.fromkeys(f.fix for _, f in self.items if f.fix))

    @property
    def line(self) -> str:
        """``[warning] aux-wiring (medium): title``: the head line every surface shows."""
        return f"[{self.severity}] {self.key} ({self.cost.label or 'unrated'}): {self.title}"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "severity": self.severity, "impact": self.cost.label,
                "cost": self.cost.to_dict(), "codes": self.codes, "checks": self.checks, "fix": self.fix or None,
                "findings": [{"check": c, **f.to_dict()} for c, f in self.items]}


_SEV = {"error": 0, "warning": 1, "info": 2}


def _impact_rank(label: str) -> int:
    return IMPACTS.index(label) if label in IMPACTS else len(IMPACTS)


def group(items: Iterable[tuple[str, Finding]]) -> list[tuple[str, list[tuple[str, Finding]]]]:
    """(check, finding) pairs, ranked most costly first, grouped by root-cause key in the order keys first appear;
    a symptom joins the first cause whose replay view it may join, else stands alone."""
    groups: dict[str, list[tuple[str, Finding]]] = {}
    symptoms: list[tuple[str, Finding]] = []
    for check, f in items:
        if f.code in SYMPTOMS:
            symptoms.append((check, f))
        else:
            groups.setdefault(cause_key(f.code, check), []).append((check, f))
    for check, f in symptoms:
        allowed = SYMPTOMS[f.code]
        host = next((k for k in groups if k not in SYMPTOMS and (k in allowed or kind_of(k).replay in allowed)), None)
        groups.setdefault(host or cause_key(f.code, check), []).append((check, f))
    return list(groups.items())


def _wiring(replay: dict[str, Any], pick: str) -> dict[str, Any] | None:
    ws = [w for w in replay.get("wirings") or [] if w.get("accept_length") is not None]
    if pick == "trained":
        return next((w for w in ws if not w.get("served_without") and "trained" in _sources(w)), None)
    if pick == "served":
        return next((w for w in ws if w.get("served_without")), None)
    plain = [w for w in ws if not w.get("served_without")]
    return (next((w for w in plain if any(s.startswith(("sglang", "vllm", "trtllm")) for s in _sources(w))), None)
            or next((w for w in plain if "engine default" in _sources(w)), None))


def _sources(w: dict[str, Any]) -> list[str]:
    return [s.strip() for s in str(w.get("source") or "").split(";")]


def price(kind: CauseKind, replay: dict[str, Any] | None, expected: str, source: str, replay_reason: str = "") -> Cost:
    """The cost of one cause: measured by replay where its view prices it, else expected (bounded by replay).
    ``replay_reason``: why replay did not run, when it did not."""
    if replay is None:
        return Cost(expected, False, source, replay_reason or "replay did not run (it needs --drafter and --capture)")
    trained = _wiring(replay, "trained")
    other = _wiring(replay, "served" if kind.replay == SERVED else "engine") if kind.replay in (WIRING, SERVED) \
        else None
    if trained is not None and other is not None and other is not trained:
        t, s = trained["accept_length"], other["accept_length"]
        se_t, se_s = trained.get("se") or accept_se(trained), other.get("se") or accept_se(other)
        if se_t is not None and se_s is not None:
            gain = t - 1.0
            if gain > Z * se_t:  # paired on the same start rows where replay kept them, else the two combined
                se = other.get("se_vs_trained") or math.sqrt(se_t ** 2 + se_s ** 2)
                what = (f"without {', '.join(other['served_without'])}" if other.get("served_without")
                        else f"{other['label']} ({other['source']})")
                return Cost(label_of(t - s, gain), True, "replay on the capture",
                            f"replay: {what} against {trained['label']} as trained", t - s, se, s, t)
            basis = (f"the drafter accepts nothing even as trained (replay {t:.2f}), so replay cannot price "
                     "this cause apart")
            return Cost(expected, False, source, basis)
    why = {OUTSIDE: "replay does not model this cause", CARRIED: "replay runs the drafter with it, so no "
           "difference isolates it"}.get(kind.replay, "replay ran no wiring that isolates it")
    label = expected
    served = (trained or _wiring(replay, "engine")) if kind.replay == CARRIED else None
    if served is not None:
        why += f"; replay measures accept length {served['accept_length']:.2f} with it ({served['label']})"
    if label == "collapse" and served is not None:
        steps = served.get("steps") or 1
        se = accept_se(served) or 0.0
        if served["accept_length"] - 1.0 - Z * se > COLLAPSE_GAIN * steps:
            label = "high"
            why += f", above {COLLAPSE_GAIN:g} x {steps} steps over 1: not a collapse"
    return Cost(label, False, source, why)


def _headline(message: str, width: int = 120) -> str:
    """The first clause of a message, for a cause without a title of its own (display only, never grouping)."""
    head = message.split("; ")[0].split(". ")[0].rstrip(".")
    return head if len(head) <= width else head[: width - 3].rstrip() + "..."


def build(items: Iterable[tuple[str, Finding]], replay: dict[str, Any] | None = None,
          floors: dict[str, str] | None = None, replay_reason: str = "") -> list[Cause]:
    """The causes of ranked (check, finding) pairs, most severe first, then most costly (measured loss first).

    ``floors``: check -> the least severity a cause with that check's findings has (align's wiring row: its
    verdict's level, so the doctor and align say the same about the same wiring).
    """
    out = []
    floors = floors or {}
    for key, members in group(items):
        kind = kind_of(key)
        findings = [f for _, f in members]
        severity = min([f.severity for f in findings] + [floors[c] for c, _ in members if c in floors],
                       key=lambda s: _SEV.get(s, 9))
        expected = kind.expected or min((f.impact for f in findings), key=_impact_rank, default="")
        source = kind.source or "; ".join(dict.fromkeys(f.source for f in findings if f.source))
        title = kind.title if key in CAUSES else _headline(findings[0].message)
        out.append(Cause(key, title, severity, price(kind, replay, expected, source, replay_reason), tuple(members)))
    return sorted(out, key=lambda c: (_SEV.get(c.severity, 9), _impact_rank(c.cost.label),
                                      -(c.cost.lost or 0.0) if c.cost.measured else 0.0))
