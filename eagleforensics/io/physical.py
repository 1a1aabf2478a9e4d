"""Physical bounds on what a server log, a launch or a replay JSON may claim: past them, the input is damaged.

A number can be a valid float and still be no measurement: ``plan`` fitted a run logging 1e-30
tok/s, and planned for 1e150 tok/s or an accept length of 60 on a 2-step tree. These bounds are
checked where the numbers are first read (``engines.logs`` per line, ``plan`` per run and
``--launch``, ``io.replayfile`` per wiring); a number past one is bad input naming the file and line.

* tok/s: 0 (an idle interval) or from ``MIN_PRINTED_TOK_S`` to ``MAX_TOK_S``. SGLang prints the
  decode throughput with two decimals (``gen throughput (token/s): {:.2f}``,
  scheduler_metrics_mixin.py) and vLLM with one (``Avg generation throughput: %.1f tokens/s``,
  vllm/v1/metrics/loggers.py), so a positive rate below 0.01 is no line either engine writes. The
  upper bound, 10 million tokens a second from one server, is a sane cap about a hundred times
  the largest aggregate decode rates published for one node.
* running requests: at most ``MAX_RUNNING_REQ`` (a million; engines default to a few hundred,
  ``max_num_seqs`` / ``max_running_requests``).
* steps: 1 to ``MAX_ENGINE_STEPS``. Neither SGLang (``speculative_num_steps``) nor vLLM
  (``num_speculative_tokens``) caps the step count in its argument checks; 64 is a documented cap
  of ours: published EAGLE-3 launches use 1 to 10 steps, and acceptance stops growing long before.
* accept length: a round verifies at most ``steps + 1`` tokens along one path (the drafted chain or
  the deepest tree branch, plus the bonus token), so the accept length of a run or wiring is at
  most ``steps + 1`` (``max_accept_length``).
"""
from __future__ import annotations

import math

MIN_PRINTED_TOK_S = 0.01
MAX_TOK_S = 1e7
MAX_RUNNING_REQ = 1_000_000
MAX_ENGINE_STEPS = 64
ACCEPT_SLACK = 1e-6  # rounding in a printed or averaged accept length


def max_accept_length(steps: int) -> int:
    """The most tokens one round can accept with ``steps`` draft steps: the path plus the bonus token."""
    return int(steps) + 1


def tok_s_problem(value: float) -> str | None:
    """Why a finite logged tok/s is no measurement, or None (non-finite values are left to the caller)."""
    if not math.isfinite(value) or value == 0:
        return None
    if value < 0:
        return f"a negative throughput ({value:g} tok/s)"
    if value < MIN_PRINTED_TOK_S:
        return (f"a throughput of {value:g} tok/s, which no engine prints (SGLang prints two decimals, vLLM one: a "
                "positive rate is at least 0.01)")
    if value > MAX_TOK_S:
        return f"a throughput of {value:g} tok/s, past the physical bound of {MAX_TOK_S:g} tok/s for one server"
    return None


def running_problem(value: float) -> str | None:
    """Why a logged number of running requests is no count, or None."""
    if not math.isfinite(value):
        return None
    if value < 0 or value != int(value):
        return f"{value:g} running requests (not a whole count)"
    if value > MAX_RUNNING_REQ:
        return f"{value:g} running requests, past the bound of {MAX_RUNNING_REQ:,} for one server"
    return None


def steps_problem(steps: int) -> str | None:
    """Why a step count is outside what plan accepts, or None."""
    if steps < 1:
        return f"{steps} draft steps (steps >= 1 expected)"
    if steps > MAX_ENGINE_STEPS:
        return (f"{steps} draft steps, past plan's cap of {MAX_ENGINE_STEPS} (published EAGLE-3 launches use 1 to "
                "10 steps)")
    return None


def accept_problem(length: float, steps: int) -> str | None:
    """Why an accept length cannot come from rounds of ``steps`` draft steps, or None."""
    if math.isfinite(length) and length > max_accept_length(steps) + ACCEPT_SLACK:
        return (f"accept length {length:g} is more than a round of {steps} draft step{'s' * (steps != 1)} can accept "
                f"({max_accept_length(steps)} tokens: the drafted path plus the bonus token)")
    return None
