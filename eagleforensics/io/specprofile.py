"""ModelOpt's ``speculation_profile.json``: a drafter's per-position acceptance, read as a reference curve and
written by ``replay --profile``.

Field names as NVIDIA/Model-Optimizer#2247 defines them (examples/specdec_bench/specdec_bench/
speculation_profile.py ``build_profile``, ``SCHEMA_VERSION = "1.0"``; a second producer in #2315,
examples/speculative_decoding/scripts/ar_validate.py; exported beside checkpoints by #2313). The pull requests
were open when read; the released nvidia-modelopt 0.47.0 wheel holds no such file (not read for any release).

* ``marginal_accept_rates[i]``: P(the first i + 1 drafts are all accepted), what vLLM's synthetic sampler and
  replay's reach@k both mean; ``conditional_accept_rates[i]``: that over the entry before it;
* ``mean_accept_length``: tokens per decode step with the bonus token (= 1 + sum of the marginals for
  longest-prefix verification); ``num_speculative_tokens``: K measured; ``method``; ``measured`` (false: a
  placeholder with no numbers); ``verification_method`` (``longest_prefix`` or ``block``);
  ``accept_length_model``; ``measurement_conditions``; ``acceptance_length_histogram``.

A profile given to ``plan --replay`` becomes one wiring labelled ``profile`` (read as the trained wiring), so the
serving-gap test has a reference without a capture. Refused with one line: a placeholder, block verification
(its vectors are not a longest-prefix distribution), marginals that rise (a survival function cannot).
"""
from __future__ import annotations

import math
from typing import Any

from ..errors import ForensicsError, printable

SCHEMA_VERSION = "1.0"
SOURCE = "NVIDIA/Model-Optimizer#2247 (speculation_profile.py build_profile)"
MAX_K = 64


def is_profile(doc: Any) -> bool:
    """Whether a parsed JSON object is a speculation profile."""
    return isinstance(doc, dict) and "schema_version" in doc and (
        "marginal_accept_rates" in doc or "conditional_accept_rates" in doc)


def _rates(value: Any, where: str, path: Any) -> list[float]:
    if not isinstance(value, list) or not value or len(value) > MAX_K:
        raise ForensicsError(f"speculation profile: {where} is not a list of 1-{MAX_K} numbers", path=path)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
            raise ForensicsError(f"speculation profile: {where}[{i}] is {printable(repr(v))[:40]}, expected a "
                                 "rate in [0, 1]", path=path)
        out.append(float(v))
    return out


def profile_steps(doc: dict[str, Any]) -> int:
    """Decode steps the profile was measured over (its histogram's counts; 0 when it has none)."""
    hist = doc.get("acceptance_length_histogram")
    if not isinstance(hist, dict):
        return 0
    counts = [v for v in hist.values() if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0]
    return int(sum(counts)) if all(math.isfinite(v) for v in counts) and sum(counts) < 1e12 else 0


def profile_reach(doc: dict[str, Any], path: Any) -> tuple[list[float], float, str]:
    """(marginals, accept length, what was measured) of a profile; bad or unusable input raises one line."""
    if doc.get("measured") is False:
        raise ForensicsError("speculation profile is a placeholder (measured: false): it holds no acceptance to "
                             "compare with", path=path)
    if str(doc.get("verification_method") or "longest_prefix") != "longest_prefix":
        raise ForensicsError(f"speculation profile measured with verification_method "
                             f"{printable(str(doc.get('verification_method')))[:40]}: its rates are not a "
                             "longest-prefix distribution, which the serving-gap test compares", path=path)
    if "marginal_accept_rates" in doc:
        marginal = _rates(doc["marginal_accept_rates"], "marginal_accept_rates", path)
    else:
        marginal, prod = [], 1.0
        for c in _rates(doc["conditional_accept_rates"], "conditional_accept_rates", path):
            prod *= c
            marginal.append(prod)
    rise = next((i for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-6), None)
    if rise is not None:
        raise ForensicsError(f"speculation profile: marginal_accept_rates rise at position {rise} "
                             f"({marginal[rise - 1]:g} -> {marginal[rise]:g}); P(first i drafts accepted) cannot",
                             path=path)
    k = doc.get("num_speculative_tokens")
    if isinstance(k, int) and not isinstance(k, bool) and 0 < k < len(marginal):
        marginal = marginal[:k]
    length = 1.0 + sum(marginal)
    what = ", ".join(f"{key} {printable(str(doc[key]))[:60]}" for key in ("method", "producer")
                     if doc.get(key)) or "no method named"
    return marginal, length, what


def profile_doc(wiring: dict[str, Any], steps: int, *, method: str = "eagle3",
                conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """A speculation profile for one replayed wiring (``replay --json``'s ``wirings`` item): its reach@k as the
    marginals, their ratios as the conditionals, 1 + their sum as the mean accept length."""
    reach = [float(r) if r is not None else 0.0 for r in (wiring.get("reach") or [])][:steps]
    if not reach:
        raise ForensicsError(f"replay measured no acceptance for wiring {wiring.get('label')!r}: no profile to write")
    conditional, prev = [], 1.0
    for m in reach:
        conditional.append(m / prev if prev > 0 else 0.0)
        prev = m
    length = 1.0 + sum(reach)
    return {
        "schema_version": SCHEMA_VERSION, "measured": True, "producer": "eagleforensics replay", "method": method,
        "num_speculative_tokens": len(reach), "max_supported_k": len(reach),
        "verification_method": "longest_prefix", "accept_length_model": "chain_analytic",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in reach],
        "mean_accept_length": round(length, 6),
        "accept_length_by_k": {str(len(reach)): round(length, 6)},
        "measurement_conditions": {"validation": "offline replay on a captured forward pass (teacher-forced chain)",
                                   "wiring": wiring.get("label"), "rows": wiring.get("starts"),
                                   **(conditions or {})},
    }
