"""Do a probe's requests agree? A heterogeneity test across requests (or counter windows) and the split it finds.

Each unit (a request, or a vLLM counter window) has an accept length L_i = counted tokens / rounds
and its own sampling SE, sqrt(Var(accepted drafts) / rounds). If one process served them all, the
L_i scatter by those SEs: Cochran's Q = sum w_i (L_i - L_w)^2 (w_i = 1 / SE_i^2) follows a
chi-square with n - 1 degrees of freedom. A Q far past it means the requests disagree beyond their
SE: a pool of back-ends that accept differently behind one address (a router, a balancer), or
prompts of very different kinds. The split is the cut of the sorted L_i that leaves the least
spread within the two groups, each group's figure the ratio of its sums. Torch-free, no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .probestats import ratio

P_DISAGREE = 1e-3  # Q's chi-square tail below this: the requests disagree
MIN_UNITS = 4  # fewer units and the test is not run


@dataclass(frozen=True)
class Group:
    """One side of the split: which units, its accept length, its SE, its rounds."""

    members: tuple[int, ...]
    accept_length: float
    se: float
    rounds: float


@dataclass(frozen=True)
class Heterogeneity:
    """Cochran's Q over the units, its chi-square tail, and the two-group split."""

    q: float
    df: int
    p: float
    low: Group
    high: Group

    @property
    def disagree(self) -> bool:
        return self.p < P_DISAGREE

    @property
    def split_gap(self) -> float:
        return self.high.accept_length - self.low.accept_length

    @property
    def split_se(self) -> float:
        parts = [g.se for g in (self.low, self.high) if math.isfinite(g.se)]
        return math.sqrt(sum(s * s for s in parts)) if parts else math.nan

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"q": num(self.q), "df": self.df, "p": num(self.p), "disagree": self.disagree,
                "split": [{"units": list(g.members), "accept_length": num(g.accept_length), "se": num(g.se),
                           "rounds": g.rounds} for g in (self.low, self.high)]}


def chi2_tail(q: float, df: int) -> float:
    """P(chi-square with ``df`` degrees of freedom > q), by the Wilson-Hilferty cube-root normal approximation."""
    if df <= 0 or not math.isfinite(q):
        return math.nan
    if q <= 0:
        return 1.0
    c = 2.0 / (9.0 * df)
    z = ((q / df) ** (1.0 / 3.0) - (1.0 - c)) / math.sqrt(c)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def heterogeneity(tokens: Sequence[float], rounds: Sequence[float], ses: Sequence[float]) -> Heterogeneity | None:
    """The test over units with counted tokens, rounds and each unit's own SE; None with too few usable units."""
    units = [(i, y, x, s) for i, (y, x, s) in enumerate(zip(tokens, rounds, ses))
             if x > 0 and math.isfinite(s) and s > 0]
    if len(units) < MIN_UNITS:
        return None
    lengths = [y / x for _, y, x, _ in units]
    w = [1.0 / (s * s) for *_, s in units]
    mean = sum(wi * li for wi, li in zip(w, lengths)) / sum(w)
    q = sum(wi * (li - mean) ** 2 for wi, li in zip(w, lengths))
    df = len(units) - 1
    order = sorted(range(len(units)), key=lambda j: lengths[j])
    best, cut = math.inf, 1
    for c in range(1, len(order)):
        lo, hi = order[:c], order[c:]
        within = sum(_ss([lengths[j] for j in g]) for g in (lo, hi))
        if within < best:
            best, cut = within, c

    def group(idx: list[int]) -> Group:
        y = [units[j][1] for j in idx]
        x = [units[j][2] for j in idx]
        length, se = ratio(y, x)
        if not math.isfinite(se):  # one unit: its own sampling SE
            se = units[idx[0]][3]
        return Group(tuple(sorted(units[j][0] for j in idx)), length, se, float(sum(x)))

    return Heterogeneity(q, df, chi2_tail(q, df), group(order[:cut]), group(order[cut:]))


def _ss(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs)


def histogram_variance(hist: Sequence[int]) -> float:
    """Var(accepted drafts per round) from a histogram of rounds that accepted 0, 1, 2, ... drafts."""
    n = sum(hist)
    if n <= 0:
        return math.nan
    mean = sum(j * c for j, c in enumerate(hist)) / n
    return sum(c * (j - mean) ** 2 for j, c in enumerate(hist)) / n


def alternation_z(labels: Sequence[bool]) -> float:
    """Wald-Wolfowitz runs test on two labels in arrival order: z of the number of runs (large and positive
    when the labels alternate more than chance would, as a round-robin router's back-ends do); NaN when one
    label is missing."""
    n1 = sum(1 for x in labels if x)
    n2 = len(labels) - n1
    n = n1 + n2
    if n1 == 0 or n2 == 0 or n < 3:
        return math.nan
    runs = 1 + sum(1 for a, b in zip(labels, labels[1:]) if a != b)
    mu = 2.0 * n1 * n2 / n + 1.0
    var = (mu - 1.0) * (mu - 2.0) / (n - 1.0)
    return (runs - mu) / math.sqrt(var) if var > 0 else math.nan
