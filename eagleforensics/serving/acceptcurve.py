"""Accept length of a chain for every step count, from what was measured: replay's reach@k or a server's own figures.

A chain of k draft steps emits ``L(k) = 1 + reach@1 + ... + reach@k`` tokens per verify pass
(bonus token included), where reach@j is the probability that steps 1..j are all accepted
(replay's reach@k; vLLM's per-position acceptance rate). Reach never rises with j, and the drafter's
step j does not depend on how many steps follow it, so a figure measured at one step count bounds
every other:

* reach known for j <= S (replay, vLLM's per-position rates): exact up to S; past S the point
  continues the last conditional rate reach@S / reach@(S-1) (``extrapolated``), between L(S)
  (nothing more accepted) and L(S) + (k - S) reach@S (nothing more lost);
* only L(k0) known (SGLang logs an accept length, not per-position rates): the point assumes one
  conditional rate c at every step (reach@j = c^j, ``geometric``), between the bounds any
  non-increasing reach meeting L(k0) allows: for k < k0, 1 + k (L(k0) - 1) / k0 .. 1 + min(k, L(k0) - 1);
  for k > k0, L(k0) .. L(k0) + (k - k0)(L(k0) - 1) / k0.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ForensicsError


@dataclass(frozen=True)
class AcceptPoint:
    """The accept length of a chain of ``steps``: point, the least and largest the evidence allows, SE, how known."""

    steps: int
    length: float
    lo: float
    hi: float
    se: float = math.nan
    how: str = "measured"  # measured | extrapolated | geometric

    def to_dict(self) -> dict[str, object]:
        return {"steps": self.steps, "accept_length": self.length, "lo": self.lo, "hi": self.hi,
                "se": None if math.isnan(self.se) else self.se, "how": self.how}


@dataclass(frozen=True)
class AcceptCurve:
    """Accept length per chain step count, with where the figures come from and what was assumed."""

    source: str
    points: dict[int, AcceptPoint] = field(default_factory=dict)
    assumption: str | None = None
    measured_steps: int = 0  # steps up to which the figure is measured, not assumed

    def at(self, steps: int) -> AcceptPoint | None:
        return self.points.get(steps)

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "assumption": self.assumption, "measured_steps": self.measured_steps,
                "points": [p.to_dict() for _, p in sorted(self.points.items())]}


def accepted_variance(reach: Sequence[float]) -> float:
    """Variance of the number of accepted drafts in one round of a chain with this reach@1..k.

    A = sum_j 1[steps 1..j accepted]; E[A] = sum reach_j and, since reach@j implies reach@i for
    i < j, E[A^2] = sum_j (2j - 1) reach_j.
    """
    mean = sum(reach)
    second = sum((2 * j - 1) * r for j, r in enumerate(reach, start=1))
    return max(0.0, second - mean * mean)


def _check_reach(reach: Sequence[float | None]) -> list[float]:
    out: list[float] = []
    for r in reach:
        if r is None or not math.isfinite(float(r)):
            break  # a step no row reached: the figure stops there
        out.append(min(1.0, max(0.0, float(r))))
    for i in range(1, len(out)):
        out[i] = min(out[i], out[i - 1])  # reach never rises; rounding in a log can make it look so
    return out


def from_reach(reach: Sequence[float | None], max_steps: int, source: str, rows: int | None = None) -> AcceptCurve:
    """The curve from reach@1..S (replay, or a vLLM log's per-position rates); ``rows`` gives the sampling SE."""
    known = _check_reach(reach)
    if not known:
        raise ForensicsError(f"{source}: no reach@k figure to build an accept length from")
    s = len(known)
    points: dict[int, AcceptPoint] = {}
    cond = known[-1] / known[-2] if s >= 2 and known[-2] > 0 else known[-1]
    base = 1.0 + sum(known)
    for k in range(1, max_steps + 1):
        if k <= s:
            length = 1.0 + sum(known[:k])
            se = math.sqrt(accepted_variance(known[:k]) / rows) if rows else math.nan
            points[k] = AcceptPoint(k, length, length, length, se, "measured")
        else:
            extra = sum(known[-1] * cond ** j for j in range(1, k - s + 1))
            points[k] = AcceptPoint(k, base + extra, base, base + (k - s) * known[-1], math.nan, "extrapolated")
    assumption = None
    if max_steps > s:
        assumption = (f"past {s} step{'s' if s != 1 else ''} the conditional acceptance of the last measured step "
                      f"({cond:.3f}) is assumed to hold")
    return AcceptCurve(source, points, assumption, s)


def geometric_rate(length: float, steps: int) -> float:
    """The c with 1 + c + ... + c^steps = length (0 <= c <= 1), by bisection."""
    if length <= 1.0:
        return 0.0
    if length >= steps + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid ** j for j in range(steps + 1)) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def from_length(length: float, steps: int, max_steps: int, source: str, se: float = math.nan) -> AcceptCurve:
    """The curve from one accept length L measured at ``steps`` (an SGLang log): see the module docstring."""
    if not (math.isfinite(length) and length >= 1.0):
        raise ForensicsError(f"{source}: accept length {length!r} is not a number >= 1")
    length = min(length, steps + 1.0)
    c = geometric_rate(length, steps)
    drafts = length - 1.0
    points: dict[int, AcceptPoint] = {}
    for k in range(1, max_steps + 1):
        point = sum(c ** j for j in range(k + 1))
        if k == steps:
            points[k] = AcceptPoint(k, length, length, length, se, "measured")
        elif k < steps:
            points[k] = AcceptPoint(k, point, 1.0 + k * drafts / steps, 1.0 + min(k, drafts), math.nan, "geometric")
        else:
            points[k] = AcceptPoint(k, point, length, length + (k - steps) * drafts / steps, math.nan, "geometric")
    assumption = None
    if max_steps > 1:
        assumption = (f"only the accept length at {steps} step{'s' if steps != 1 else ''} is measured; other step "
                      f"counts assume one conditional acceptance {c:.3f} at every step (the range is what any "
                      "non-increasing acceptance per position allows)")
    return AcceptCurve(source, points, assumption, 0 if steps > 1 else 1)
