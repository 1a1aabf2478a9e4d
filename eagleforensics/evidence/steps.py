"""The capture's own layer step from sums the scorer already kept, so identity need not re-read the file.

The step at a raw position p is the median per-token cosine of positions p and p+1 over the
aligned rows (``identity.step_reader`` reads the two positions to get it). The compiled
scorer meets every token's rows of all positions in order, so it keeps, besides each row's
squared norm, the dot product of each row with the same token's row one position below
(``adj``). From those two the cosines, and so the steps, follow without another read.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..arrays import as_array
from ..positions import Position

Steps = dict[tuple[int, int], float]  # (p, p+1) -> median per-token cosine


def lower_neighbours(positions: list[Position]) -> np.ndarray:
    """int8 [P]: 1 where positions[g-1] is the raw position right below raw positions[g] (p-1 and p)."""
    out = np.zeros(len(positions), np.int8)
    for g in range(1, len(positions)):
        lo, hi = positions[g - 1], positions[g]
        out[g] = not lo.normed and not hi.normed and hi.p == lo.p + 1
    return out


def steps_from(adj: Any, xx: Any, bad: Any, positions: list[Position], cs: int, lw: int) -> Steps:
    """The step of every pair of neighbouring raw positions (p-1, p) held in the sums: the median
    over aligned rows [cs, cs+lw) of adj / (|x_p| |x_p-1|), rows NaN/Inf on either side left out.

    ``adj``, ``xx``, ``bad`` are [P, T] as the scorer keeps them (``adj[g, i]``: row i of position
    g dotted with row i of position g-1; NaN where g has no such neighbour). As
    ``identity.step_reader`` (torch's ``cosine_similarity`` with eps 1e-30, then its median: the
    lower of the two middle values)."""
    adj, xx, bad = as_array(adj), as_array(xx), as_array(bad)
    below = lower_neighbours(positions)
    out: Steps = {}
    w = slice(cs, cs + lw)
    for g in np.flatnonzero(below):
        nx = np.sqrt(np.clip(xx[g, w].astype(np.float64), 0, None))
        ny = np.sqrt(np.clip(xx[g - 1, w].astype(np.float64), 0, None))
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN/Inf rows: left out below
            cos = adj[g, w].astype(np.float64) / (np.maximum(nx, 1e-30) * np.maximum(ny, 1e-30))
        cos = cos[~bad[g, w] & ~bad[g - 1, w] & np.isfinite(cos)]
        key = (positions[g - 1].p, positions[g].p)
        out[key] = lower_median(cos)
    return out


def lower_median(c: np.ndarray) -> float:
    """The lower of the two middle values for an even count (as torch.median), NaN when empty."""
    if not c.size:
        return math.nan
    k = (c.size - 1) // 2
    return float(np.partition(c, k)[k])


def known_first(steps: Steps | None, read: Callable[[int, int], float]) -> Callable[[int, int], float]:
    """``step_of(p, q)`` that answers from ``steps`` where the pair is there, else asks ``read``."""
    if not steps:
        return read

    def step_of(p: int, q: int) -> float:
        key = (min(p, q), max(p, q))
        return steps[key] if key in steps else read(p, q)

    return step_of
