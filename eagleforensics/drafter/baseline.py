"""Is the drafter better than guessing? Its step-1 acceptance against three baselines on the very same rows.

At row t the drafter knows the tokens up to t+1 and drafts the target's token y[t+1]. So can three
predictors that need no drafter: the most frequent target token (``unigram``), the last known token
again (``repeat``) and a bigram table ``x[t+1] -> y[t+1]`` fitted on the training records'
supervised rows (``bigram``; on the records themselves it is scored leave-one-out, so it never
predicts a row from that row). A fourth is the drafter itself fed another row's states
(``shuffled``: the sequence's aux states rolled by half its length): what its token path alone
knows. A drafter that is not better than the best of them beyond two standard errors of the paired
difference has learned nothing a lookup table would not know, or gets nothing from the target's
states: untrained, broken (an ``fc`` or head from another checkpoint), or fed the wrong states.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_ROWS = 16  # fewer counted rows: the comparison is said, never judged
Z = 2.0  # "beyond SE": the drafter must beat the best baseline by this many standard errors
ROOM_Z = 3.0  # rows a perfect drafter could not beat the best baseline on by this many SE are too predictable to judge


@dataclass
class BigramTable:
    """Counts of the target token after each known token, fitted on supervised record rows."""

    pairs: dict[int, Counter] = field(default_factory=dict)
    unigram: Counter = field(default_factory=Counter)

    def add(self, prev: np.ndarray, want: np.ndarray) -> None:
        for a, b in zip(prev.tolist(), want.tolist()):
            self.pairs.setdefault(a, Counter())[b] += 1
            self.unigram[b] += 1

    @staticmethod
    def _mode(counts: Counter, drop: int | None) -> int | None:
        """The most counted token (the smallest id on a tie), one count of ``drop`` left out; None when none is left."""
        scored = [(c - (tok == drop), -tok) for tok, c in counts.items()]
        top = max(scored, default=(0, 0))
        return -top[1] if top[0] > 0 else None

    def predict(self, prev: int, own: int | None = None) -> tuple[int | None, int | None]:
        """(bigram guess, unigram guess) for a row whose known token is ``prev``; ``own``: the row's own target when
        it is one of the fitted rows (left out: leave-one-out)."""
        uni = self._mode(self.unigram, own)
        counts = self.pairs.get(prev)
        big = self._mode(counts, own) if counts else None
        return (big if big is not None else uni), uni


@dataclass(frozen=True)
class Judgement:
    """The drafter's step-1 acceptance and the baselines' on one set of rows, and whether it beats them."""

    source: str  # "records" | "capture"
    rows: int
    drafter: float
    baselines: dict[str, float]
    best: str
    diff: float  # drafter - best baseline
    se: float  # of the paired difference
    wiring: str = ""
    room_z: float = math.inf  # how many SE a perfect drafter would beat the best baseline by on these rows
    d: tuple[float, ...] = field(default=(), repr=False)  # per row: drafter hit - best baseline's hit
    room: tuple[float, ...] = field(default=(), repr=False)  # per row: 1 - best baseline's hit

    @property
    def judged(self) -> bool:
        """Enough rows, and rows a lookup table does not already predict (a text caught in a loop is not judged)."""
        return self.rows >= MIN_ROWS and self.room_z >= ROOM_Z

    @property
    def no_better(self) -> bool:
        return self.judged and self.diff <= Z * self.se

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rows": self.rows, "drafter_acc1": round(self.drafter, 4),
                "baselines": {k: round(v, 4) for k, v in self.baselines.items()}, "best": self.best,
                "diff": round(self.diff, 4), "se": round(self.se, 4), "judged": self.judged,
                "no_better": self.no_better, "wiring": self.wiring,
                "room_z": None if not math.isfinite(self.room_z) else round(self.room_z, 2)}

    def text(self) -> str:
        base = ", ".join(f"{k} {v:.2f}" for k, v in self.baselines.items())
        return (f"{self.source}{f' ({self.wiring})' if self.wiring else ''}: drafter acc@1 {self.drafter:.2f} over "
                f"{self.rows} rows against {base} (best {self.best}: {self.diff:+.2f} +- {self.se:.2f} SE)")


@dataclass
class Rows:
    """Counted rows of one sequence: the known token x[t+1], the wanted y[t+1], the drafter's draft, fitted or not."""

    prev: np.ndarray
    want: np.ndarray
    draft: np.ndarray
    fitted: bool  # these rows are in the bigram table (score them leave-one-out)
    shuffled: np.ndarray | None = None  # the drafter's draft when fed another row's states


def judge(source: str, seqs: list[Rows], table: BigramTable, wiring: str = "") -> Judgement:
    """Score the drafter and the baselines on ``seqs``' rows (paired, per row)."""
    hits: dict[str, list[int]] = {"drafter": [], "unigram": [], "repeat": [], "bigram": []}
    if seqs and all(s.shuffled is not None for s in seqs):
        hits["shuffled"] = []
    for s in seqs:
        other = s.shuffled.tolist() if s.shuffled is not None else [None] * len(s.draft)
        for prev, want, draft, shuf in zip(s.prev.tolist(), s.want.tolist(), s.draft.tolist(), other):
            big, uni = table.predict(prev, want if s.fitted else None)
            hits["drafter"].append(int(draft == want))
            hits["unigram"].append(int(uni == want))
            hits["repeat"].append(int(prev == want))
            hits["bigram"].append(int(big == want))
            if "shuffled" in hits:
                hits["shuffled"].append(int(shuf == want))
    n = len(hits["drafter"])
    if n == 0:
        return Judgement(source, 0, 0.0, {"unigram": 0.0, "repeat": 0.0, "bigram": 0.0}, "unigram", 0.0, 0.0, wiring)
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in hits.items()}
    means = {k: float(v.mean()) for k, v in arr.items() if k != "drafter"}
    best = max(means, key=lambda k: means[k])
    d = arr["drafter"] - arr[best]
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    room = 1.0 - arr[best]  # what a drafter right on every row would gain over the best baseline
    room_se = float(room.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    room_z = float(room.mean()) / room_se if room_se > 0 else (math.inf if room.mean() > 0 else 0.0)
    return Judgement(source, n, float(arr["drafter"].mean()), means, best, float(d.mean()), se, wiring, room_z,
                     tuple(d.tolist()), tuple(room.tolist()))


def pooled(found: list[Judgement]) -> Judgement:
    """One judgement over every source's rows (each row against its own source's best baseline): the drafter is
    judged once, so a source of few rows cannot outvote a larger one either way."""
    d = np.asarray([x for j in found for x in j.d], dtype=np.float64)
    room = np.asarray([x for j in found for x in j.room], dtype=np.float64)
    n = int(d.size)
    if n < 2:
        return Judgement("all rows", n, 0.0, {}, "-", 0.0, 0.0)
    se = float(d.std(ddof=1) / math.sqrt(n))
    room_se = float(room.std(ddof=1) / math.sqrt(n))
    room_z = float(room.mean()) / room_se if room_se > 0 else (math.inf if room.mean() > 0 else 0.0)
    drafter = sum(j.drafter * j.rows for j in found) / n
    return Judgement("all rows", n, drafter, {}, "per source", float(d.mean()), se, "", room_z, tuple(d), tuple(room))


def step1_rows(fwd: Any, aux_rows: Any, ids: Any, y: Any, mask: Any, *, fitted: bool) -> Rows:
    """The drafter's step-1 draft on every counted row of one sequence (``drafter.replay``'s forward and counting)."""
    import torch

    from .replay import _ahead, _shift, counted_rows, replay_chain

    ids = torch.as_tensor(ids).long()
    total = int(ids.shape[0])

    def run(reader: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            h0, valid = fwd.project_rows(reader, total)
            pre = fwd.prefix(h0, ids, valid=None if bool(valid.all()) else valid)
        return replay_chain(fwd, pre, 1).drafts[0].cpu(), valid.cpu()  # counted on the host

    drafts, valid = run(aux_rows)
    shift = total // 2

    def rolled(a: int, b: int) -> Any:  # rows a..b-1 hold the states of rows a+shift.. (mod total)
        idx = (torch.arange(a, b) + shift) % total
        parts, start = [], 0
        while start < idx.numel():  # contiguous runs: at most two
            stop = start + 1
            while stop < idx.numel() and idx[stop] == idx[stop - 1] + 1:
                stop += 1
            parts.append(aux_rows(int(idx[start]), int(idx[stop - 1]) + 1))
            start = stop
        return torch.cat(parts)

    shuffled = run(rolled)[0] if shift > 0 else None
    rows = counted_rows(total, 1, y.cpu(), valid, mask).acc[0]
    prev, want = _shift(ids, 1), _ahead(y.cpu(), 1)
    return Rows(prev[rows].numpy(), want[rows].numpy(), drafts[rows].numpy(), fitted,
                None if shuffled is None else shuffled[rows].numpy())
