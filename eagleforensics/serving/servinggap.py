"""Is a server's accept length well below what replay expects for the wiring it feeds? The bar and the test.

The bar is the larger of two things:

* sampling error: ``Z`` combined standard errors, sqrt(se_log^2 + se_replay^2). A log's accept
  length is a median over data lines, each an average over the rounds of one logging interval
  (SGLang: ``decode_log_interval`` decode batches; vLLM: 10 s), so its SE is 1.2533 sd / sqrt(n)
  from the spread of its lines (which holds prompt-to-prompt variation too, not only the
  binomial noise of acceptance). Replay's SE is sqrt(Var(accepted drafts) / rows)
  (``acceptcurve.accepted_variance``). Below this the gap may be noise;
* a floor of ``FLOOR`` tokens per verify (a chosen margin of about 0.3): what sampling
  error does not cover and replay's README lists: replay scores a capture's prompts, not the
  logged traffic; float32 against the server's bf16 kernels flips near-ties; steps past the
  first are teacher-forced on the capture's ids. With 10 lines of 40 rounds at L ~ 2.4 the log
  alone has SE ~ 0.05, so 3 SE ~ 0.16 and the floor decides; with a handful of lines the
  sampling term does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

FLOOR = 0.3
Z = 3.0
MEDIAN_SE = 1.2533  # SE of a median over n normal draws: 1.2533 sd / sqrt(n)


def median_se(values: list[float]) -> float:
    """Standard error of the median of ``values`` (NaN with fewer than two)."""
    xs = [v for v in values if math.isfinite(v)]
    n = len(xs)
    if n < 2:
        return math.nan
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return MEDIAN_SE * sd / math.sqrt(n)


@dataclass(frozen=True)
class GapTest:
    """Measured against expected accept length, the gap, the bar it must clear, and the verdict."""

    measured: float
    measured_se: float
    expected: float
    expected_se: float
    floor: float = FLOOR
    z: float = Z

    @property
    def gap(self) -> float:
        return self.expected - self.measured

    @property
    def combined_se(self) -> float:
        parts = [x for x in (self.measured_se, self.expected_se) if math.isfinite(x)]
        return math.sqrt(sum(x * x for x in parts)) if parts else math.nan

    @property
    def noise_bar(self) -> float:
        se = self.combined_se
        return self.z * se if math.isfinite(se) else math.nan

    @property
    def bar(self) -> float:
        noise = self.noise_bar
        return max(self.floor, noise) if math.isfinite(noise) else self.floor

    @property
    def found(self) -> bool:
        """The measured length is below the expected one by more than the bar."""
        return self.gap > self.bar

    @property
    def above(self) -> bool:
        """The server measured more than replay expects by more than the bar (replay's prompts differ, or its steps)."""
        return -self.gap > self.bar

    def to_dict(self) -> dict[str, float | bool | None]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"measured": num(self.measured), "measured_se": num(self.measured_se), "expected": num(self.expected),
                "expected_se": num(self.expected_se), "gap": num(self.gap), "noise_bar": num(self.noise_bar),
                "floor": self.floor, "bar": num(self.bar), "found": self.found}
