"""The cost of one speculative round, fitted from measured runs: one target verify pass plus k draft steps.

Model (seconds per round, at the batch size the runs were logged at)::

    round(k, M) = V + v * (M - 1) + d * k

``V`` is a verify pass of one token, ``v`` each further token it verifies, ``d`` one draft step;
``k`` is the number of draft steps and ``M`` the tokens one verify pass checks (SGLang's
``num_draft_tokens``; a chain has M = k + 1, SGLang's tree with topk > 1 usually more). A draft
step is taken to cost the same at every topk (the drafter is small; its step is latency-bound).

A run gives one equation: its round time, accept length / tok/s. The equations pin the
parameter combinations they span and nothing else: chains alone (M = k + 1) pin ``V`` and
``v + d`` but never how a round splits between verifying and drafting, which a tree run
(M != k + 1) or a profiled verify share (``VerifyShare``) does. A baseline run without
speculation gives the plain decode step, a floor for ``V`` (a verify pass reads at least what a
decode step reads). What the runs leave open is filled by stated assumptions, in this order,
each used only where the runs leave its direction free (``ASSUMPTIONS``):

1. ``flat-verify``: verifying more tokens costs no more than one (v = 0): a decode step at a
   small batch is bound by reading the weights, not by the tokens it checks;
2. ``verify-is-decode``: a one-token verify pass costs the baseline's decode step (V = step);
3. ``draft-ratio``: a draft step costs ``DRAFT_RATIO`` of a verify pass (replay's default
   ``--cost-ratio``), only without a baseline.

``CostFit`` keeps the point those assumptions pick and every extreme point of the costs the runs
allow (non-negative, V at least the decode step), so any prediction has a range that is one
number exactly when the runs pin it, and wide where an assumption decides.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ForensicsError

PARAMS = ("verify_s", "per_token_s", "draft_step_s")
DRAFT_RATIO = 0.05
# A run whose round time sits this many standard errors from the fit does not share the others' costs.
RESIDUAL_Z = 3.0
# Relative standard error assumed for a round time whose log gives no spread (a single data line).
DEFAULT_REL_SE = 0.02

ASSUMPTIONS = {
    "flat-verify": "verifying more tokens costs no more than one (v = 0): at a small batch a decode step is bound "
                   "by reading the weights, not by the tokens it checks",
    "verify-is-decode": "a one-token verify pass costs what a plain decode step of the baseline run costs",
    "draft-ratio": f"a draft step costs {DRAFT_RATIO:g} of a verify pass (replay's default --cost-ratio)",
}


@dataclass(frozen=True)
class RoundConfig:
    """What one round does: ``steps`` draft steps, ``topk`` branches per step, ``draft_tokens`` tokens verified."""

    steps: int
    topk: int = 1
    draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or self.topk < 1:
            raise ForensicsError(f"a speculative round needs steps >= 1 and topk >= 1, got {self.steps}, {self.topk}")
        if self.draft_tokens is None:
            object.__setattr__(self, "draft_tokens", self.steps + 1)
        elif self.draft_tokens < 2:
            raise ForensicsError(f"draft tokens (tokens one verify pass checks) must be >= 2, got {self.draft_tokens}")

    @property
    def verified(self) -> int:
        """Tokens one verify pass checks (M)."""
        return int(self.draft_tokens or self.steps + 1)

    @property
    def chain(self) -> bool:
        """A chain: one draft per step, every one verified (topk 1, M = steps + 1)."""
        return self.topk == 1 and self.verified == self.steps + 1

    def row(self) -> np.ndarray:
        """The coefficients of (V, v, d) in this round's time."""
        return np.array([1.0, float(self.verified - 1), float(self.steps)])

    @property
    def label(self) -> str:
        steps = f"{self.steps} step{'s' if self.steps != 1 else ''}"
        return steps if self.chain else f"{steps}, topk {self.topk}, {self.verified} draft tokens"

    def to_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "topk": self.topk, "draft_tokens": self.verified}


@dataclass(frozen=True)
class RoundTime:
    """One run's measured round time (seconds) with its standard error (NaN when its log gives no spread)."""

    label: str
    config: RoundConfig
    seconds: float
    se: float = math.nan


@dataclass(frozen=True)
class VerifyShare:
    """A profiled fact: the verify pass is ``share`` of a round of ``config`` that takes ``round_s`` seconds."""

    share: float
    config: RoundConfig
    round_s: float
    se: float = math.nan

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ForensicsError(f"verify share must be between 0 and 1 (a fraction of the round), got {self.share}")


@dataclass(frozen=True)
class Costs:
    """One set of round costs in seconds: verify pass of one token, each further verified token, one draft step."""

    verify_s: float
    per_token_s: float
    draft_step_s: float

    @classmethod
    def of(cls, theta: np.ndarray) -> Costs:
        return cls(*(float(x) for x in theta))

    def array(self) -> np.ndarray:
        return np.array([self.verify_s, self.per_token_s, self.draft_step_s])

    def round_s(self, config: RoundConfig) -> float:
        return float(config.row() @ self.array())

    def verify_pass_s(self, config: RoundConfig) -> float:
        """The verify pass of this round: V + v (M - 1)."""
        return self.verify_s + self.per_token_s * (config.verified - 1)

    def verify_share(self, config: RoundConfig) -> float:
        return self.verify_pass_s(config) / self.round_s(config)

    def to_dict(self) -> dict[str, float]:
        return {"verify_ms": 1e3 * self.verify_s, "per_token_ms": 1e3 * self.per_token_s,
                "draft_step_ms": 1e3 * self.draft_step_s}


@dataclass(frozen=True)
class Residual:
    """How far one run's round time sits from the fit, in seconds and in its standard errors."""

    label: str
    seconds: float
    z: float


@dataclass(frozen=True)
class CostFit:
    """The costs the runs allow: a point (assumptions filling what the runs leave open), the extreme points, SEs."""

    point: Costs
    vertices: tuple[Costs, ...]
    basis: np.ndarray = field(repr=False)  # orthonormal rows spanning what the runs pin
    covariance: np.ndarray = field(repr=False)  # of (V, v, d) within the pinned directions (seconds^2)
    assumptions: tuple[str, ...] = ()  # codes of ASSUMPTIONS the point uses
    residuals: tuple[Residual, ...] = ()
    notes: tuple[str, ...] = ()
    decode_step_s: float | None = None

    def pins(self, row: np.ndarray) -> bool:
        """Whether the runs fix ``row @ (V, v, d)`` (it lies in the span of the runs' equations)."""
        if self.basis.size == 0:
            return not np.any(row)
        rest = row - self.basis.T @ (self.basis @ row)
        return bool(np.linalg.norm(rest) <= 1e-9 * max(1.0, float(np.linalg.norm(row))))

    def pinned(self, config: RoundConfig) -> bool:
        return self.pins(config.row())

    @property
    def pinned_params(self) -> tuple[bool, bool, bool]:
        return tuple(self.pins(np.eye(3)[i]) for i in range(3))  # type: ignore[return-value]

    @property
    def determined(self) -> bool:
        """Every cost pinned by the runs (no assumption needed for any configuration)."""
        return all(self.pinned_params)

    def span(self, row: np.ndarray) -> tuple[float, float]:
        """The least and the largest ``row @ costs`` over every cost the runs allow."""
        values = [float(row @ v.array()) for v in self.vertices] or [float(row @ self.point.array())]
        return min(values), max(values)

    def round_range(self, config: RoundConfig) -> tuple[float, float]:
        return self.span(config.row())

    def se(self, row: np.ndarray) -> float:
        """Sampling standard error of ``row @ costs`` where the runs pin it; NaN where an assumption decides."""
        if not self.pins(row):
            return math.nan
        return float(math.sqrt(max(0.0, float(row @ self.covariance @ row))))

    def round_se(self, config: RoundConfig) -> float:
        return self.se(config.row())

    def param(self, i: int) -> dict[str, float | bool | None]:
        """One parameter in ms: point, least and largest allowed, SE where pinned."""
        row = np.eye(3)[i]
        lo, hi = self.span(row)
        se = self.se(row)
        return {"point": 1e3 * float(self.point.array()[i]), "lo": 1e3 * lo, "hi": 1e3 * hi,
                "se": None if math.isnan(se) else 1e3 * se, "pinned": self.pins(row)}


def _rank(a: np.ndarray) -> int:
    return int(np.linalg.matrix_rank(a, tol=1e-9 * max(1.0, float(np.abs(a).max(initial=0.0))))) if a.size else 0


def _row_basis(a: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning the row space of ``a`` (structural: ``a`` holds small integers)."""
    if not a.size:
        return np.zeros((0, 3))
    _, s, vt = np.linalg.svd(a)
    r = _rank(a)
    return vt[:r]


def _solve_bounded(rows: np.ndarray, values: np.ndarray, lower: np.ndarray) -> np.ndarray | None:
    """Least squares of ``rows @ x = values`` with ``x >= lower``, by trying every set of parameters held at their bound.

    Three parameters make eight sets; the feasible solution with the smallest residual wins (fewer
    parameters held at a bound on a tie). None when no set gives a feasible solution.
    """
    best: tuple[float, int, np.ndarray] | None = None
    for held in itertools.chain.from_iterable(itertools.combinations(range(3), n) for n in range(4)):
        free = [i for i in range(3) if i not in held]
        x = lower.astype(float).copy()
        if free:
            rhs = values - rows[:, list(held)] @ lower[list(held)] if held else values
            x[free] = np.linalg.lstsq(rows[:, free], rhs, rcond=None)[0]
        if np.any(x < lower - 1e-12 * max(1.0, float(np.abs(values).max(initial=1.0)))):
            continue
        res = float(np.sum((rows @ x - values) ** 2))
        key = (round(res, 18), len(held))
        if best is None or key < (round(best[0], 18), best[1]):
            best = (res, len(held), np.maximum(x, lower))
    return None if best is None else best[2]


def _vertices(basis: np.ndarray, fixed: np.ndarray, lower: np.ndarray) -> list[np.ndarray]:
    """Extreme points of {x : basis @ x = fixed, x >= lower}: the equalities plus (3 - rank) bounds held."""
    r = basis.shape[0]
    out: list[np.ndarray] = []
    scale = max(1.0, float(np.abs(fixed).max(initial=0.0)), float(np.abs(lower).max(initial=0.0)))
    for held in itertools.combinations(range(3), 3 - r):
        a = np.vstack([basis, np.eye(3)[list(held)]]) if held else basis
        b = np.concatenate([fixed, lower[list(held)]]) if held else fixed
        if _rank(a) < 3:
            continue
        x = np.linalg.solve(a, b)
        if np.all(x >= lower - 1e-9 * scale) and not any(np.allclose(x, y, atol=1e-12 * scale) for y in out):
            out.append(np.maximum(x, lower))
    return out


def _filled_se(times: Sequence[RoundTime]) -> np.ndarray:
    """Each round time's SE; a missing one takes the median relative SE of the others (else DEFAULT_REL_SE)."""
    rel = [t.se / t.seconds for t in times if math.isfinite(t.se) and t.se > 0 and t.seconds > 0]
    fill = float(np.median(rel)) if rel else DEFAULT_REL_SE
    return np.array([t.se if math.isfinite(t.se) and t.se > 0 else fill * t.seconds for t in times])


def fit_costs(times: Sequence[RoundTime], *, decode_step_s: float | None = None,
              verify_share: VerifyShare | None = None) -> CostFit:
    """Fit (V, v, d) to measured round times; see the module docstring for what is pinned and what is assumed.

    ``decode_step_s`` is the baseline run's time per token (1 / tok/s), the floor of V and the value
    ``verify-is-decode`` assumes; ``verify_share`` adds a profiled verify share as one more equation.
    """
    if not times:
        raise ForensicsError("no speculative run to fit a round cost to")
    for t in times:
        if not (math.isfinite(t.seconds) and t.seconds > 0):
            raise ForensicsError(f"run {t.label!r}: round time {t.seconds!r} s is not a positive number")
    rows = [t.config.row() for t in times]
    values = [t.seconds for t in times]
    ses = list(_filled_se(times))
    if verify_share is not None:
        row = verify_share.config.row().copy()
        row[2] = 0.0
        rows.append(row)
        values.append(verify_share.share * verify_share.round_s)
        se = verify_share.se if math.isfinite(verify_share.se) and verify_share.se > 0 else \
            DEFAULT_REL_SE * verify_share.share * verify_share.round_s
        ses.append(se)
    a, b, s = np.array(rows), np.array(values), np.array(ses)
    aw, bw = a / s[:, None], b / s
    basis = _row_basis(a)
    r = basis.shape[0]
    theta_ls = np.linalg.lstsq(aw, bw, rcond=None)[0]
    fitted = basis @ theta_ls
    resid = a @ theta_ls - b
    dof = len(b) - r
    chi2 = float(np.sum((resid / s) ** 2))
    inflate = max(1.0, chi2 / dof) if dof > 0 else 1.0
    cov = np.linalg.pinv(aw.T @ aw) * inflate
    notes: list[str] = []
    labels = [t.label for t in times] + (["verify share"] if verify_share is not None else [])
    residuals = tuple(Residual(lbl, float(x), float(x / sd)) for lbl, x, sd in zip(labels, resid, s))

    floor = float(decode_step_s) if decode_step_s is not None and math.isfinite(decode_step_s) and decode_step_s > 0 \
        else 0.0
    lower = np.array([floor, 0.0, 0.0])
    vertices = _vertices(basis, fitted, lower) if r < 3 else []
    if r < 3 and not vertices and floor > 0:
        notes.append(f"the runs allow no verify pass as slow as the baseline's decode step ({1e3 * floor:.2f} ms): "
                     "that floor is dropped (the baseline ran under other settings than the speculative runs?)")
        lower = np.array([0.0, 0.0, 0.0])
        vertices = _vertices(basis, fitted, lower)
    if r == 3:
        vertices = [theta_ls]
        if np.any(theta_ls < lower - 1e-12):
            clipped = _solve_bounded(aw, bw, lower)
            if clipped is None:
                raise ForensicsError("the runs admit no non-negative round cost")
            names = [PARAMS[i] for i in range(3) if theta_ls[i] < lower[i]]
            notes.append(f"the unconstrained fit gives {', '.join(names)} below its floor; held at the floor "
                         "(noise, or something other than the step count changed between runs)")
            vertices = [clipped]
    elif not vertices:
        clipped = _solve_bounded(aw, bw, lower)
        if clipped is None:
            raise ForensicsError("the runs admit no non-negative round cost")
        notes.append("the runs ask for a negative cost (a longer round measured faster than a shorter one): the fit "
                     "holds it at zero; did something other than the step count change between the runs?")
        vertices = [clipped]

    point_theta, used = _point(basis, fitted, vertices, lower, floor if decode_step_s else None)
    return CostFit(point=Costs.of(point_theta), vertices=tuple(Costs.of(v) for v in vertices), basis=basis,
                   covariance=cov, assumptions=tuple(used), residuals=residuals, notes=tuple(notes),
                   decode_step_s=decode_step_s)


def _point(basis: np.ndarray, fitted: np.ndarray, vertices: list[np.ndarray], lower: np.ndarray,
           decode_step_s: float | None) -> tuple[np.ndarray, list[str]]:
    """The costs the runs pin, completed by the assumptions in ``ASSUMPTIONS`` order where the runs leave them free."""
    if basis.shape[0] == 3 or len(vertices) == 1:
        return vertices[0], []
    priors: list[tuple[str, np.ndarray, float]] = [("flat-verify", np.array([0.0, 1.0, 0.0]), 0.0)]
    if decode_step_s is not None:
        priors.append(("verify-is-decode", np.array([1.0, 0.0, 0.0]), decode_step_s))
    priors.append(("draft-ratio", np.array([-DRAFT_RATIO, 0.0, 1.0]), 0.0))
    rows, values, used = [*basis], [*fitted], []
    weights = [1e6] * len(rows)
    weight = 1e2
    for code, row, value in priors:
        if _rank(np.array(rows + [row])) > _rank(np.array(rows)):
            rows.append(row)
            values.append(value)
            weights.append(weight)
            used.append(code)
            weight /= 1e2
        if _rank(np.array(rows)) == 3:
            break
    scale = max(float(np.abs(fitted).max(initial=0.0)), 1e-12)
    w = np.array(weights)
    a = np.array(rows) * w[:, None]
    b = np.array(values) * w / scale
    x = _solve_bounded(a, b, lower / scale)
    if x is None:  # cannot happen while vertices exist; keep the first extreme point
        return vertices[0], used
    theta = x * scale
    # The point must satisfy the runs: project back onto the pinned values where bounds bent it.
    if np.linalg.norm(basis @ theta - fitted) > 1e-6 * scale:
        theta = min(vertices, key=lambda v: float(np.linalg.norm(v - theta)))
    return theta, used
