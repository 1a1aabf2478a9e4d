"""The plan pipeline: from measured server runs, what a round costs, the tok/s of every step count, the best one, the serving gap.

``make_plan(PlanInputs(...))`` reads each run's log (``engines.logs``: accept length, tok/s; and its
launch from the arguments line, ``engines.serverargs``), fits the cost of a round
(``serving.roundcost``: a verify pass plus k draft steps, the verify pass growing with the
tokens it checks), takes the accept length of every chain length from replay's reach@k (the
wiring the engine feeds) or the logs' own figures (``serving.acceptcurve``), and predicts tok/s
for steps 1..8 and topk 1..8. Every prediction carries the range the runs allow: one number where
the runs pin it, wide where an assumption decides (named in ``assumptions``). With a replay JSON
it also tests for a serving gap (``serving.servinggap``) and names the usual suspects with this
run's own settings (``engines.suspects``).

Exit code: 1 when there is something to do (``TODO_CODES``: a faster step count than the served
one, a serving gap, a wiring that costs acceptance, speculation slower than the baseline, a pick
that hangs on an assumption), else 0; bad input is a ForensicsError (exit 2).
"""
from __future__ import annotations

import json
import math
from statistics import median
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import ForensicsError, printable
from .serving.acceptcurve import AcceptCurve, accepted_variance, from_length, from_reach
from .serving.roundcost import ASSUMPTIONS, CostFit, RoundConfig, RoundTime, VerifyShare, fit_costs
from .serving.servinggap import FLOOR, GapTest, median_se
from .results import Finding

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .engines.serverargs import ServerArgs
    from .engines.suspects import SuspectMatch
    from .io.replayfile import ReplayWiring

SCHEMA = "eagleforensics-plan-v1"
MAX_STEPS = 8
MAX_TOPK = 8
# A verify pass this many times a plain decode step is overhead of the speculative path worth profiling.
VERIFY_OVERHEAD = 1.3
# A predicted gain smaller than this (relative) is not a reason to restart a server.
MIN_GAIN = 0.01
# Two wirings replayed on the same capture differ by at least this (tokens per verify) before it counts.
WIRING_FLOOR = 0.05
TODO_CODES = ("better-steps", "serving-gap", "wiring-loss", "slower-than-baseline", "pick-depends")

FINDING_CODES = {
    "better-steps": "a step count (or tree) predicted faster than the served one",
    "serving-gap": "the server accepts well below replay's figure for the wiring it feeds: the loss is in the "
                   "serving path",
    "wiring-loss": "replay: the wiring the engine feeds accepts well below the trained wiring",
    "slower-than-baseline": "no predicted configuration beats the run without speculation",
    "pick-depends": "the best configuration changes across the costs (or accept lengths) the evidence allows",
    "under-determined": "the runs do not pin every cost: the assumptions used and the range they leave",
    "verify-overhead": "the verify pass costs well above a plain decode step",
    "fit-residual": "a run's round time does not fit the others' costs (something else changed)",
    "batch-differs": "runs logged at different batch sizes (costs depend on the batch)",
    "extrapolated": "acceptance past the measured steps is assumed",
    "no-tree-acceptance": "topk > 1 has no acceptance figure: only the break-even accept length is given",
    "serving-gap-above": "the server accepts more than replay expects, past the bar",
    "fit-note": "the fit held a cost at its floor, or dropped the decode-step floor",
}


def draft_tokens_for(steps: int, topk: int) -> int:
    """The num_draft_tokens plan pairs with (steps, topk): a chain verifies steps + 1; a tree the chain plus
    topk - 1 first-step alternatives (steps + topk), at most every node (topk x steps + 1)."""
    return steps + 1 if topk == 1 else min(steps + topk, topk * steps + 1)


@dataclass(frozen=True)
class PlanInputs:
    """What plan reads: labelled logs, which is the baseline and which the served run, and optional evidence."""

    logs: Mapping[str, str]
    baseline: str | None = None
    served: str | None = None
    replay: str | None = None
    wiring: str | None = None
    verify_share: float | None = None
    launch: Mapping[str, RoundConfig] = field(default_factory=dict)
    max_steps: int = MAX_STEPS
    max_topk: int = MAX_TOPK


@dataclass(frozen=True)
class RunFacts:
    """One run as plan uses it: medians and their SEs from the log, its launch, and its role."""

    label: str
    path: str
    engine: str | None
    lines: int
    accept_length: float
    accept_length_se: float
    tok_s: float
    tok_s_se: float
    batch: int
    per_position: tuple[float, ...] | None
    server_args: ServerArgs | None
    config: RoundConfig | None
    config_from: str
    speculative: bool
    role: str = "fit"  # baseline | served | fit | excluded
    note: str = ""

    @property
    def round_s(self) -> float:
        """Seconds per round per request: batch x accept length / tok/s."""
        return self.batch * self.accept_length / self.tok_s

    @property
    def round_se(self) -> float:
        rel = [x for x in (self.accept_length_se / self.accept_length, self.tok_s_se / self.tok_s) if math.isfinite(x)]
        return self.round_s * math.sqrt(sum(r * r for r in rel)) if rel else math.nan

    @property
    def launch_text(self) -> str:
        if not self.speculative:
            return "no speculation"
        algo = (self.server_args.algorithm_raw or self.server_args.algorithm) if self.server_args else "speculative"
        return f"{algo} {self.config.label}" if self.config else f"{algo} (steps unknown)"

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        spec = self.speculative and math.isfinite(self.accept_length)
        return {"label": self.label, "path": self.path, "engine": self.engine, "role": self.role,
                "lines": self.lines, "launch": self.launch_text,
                "config": self.config.to_dict() if self.config else None, "config_from": self.config_from or None,
                "accept_length": num(self.accept_length), "accept_length_se": num(self.accept_length_se),
                "tok_s": num(self.tok_s), "tok_s_se": num(self.tok_s_se), "batch": self.batch,
                "per_position_acceptance": list(self.per_position) if self.per_position else None,
                "round_ms": 1e3 * self.round_s if spec else None,
                "round_ms_se": 1e3 * self.round_se if spec and math.isfinite(self.round_se) else None,
                "server_args": self.server_args.to_dict() if self.server_args else None, "note": self.note or None}


@dataclass(frozen=True)
class Prediction:
    """tok/s of one configuration: round time and accept length with the ranges the evidence allows."""

    config: RoundConfig
    round_s: float
    round_lo: float
    round_hi: float
    round_se: float
    accept: float | None
    accept_lo: float | None
    accept_hi: float | None
    accept_how: str | None
    batch: int
    baseline_tok_s: float | None
    measured_tok_s: float | None = None
    measured_by: str | None = None

    @property
    def tok_s(self) -> float | None:
        return None if self.accept is None else self.batch * self.accept / self.round_s

    @property
    def tok_lo(self) -> float | None:
        return None if self.accept_lo is None else self.batch * self.accept_lo / self.round_hi

    @property
    def tok_hi(self) -> float | None:
        return None if self.accept_hi is None else self.batch * self.accept_hi / self.round_lo

    @property
    def speedup(self) -> float | None:
        return None if self.tok_s is None or not self.baseline_tok_s else self.tok_s / self.baseline_tok_s

    def break_even(self, tok_s: float) -> float:
        """The accept length this configuration needs to reach ``tok_s`` (at the point cost)."""
        return tok_s * self.round_s / self.batch

    def to_dict(self, best_tok_s: float | None = None) -> dict[str, Any]:
        def num(x: float | None, scale: float = 1.0) -> float | None:
            return None if x is None or not math.isfinite(x) else scale * x

        out = {**self.config.to_dict(), "round_ms": num(self.round_s, 1e3), "round_ms_lo": num(self.round_lo, 1e3),
               "round_ms_hi": num(self.round_hi, 1e3), "round_ms_se": num(self.round_se, 1e3),
               "accept_length": num(self.accept), "accept_length_lo": num(self.accept_lo),
               "accept_length_hi": num(self.accept_hi), "accept_from": self.accept_how,
               "tok_s": num(self.tok_s), "tok_s_lo": num(self.tok_lo), "tok_s_hi": num(self.tok_hi),
               "speedup": num(self.speedup), "measured_tok_s": num(self.measured_tok_s), "measured_by": self.measured_by,
               "break_even_accept_length": None}
        if self.accept is None and best_tok_s:
            out["break_even_accept_length"] = self.break_even(best_tok_s)
        return out


@dataclass(frozen=True)
class PlanReport:
    """Everything plan found: runs, the cost fit, the acceptance used, predictions, the pick, findings, suspects."""

    inputs: PlanInputs
    runs: list[RunFacts]
    fit: CostFit
    curve: AcceptCurve | None
    predictions: list[Prediction]
    served: RunFacts
    baseline: RunFacts | None
    findings: list[Finding]
    gap: GapTest | None = None
    gap_wiring: str | None = None
    gap_note: str | None = None
    suspects: list[SuspectMatch] = field(default_factory=list)
    best_range: list[RoundConfig] = field(default_factory=list)
    alternatives: dict[str, dict[str, Any]] = field(default_factory=dict)
    verify_share: VerifyShare | None = None
    alt_predictions: dict[str, list[Prediction]] = field(default_factory=dict)  # what-if curves, for the plots

    # -- the pick ---------------------------------------------------------------------------------
    @property
    def best(self) -> Prediction | None:
        scored = [p for p in self.predictions if p.tok_s is not None]
        return max(scored, key=lambda p: p.tok_s or 0.0, default=None)

    @property
    def served_prediction(self) -> Prediction | None:
        return next((p for p in self.predictions if p.config == self.served.config), None)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.code in TODO_CODES and f.severity != "info" for f in self.findings) else 0

    @property
    def todo(self) -> list[str]:
        return [f.fix for f in self.findings if f.code in TODO_CODES and f.severity != "info" and f.fix]

    @property
    def verdict(self) -> str:
        best, served = self.best, self.served_prediction
        parts = []
        if best is None:
            parts.append("no configuration has an accept length to predict tok/s from (see the findings)")
        else:
            base = f", {best.speedup:.2f}x the baseline" if best.speedup is not None else ""
            parts.append(f"best: {best.config.label} at {best.tok_s:.1f} tok/s predicted{base}")
            if served is not None and served.config != best.config and served.tok_s is not None:
                parts.append(f"served {served.config.label}: {served.tok_s:.1f} predicted, "
                             f"{self.served.tok_s:.1f} measured")
            elif served is not None and served.config == best.config:
                parts.append(f"the served {served.config.label} is the best ({self.served.tok_s:.1f} tok/s measured)")
        if self.gap is not None:
            parts.append(f"serving gap: {'yes' if self.gap.found else 'no'} (measured {self.gap.measured:.2f}, "
                         f"replay {self.gap.expected:.2f})")
        return "; ".join(parts)

    # -- forms ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        best = self.best
        best_tok = best.tok_s if best is not None else None
        fit = self.fit
        costs = {name: fit.param(i) for i, name in enumerate(("verify_ms", "per_token_ms", "draft_step_ms"))}
        served_pred = self.served_prediction
        return {
            "schema": SCHEMA, "verdict": self.verdict, "exit_code": self.exit_code, "todo": self.todo,
            "runs": [r.to_dict() for r in self.runs],
            "baseline": None if self.baseline is None else {
                "label": self.baseline.label, "tok_s": self.baseline.tok_s,
                "decode_step_ms": 1e3 * self.baseline.batch / self.baseline.tok_s},
            "served": {"label": self.served.label, **(self.served.config.to_dict() if self.served.config else {}),
                       "measured_tok_s": self.served.tok_s,
                       "predicted_tok_s": None if served_pred is None else served_pred.tok_s},
            "costs": {"model": "round = V + v (M - 1) + d k (seconds per round; M verified tokens, k draft steps)",
                      **costs, "determined": fit.determined,
                      "assumptions": [{"code": c, "text": ASSUMPTIONS[c]} for c in fit.assumptions],
                      "verify_share_given": None if self.verify_share is None else self.verify_share.share,
                      "residuals": [{"label": r.label, "ms": 1e3 * r.seconds, "z": r.z} for r in fit.residuals],
                      "notes": list(fit.notes)},
            "acceptance": None if self.curve is None else self.curve.to_dict(),
            "predictions": [p.to_dict(best_tok) for p in self.predictions],
            "best": None if best is None else {**best.to_dict(), "gain_over_served": (
                best.tok_s / served_pred.tok_s if served_pred is not None and served_pred.tok_s else None),
                "same_across_costs": len(self.best_range) <= 1,
                "across_costs": [c.to_dict() for c in self.best_range]},
            "alternatives": self.alternatives,
            "serving_gap": None if self.gap is None else {**self.gap.to_dict(), "wiring": self.gap_wiring,
                                                          "note": self.gap_note},
            "suspects": [m.to_dict() for m in self.suspects] if self.gap is not None and self.gap.found else [],
            "findings": [f.to_dict() for f in self.findings],
            "replay": self.inputs.replay,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=str)

    def to_text(self) -> str:
        return render_text(self)


# --- reading the runs ------------------------------------------------------------------------------

def _ratio(y: list[float], x: list[float]) -> tuple[float, float]:
    """sum(y) / sum(x) and its standard error (the ratio estimator's linearisation); NaN SE below two lines."""
    n = len(y)
    if n == 0 or sum(x) <= 0:
        return math.nan, math.nan
    r = sum(y) / sum(x)
    if n < 2:
        return r, math.nan
    e = [yi - r * xi for yi, xi in zip(y, x)]
    mx = sum(x) / n
    return r, math.sqrt(sum(v * v for v in e) / (n * (n - 1))) / mx


def _totals(sub: pd.DataFrame, engine: str | None) -> dict[str, Any]:
    """The run's accept length and tok/s as totals over its busy logging intervals, with standard errors.

    A line's figures are averages over one logging interval; the run's are ratios of sums. SGLang
    prints one line per ``decode_log_interval`` decode batches, so a line's tokens are proportional
    to (running requests x accept length) and its time to that over its tok/s. vLLM prints every
    10 s, so a line's tokens are proportional to its tok/s and its rounds to tok/s over accept
    length. (``logs`` shows the median line instead: robust for comparing runs, but rounded to the
    quantum of one interval's accept length, 1/40 for SGLang's default, which a cost fit cannot use.)
    """
    out: dict[str, Any] = {"accept_length": math.nan, "accept_length_se": math.nan, "tok_s": math.nan,
                           "tok_s_se": math.nan, "batch": 1, "per_position": None}
    rows = sub.to_dict(orient="records")
    busy = [r for r in rows if _finite(r["gen_throughput"]) and r["gen_throughput"] > 0
            and not (_finite(r["running_req"]) and float(r["running_req"]) == 0)]
    reqs = [int(r["running_req"]) for r in busy if _finite(r["running_req"])]
    out["batch"] = max(1, int(round(median(reqs)))) if reqs else 1
    if engine == "vllm":
        tps = [float(r["gen_throughput"]) for r in busy]
        if tps:
            mean = sum(tps) / len(tps)
            out["tok_s"] = mean
            out["tok_s_se"] = median_se(tps) / 1.2533 if len(tps) > 1 else math.nan
        last_tps = None
        y, x, pos_w, pos = [], [], [], []
        for r in rows:  # each SpecDecoding line follows the throughput line of its interval
            if _finite(r["gen_throughput"]):
                last_tps = float(r["gen_throughput"])
                continue
            if _finite(r["accept_length"]) and r["accept_length"] >= 1 and last_tps:
                y.append(last_tps)
                x.append(last_tps / float(r["accept_length"]))
                if isinstance(r["per_position_acceptance"], (list, tuple)) and r["per_position_acceptance"]:
                    pos.append(tuple(float(v) for v in r["per_position_acceptance"]))
                    pos_w.append(x[-1])
        if not y:  # spec lines without a throughput line before them: plain mean
            lengths = [float(r["accept_length"]) for r in rows if _finite(r["accept_length"])]
            y, x = lengths, [1.0] * len(lengths)
        out["accept_length"], out["accept_length_se"] = _ratio(y, x)
        if pos:
            n = max(set(len(p) for p in pos), key=[len(p) for p in pos].count)
            keep = [(p, w) for p, w in zip(pos, pos_w) if len(p) == n]
            total = sum(w for _, w in keep)
            out["per_position"] = tuple(sum(p[j] * w for p, w in keep) / total for j in range(n))
        return out
    # SGLang (and anything else): one line per fixed number of decode batches
    spec = [r for r in busy if _finite(r["accept_length"])]
    if spec:
        weights = [float(r["running_req"]) if _finite(r["running_req"]) else 1.0 for r in spec]
        lengths = [float(r["accept_length"]) for r in spec]
        out["accept_length"], out["accept_length_se"] = _ratio([w * v for w, v in zip(weights, lengths)], weights)
        y = [w * v for w, v in zip(weights, lengths)]
        x = [w * v / float(r["gen_throughput"]) for w, v, r in zip(weights, lengths, spec)]
    else:
        y = [float(r["running_req"]) if _finite(r["running_req"]) else 1.0 for r in busy]
        x = [w / float(r["gen_throughput"]) for w, r in zip(y, busy)]
    out["tok_s"], out["tok_s_se"] = _ratio(y, x)
    return out


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _facts(label: str, path: str, sub: pd.DataFrame, args: ServerArgs | None,
           launch: RoundConfig | None) -> RunFacts:
    engines = sub["engine"].dropna()
    engine = engines.iloc[0] if len(engines) else (args.engine if args else None)
    tot = _totals(sub, engine)
    per_pos = tot["per_position"]
    speculative = args.speculative if args is not None else math.isfinite(tot["accept_length"])
    config, config_from = None, ""
    if launch is not None:
        config, config_from = launch, "--launch"
    elif args is not None and args.speculative and args.num_steps and args.engine == "vllm" and args.topk is None:
        pass  # a vLLM speculative_token_tree: its shape is not three numbers; --launch gives it
    elif args is not None and args.speculative and args.num_steps:
        topk = args.topk or 1
        config = RoundConfig(args.num_steps, topk, args.num_draft_tokens or draft_tokens_for(args.num_steps, topk))
        config_from = "arguments line" + (" (topk and draft tokens: vLLM's chain)" if
                                          {"topk", "num_draft_tokens"} <= set(args.inferred) else "")
    elif per_pos:
        config, config_from = RoundConfig(len(per_pos)), "vLLM's per-position acceptance list (a chain)"
    if config is not None:
        _check_physical(label, path, config, config_from, tot["accept_length"])
    return RunFacts(label=label, path=path, engine=engine, lines=int(len(sub)), accept_length=tot["accept_length"],
                    accept_length_se=tot["accept_length_se"], tok_s=tot["tok_s"], tok_s_se=tot["tok_s_se"],
                    batch=tot["batch"], per_position=per_pos, server_args=args, config=config,
                    config_from=config_from, speculative=speculative)


def _check_physical(label: str, path: str, config: RoundConfig, config_from: str, accept_length: float) -> None:
    """A step count past the cap, or an accept length more than a round of that many steps can accept, is bad
    input (``io.physical``): named by where the step count came from, never planned."""
    from .io import physical

    where = f"--launch {label}=..." if config_from == "--launch" else f"run {label!r} ({config_from})"
    why = physical.steps_problem(config.steps)
    if why:
        raise ForensicsError(f"{where}: {why}", path=None if config_from == "--launch" else path)
    why = physical.accept_problem(accept_length, config.steps)
    if why:
        raise ForensicsError(f"run {label!r}: the log's {why}; the step count ({config_from}) or the log is wrong",
                             path=path)


def read_runs(inputs: PlanInputs) -> list[RunFacts]:
    """Parse every log into ``RunFacts``; a log without data lines is bad input naming the file (and why)."""
    from .engines.logs import parse_logs, waiting_message
    from .engines.runtimerules import undrafted_lines

    if not inputs.logs:
        raise ForensicsError("plan needs server logs: give LABEL=PATH (or PATH) for each run")
    unknown = [k for k in inputs.launch if k not in inputs.logs]
    if unknown:
        raise ForensicsError(f"--launch names run {unknown[0]!r}, which is not one of the runs: {', '.join(inputs.logs)}")
    from .io.proberun import is_probe_run

    probes = {label: path for label, path in inputs.logs.items() if is_probe_run(path)}
    df = parse_logs({k: v for k, v in inputs.logs.items() if k not in probes})
    by_run = df.attrs.get("server_args_by_run", {})
    for label in df.attrs.get("empty_runs", []):
        args = by_run.get(label)
        why = waiting_message(args) if args is not None else \
            "no SGLang 'Decode batch' or vLLM metrics line found (is this the server log?)"
        raise ForensicsError(why, path=inputs.logs[label])
    runs = []
    for label, path in inputs.logs.items():
        if label in probes:
            runs.append(_probe_facts(label, str(path), inputs.launch.get(label)))
            continue
        sub = df[df["run"] == label]
        off = undrafted_lines(sub, by_run.get(label), None)  # batches the engine ran undrafted: not the drafter's
        if len(off):
            sub = sub[~sub["line"].isin(off["line"])]
        runs.append(_facts(label, str(path), sub, by_run.get(label), inputs.launch.get(label)))
    return runs


def _probe_facts(label: str, path: str, launch: RoundConfig | None) -> RunFacts:
    """A ``probe --out`` run as plan uses a log's: its accept length, tok/s and launch as the server said them."""
    from .engines.serverargs import ServerArgs, normalise_algorithm
    from .io.proberun import read_probe_run

    run = read_probe_run(path)
    a = run["server_args"]
    algo = (a["algorithm"] or "speculative (method not said)") if run["speculative"] else None
    args = ServerArgs(engine=run["engine"], source="probe", line_no=None, version=a["version"],
                      version_hint=f"{run['engine']} {a['version']}" if a["version"] else None, model=a["model"],
                      draft=a["draft"], algorithm=normalise_algorithm(algo), algorithm_raw=algo,
                      num_steps=a["num_steps"], topk=a["topk"], num_draft_tokens=a["num_draft_tokens"],
                      cuda_graph=a["cuda_graph"], prefix_cache=a["prefix_cache"])
    config, config_from = None, ""
    if launch is not None:
        config, config_from = launch, "--launch"
    elif args.speculative and args.num_steps:
        topk = args.topk or 1
        config = RoundConfig(args.num_steps, topk, args.num_draft_tokens or draft_tokens_for(args.num_steps, topk))
        config_from = "the server's own account (probe)"
    return RunFacts(label=label, path=path, engine=run["engine"], lines=run["requests"],  # a request, not a line
                    accept_length=run["accept_length"], accept_length_se=run["accept_length_se"], tok_s=run["tok_s"],
                    tok_s_se=run["tok_s_se"], batch=run["batch"], per_position=run["per_position"], server_args=args,
                    config=config, config_from=config_from, speculative=run["speculative"])


def _roles(runs: list[RunFacts], inputs: PlanInputs) -> tuple[list[RunFacts], RunFacts | None, RunFacts]:
    labels = [r.label for r in runs]
    for name, value in (("--baseline", inputs.baseline), ("--served", inputs.served)):
        if value is not None and value not in labels:
            raise ForensicsError(f"{name} {value!r} is not one of the runs: {', '.join(labels)}")
    plain = [r for r in runs if not r.speculative and math.isfinite(r.tok_s) and r.tok_s > 0]
    if inputs.baseline is not None:
        base = next(r for r in runs if r.label == inputs.baseline)
        if base.speculative:
            raise ForensicsError(f"--baseline {base.label!r} ran with speculation ({base.launch_text}); the baseline "
                                 "is a run without it", path=base.path)
        if not (math.isfinite(base.tok_s) and base.tok_s > 0):
            raise ForensicsError(f"--baseline {base.label!r}: its log has no tok/s while requests ran", path=base.path)
    else:
        base = plain[0] if plain else None
    out = []
    for r in runs:
        if base is not None and r.label == base.label:
            out.append(replace(r, role="baseline"))
        elif not r.speculative:
            out.append(replace(r, role="excluded", note="no speculation, and not the baseline"))
        elif r.config is None:
            out.append(replace(r, role="excluded", note="its log gives no step count (no arguments line, or a vLLM "
                                                         "token tree): pass "
                                                         f"--launch {r.label}=STEPS[,TOPK,DRAFT_TOKENS]"))
        elif not (math.isfinite(r.accept_length) and math.isfinite(r.tok_s) and r.tok_s > 0):
            out.append(replace(r, role="excluded", note="its log has no accept length or no tok/s to fit"))
        else:
            out.append(r)
    fit_runs = [r for r in out if r.role == "fit"]
    if not fit_runs:
        raise ForensicsError("plan needs at least one speculative run with its step count, accept length and tok/s; "
                             f"runs: {', '.join(f'{r.label} ({r.note or r.launch_text})' for r in out)}")
    if inputs.served is not None:
        served = next(r for r in out if r.label == inputs.served)
        if served.role != "fit":
            raise ForensicsError(f"--served {served.label!r} cannot be planned for: "
                                 f"{served.note or 'it is the baseline'}", path=served.path)
    else:
        served = fit_runs[-1]
    out = [replace(r, role="served") if r.label == served.label else r for r in out]
    served = next(r for r in out if r.label == served.label)
    baseline = next((r for r in out if r.role == "baseline"), None)
    return out, baseline, served


# --- acceptance ------------------------------------------------------------------------------------

def _replay_expected(w: ReplayWiring, config: RoundConfig) -> tuple[float, float, str] | None:
    """(expected accept length, SE, how) for ``config`` from one replayed wiring; None when replay cannot say."""
    if not config.chain:
        tree = w.tree
        if tree and tree["topk"] == config.topk and tree["draft_tokens"] == config.verified and \
                tree["steps"] == config.steps and tree["accept_length"] is not None:
            how = "replay's tree figure"
            walk, forced = tree.get("chain_accept_length"), tree.get("teacher_forced_chain")
            if walk is not None and forced is not None and abs(walk - forced) > 0.05:
                how += (f" (from its own decode walk, where the chain gives {walk:.2f} against the teacher-forced "
                        f"{forced:.2f} the chain rows use: the capture is not the target's greedy text, so compare "
                        "tree and chain rows with care)")
            return float(tree["accept_length"]), math.nan, how
        return None
    reach = []
    for r in w.reach:
        if r is None:
            break
        reach.append(r)
    if not reach:
        return None
    k = min(config.steps, len(reach))
    length = 1.0 + sum(reach[:k])
    se = math.sqrt(accepted_variance(reach[:k]) / w.starts) if w.starts else math.nan
    how = "replay" if k == config.steps else f"replay's {k} steps (a lower bound for {config.steps})"
    if w.sampled_reach:
        sampled = [r for r in w.sampled_reach[:k] if r is not None]
        if len(sampled) == k and 1.0 + sum(sampled) < length:
            length = 1.0 + sum(sampled)
            how += f", its figure at temperature {w.temperature:g} (lower than greedy)"
    return length, se, how


def _curve_from_replay(w: ReplayWiring, max_steps: int) -> AcceptCurve | None:
    if not any(r is not None for r in w.reach):
        return None
    return from_reach(list(w.reach), max_steps, f"replay {w.label} ({w.source})", rows=w.starts or None)


def _curve_from_run(run: RunFacts, max_steps: int) -> AcceptCurve | None:
    if run.config is None or not run.config.chain:
        return None
    if run.per_position:
        return from_reach(list(run.per_position), max_steps, f"per-position acceptance logged by run {run.label}")
    return from_length(run.accept_length, run.config.steps, max_steps, f"accept length logged by run {run.label}",
                       se=run.accept_length_se)


# --- predictions -----------------------------------------------------------------------------------

def _predictions(fit: CostFit, curve: AcceptCurve | None, runs: list[RunFacts], served: RunFacts,
                 baseline: RunFacts | None, replay_w: ReplayWiring | None, max_steps: int,
                 max_topk: int) -> list[Prediction]:
    """Every (steps, topk) of the grid plus every measured configuration, with acceptance where some evidence gives it."""
    base_tok = baseline.tok_s if baseline is not None else None
    measured = {r.config: r for r in runs if r.config is not None and r.role in ("fit", "served")}
    configs = [RoundConfig(k, t, draft_tokens_for(k, t)) for t in range(1, max_topk + 1)
               for k in range(1, max_steps + 1)]
    extra = [c for c in measured if c not in configs]
    if replay_w is not None and replay_w.tree:
        tree = replay_w.tree
        c = RoundConfig(tree["steps"], tree["topk"], tree["draft_tokens"])
        if c not in configs and c not in extra:
            extra.append(c)
    out = []
    for c in configs + extra:
        point = fit.point.round_s(c)
        lo, hi = fit.round_range(c)
        accept = accept_lo = accept_hi = None
        how = None
        run = measured.get(c)
        if c.chain and curve is not None and curve.at(c.steps) is not None:
            p = curve.at(c.steps)
            accept, accept_lo, accept_hi, how = p.length, p.lo, p.hi, p.how
        elif not c.chain:
            got = _replay_expected(replay_w, c) if replay_w is not None else None
            if got is not None:
                accept = accept_lo = accept_hi = got[0]
                how = got[2]
            elif run is not None and run.label == served.label:
                accept = accept_lo = accept_hi = run.accept_length
                how = f"measured by run {run.label}"
        out.append(Prediction(c, point, lo, hi, fit.round_se(c), accept, accept_lo,
                              accept_hi, how, served.batch, base_tok,
                              measured_tok_s=run.tok_s if run is not None else None,
                              measured_by=run.label if run is not None else None))
    return out


def _best(preds: list[Prediction]) -> Prediction | None:
    scored = [p for p in preds if p.tok_s is not None]
    return max(scored, key=lambda p: p.tok_s or 0.0, default=None)


def _best_across_costs(fit: CostFit, preds: list[Prediction]) -> list[RoundConfig]:
    """The best configuration at each extreme point of the costs the runs allow (point acceptance), and at the
    point costs with the least and the largest accept lengths the evidence allows (where those are assumed)."""
    found: list[RoundConfig] = []
    scenarios = [(v, "accept") for v in fit.vertices] + [(fit.point, "accept_lo"), (fit.point, "accept_hi")]
    for costs, which in scenarios:
        scored = [(p.batch * getattr(p, which) / costs.round_s(p.config), p.config) for p in preds
                  if getattr(p, which) is not None]
        if scored:
            c = max(scored, key=lambda s: s[0])[1]
            if c not in found:
                found.append(c)
    return found


# --- the pipeline ----------------------------------------------------------------------------------

def make_plan(inputs: PlanInputs) -> PlanReport:
    """Run the plan pipeline (see the module docstring)."""
    from .engines.suspects import match_suspects

    if not 1 <= inputs.max_steps <= 32 or not 1 <= inputs.max_topk <= 32:
        raise ForensicsError("max steps and max topk must be between 1 and 32")
    runs, baseline, served = _roles(read_runs(inputs), inputs)
    fit_runs = [r for r in runs if r.role in ("fit", "served")]
    assert served.config is not None
    times = [RoundTime(r.label, r.config, r.round_s, r.round_se) for r in fit_runs if r.config is not None]
    share = None
    if inputs.verify_share is not None:
        share = VerifyShare(inputs.verify_share, served.config, served.round_s, inputs.verify_share * served.round_se)
    decode_step = baseline.batch / baseline.tok_s if baseline is not None and baseline.tok_s > 0 else None
    fit = fit_costs(times, decode_step_s=decode_step, verify_share=share)

    findings: list[Finding] = []
    replay_file = replay_w = trained_w = None
    fed_how = ""
    if inputs.replay is not None:
        from .io.replayfile import read_replay

        replay_file = read_replay(inputs.replay)
        if inputs.wiring is not None:
            replay_w = replay_file.by_label(inputs.wiring)
            if replay_w is None:
                raise ForensicsError(f"--wiring {inputs.wiring!r} is not a wiring of the replay JSON: "
                                     f"{', '.join(w.label for w in replay_file.wirings)}", path=inputs.replay)
            fed_how = "named with --wiring"
        else:
            replay_w, fed_how = replay_file.fed_by(served.engine)
        trained_w = replay_file.trained

    # serving gap: the served run against replay's figure for the wiring its engine feeds
    gap = None
    gap_note = None
    if replay_w is not None and math.isfinite(served.accept_length):
        got = _replay_expected(replay_w, served.config)
        if got is None:
            gap_note = (f"replay has no figure for {served.config.label} (run replay --topk {served.config.topk} "
                        f"--draft-tokens {served.config.verified} --steps {served.config.steps})")
        else:
            gap = GapTest(served.accept_length, served.accept_length_se, got[0], got[1])
            gap_note = f"{got[2]}; wiring: {fed_how}"

    # the acceptance used for the predictions
    run_curve = _curve_from_run(served, inputs.max_steps)
    replay_curve = _curve_from_replay(replay_w, inputs.max_steps) if replay_w is not None else None
    curve = replay_curve or run_curve
    if gap is not None and gap.found and run_curve is not None:
        curve = run_curve
    preds = _predictions(fit, curve, runs, served, baseline, replay_w, inputs.max_steps, inputs.max_topk)
    report_alts: dict[str, dict[str, Any]] = {}
    alt_preds: dict[str, list[Prediction]] = {}

    best = _best(preds)
    served_pred = next((p for p in preds if p.config == served.config), None)
    best_range = _best_across_costs(fit, preds)

    # -- findings ----------------------------------------------------------------------------------
    if gap is not None and gap.found:
        suspects = match_suspects(served.server_args)
        hits = [m for m in suspects if m.status == "matches"]
        closed = None
        if replay_curve is not None:
            closed_preds = _predictions(fit, replay_curve, runs, served, baseline, replay_w, inputs.max_steps,
                                        inputs.max_topk)
            closed = _best(closed_preds)
            alt_preds["if the serving gap closed (replay)"] = closed_preds
            if closed is not None:
                report_alts["if_serving_gap_closed"] = {**closed.to_dict(), "source": replay_curve.source}
        findings.append(Finding(
            "serving-gap", "warning",
            f"run {served.label} accepts {gap.measured:.2f} tokens per verify, replay expects {gap.expected:.2f} for "
            f"the wiring the engine feeds ({replay_w.label}): {gap.gap:.2f} below, past the bar of {gap.bar:.2f} "
            f"(max of {FLOOR:g} and 3 standard errors, {gap.noise_bar:.2f}). The drafter and its wiring are fine; the "
            "loss is in the serving path" + (f". This run's settings among the usual suspects: "
                                             f"{'; '.join(m.this_run for m in hits)}" if hits else "") +
            (f". Closing it: {closed.config.label} at {closed.tok_s:.1f} tok/s" if closed is not None and
             closed.tok_s else ""),
            fix="find the serving-path cause: " + "; ".join(f"{m.suspect.code}: {m.suspect.try_}" for m in hits[:4])
                if hits else "find the serving-path cause (see the suspects)",
            source="; ".join(sorted({s for m in hits for s in m.suspect.sources})) or "docs/causes.md row 3"))
    elif gap is not None and gap.above:
        findings.append(Finding("serving-gap-above", "info",
                                f"run {served.label} accepts {gap.measured:.2f}, more than replay's {gap.expected:.2f} "
                                f"by {-gap.gap:.2f}: replay's prompts are likely unlike the logged traffic (or the "
                                "server samples at a temperature replay does not)"))
    if replay_w is not None and trained_w is not None and replay_w is not trained_w and not replay_w.served_without:
        fed = _replay_expected(replay_w, served.config)
        want = _replay_expected(trained_w, served.config)
        if fed is not None and want is not None:
            # two replay figures on the same capture: only sampling error separates them, no floor for prompts
            test = GapTest(fed[0], fed[1], want[0], want[1], floor=WIRING_FLOOR)
            if test.found:
                fixed_curve = _curve_from_replay(trained_w, inputs.max_steps)
                fixed = None
                if fixed_curve is not None:
                    fixed_preds = _predictions(fit, fixed_curve, runs, served, baseline, trained_w, inputs.max_steps,
                                               inputs.max_topk)
                    alt_preds[f"with the trained wiring {trained_w.label} (replay)"] = fixed_preds
                    fixed = _best(fixed_preds)
                    if fixed is not None:
                        report_alts["if_wiring_fixed"] = {**fixed.to_dict(), "source": fixed_curve.source}
                findings.append(Finding(
                    "wiring-loss", "warning",
                    f"the engine feeds {replay_w.label} ({fed_how}); replay gives it accept length {fed[0]:.2f} at "
                    f"{served.config.label} against {want[0]:.2f} for the trained {trained_w.label}" +
                    (f"; with the trained wiring: {fixed.config.label} at {fixed.tok_s:.1f} tok/s predicted"
                     if fixed is not None and fixed.tok_s else ""),
                    fix="serve the trained positions: write the ids the engine needs (eagleforensics align / config)",
                    source="replay"))
    if best is not None and served_pred is not None and served_pred.tok_s and best.config != served.config:
        gain = best.tok_s / served_pred.tok_s - 1.0
        rel_se = [x for x in (best.round_se / best.round_s, served_pred.round_se / served_pred.round_s)
                  if math.isfinite(x)]
        margin = max(MIN_GAIN, 2.0 * math.sqrt(sum(x * x for x in rel_se))) if rel_se else MIN_GAIN
        if gain > margin:
            note = ""
            if best.accept_how in ("extrapolated", "geometric"):
                note = f" (its accept length is {best.accept_how}: {best.accept_lo:.2f} - {best.accept_hi:.2f})"
            if len(best_range) > 1:
                note += " under the assumed costs (see pick-depends)"
            findings.append(Finding(
                "better-steps", "warning",
                f"{best.config.label} is predicted at {best.tok_s:.1f} tok/s against {served_pred.tok_s:.1f} for the "
                f"served {served.config.label} (measured {served.tok_s:.1f}): +{100 * gain:.1f}%{note}",
                fix=f"serve with {_flags(best.config, served.engine)}"))
    if len(best_range) > 1:
        findings.append(Finding(
            "pick-depends", "warning",
            "the best configuration depends on what the runs leave open (costs, or accept lengths past what was "
            f"measured): {', '.join(c.label for c in best_range)} across them",
            fix=_measure_next(fit, served, best)))
    if baseline is not None and best is not None and best.tok_s is not None and best.tok_s < baseline.tok_s:
        findings.append(Finding(
            "slower-than-baseline", "warning",
            f"the best predicted configuration ({best.config.label}, {best.tok_s:.1f} tok/s) is slower than the run "
            f"without speculation ({baseline.tok_s:.1f} tok/s)",
            fix="serve without speculation, or cut the cost of a round (profile the verify pass)"))
    if not fit.determined:
        pinned = fit.pinned_params
        free = [n for n, p in zip(("V", "v", "d"), pinned) if not p]
        used = "; ".join(f"{c}: {ASSUMPTIONS[c]}" for c in fit.assumptions) or "none"
        msg = f"the runs pin {_pinned_text(fit)}, not {', '.join(free)}; assumed: {used}"
        shown = best if best is not None and not fit.pinned(best.config) else next(
            (p for p in preds if p.config.chain and p.tok_s is not None and not fit.pinned(p.config)), None)
        if shown is not None and shown.tok_lo is not None and shown.tok_hi is not None:
            msg += f". {shown.config.label}: {shown.tok_lo:.1f} - {shown.tok_hi:.1f} tok/s across the allowed costs"
        findings.append(Finding("under-determined", "info", msg, fix=_measure_next(fit, served, best)))
    if decode_step is not None:
        v_lo, v_hi = fit.span(_verify_row(served.config))
        if v_lo > VERIFY_OVERHEAD * decode_step:
            findings.append(Finding(
                "verify-overhead", "info",
                f"the verify pass of a {served.config.label} round ({served.config.verified} tokens) takes "
                f"{1e3 * v_lo:.2f}"
                + (f" - {1e3 * v_hi:.2f}" if v_hi - v_lo > 1e-6 else "")
                + f" ms, {v_lo / decode_step:.2f}x the baseline's decode step ({1e3 * decode_step:.2f} ms): the "
                "speculative path adds cost of its own (profile it: all-reduce/NCCL settings, CUDA graphs, the "
                "overlap scheduler SGLang turns off for EAGLE)"))
    bad = [r for r in fit.residuals if abs(r.z) > 3.0 and r.label != "verify share"]
    if bad:
        findings.append(Finding(
            "fit-residual", "warning",
            "round times that do not fit the other runs' costs: " +
            ", ".join(f"{printable(r.label)} ({1e3 * r.seconds:+.2f} ms, {r.z:+.1f} SE)" for r in bad) +
            "; did something other than the launch change between these runs (engine release, NCCL, GPUs, batch)?",
            fix="plan runs of one deployment at a time"))
    batches = sorted({r.batch for r in runs if r.role in ("fit", "served", "baseline")})
    if len(batches) > 1:
        findings.append(Finding("batch-differs", "info",
                                f"runs were logged at different batch sizes ({', '.join(map(str, batches))} running "
                                "requests): a round's cost depends on the batch, so the fit mixes regimes"))
    if curve is not None and curve.assumption:
        findings.append(Finding("extrapolated", "info", f"{curve.source}: {curve.assumption}"))
    if inputs.max_topk > 1 and not any(p.accept is not None for p in preds if not p.config.chain):
        findings.append(Finding("no-tree-acceptance", "info",
                                "no acceptance figure for topk > 1 (run replay with --topk K --draft-tokens M, or "
                                "measure a tree run): those rows give the accept length they would need instead"))
    for note in fit.notes:
        findings.append(Finding("fit-note", "info", note))
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    suspects = match_suspects(served.server_args) if gap is not None else []
    return PlanReport(inputs, runs, fit, curve, preds, served, baseline, findings, gap,
                      replay_w.label if replay_w is not None else None, gap_note, suspects, best_range, report_alts,
                      share, alt_preds)


def _verify_row(config: RoundConfig) -> Any:
    row = config.row().copy()
    row[2] = 0.0
    return row


def _pinned_text(fit: CostFit) -> str:
    names = ("V", "v", "d")
    pinned = [names[i] for i, p in enumerate(fit.pinned_params) if p]
    chain = fit.pins(RoundConfig(2).row() - RoundConfig(1).row())
    parts = pinned[:]
    if chain and not ({"v", "d"} <= set(pinned)):
        parts.append("v + d (a chain step)")
    return ", ".join(parts) if parts else "only the round time of the measured configuration"


def _measure_next(fit: CostFit, served: RunFacts, best: Prediction | None) -> str:
    """What one more run pins: another chain length when chains are not pinned, else a tree."""
    if not fit.pins(RoundConfig(2).row() - RoundConfig(1).row()):
        if best is not None and best.config.chain and best.config != served.config:
            k = best.config.steps
        else:
            k = served.config.steps + 2 if served.config else 3
        return f"measure one more run at another step count (e.g. {k} steps) to pin the cost of a step"
    return ("measure a tree run (topk > 1) or pass --verify-share from a profile to split a step's cost between "
            "verifying and drafting")


def _flags(config: RoundConfig, engine: str | None) -> str:
    if engine == "vllm":
        if config.chain:
            return f"--speculative-config '{{\"num_speculative_tokens\": {config.steps}, ...}}'"
        return f"a token tree of {config.verified} tokens (vLLM's speculative_token_tree)"
    return (f"--speculative-num-steps {config.steps} --speculative-eagle-topk {config.topk} "
            f"--speculative-num-draft-tokens {config.verified}")


# --- text ------------------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{1e3 * x:.2f}"


def _range(point: float | None, lo: float | None, hi: float | None, fmt: str, scale: float = 1.0) -> str:
    if point is None:
        return "-"
    text = f"{scale * point:{fmt}}"
    if lo is not None and hi is not None and (hi - lo) * scale > 0.005 * max(abs(scale * point), 1e-9):
        text += f" [{scale * lo:{fmt}}-{scale * hi:{fmt}}]"
    return text


def render_text(rep: PlanReport) -> str:
    """The plan for people: runs, costs, acceptance, the predictions table, findings; file text escaped."""
    pr = printable
    lines = []
    for r in rep.runs:
        role = {"served": " (served)", "baseline": " (baseline)", "excluded": " (not used)"}.get(r.role, "")
        what = f"{pr(r.label)}{role}: {pr(r.engine or '?')}, {pr(r.launch_text)}"
        if r.role == "baseline":
            what += f": {r.tok_s:.1f} tok/s, decode step {_ms(r.batch / r.tok_s)} ms"
        elif math.isfinite(r.accept_length) and math.isfinite(r.tok_s):
            what += (f": accept length {r.accept_length:.2f}, {r.tok_s:.1f} tok/s, round {_ms(r.round_s)} ms"
                     f" ({r.lines} lines, batch {r.batch})")
        if r.note:
            what += f" [{pr(r.note)}]"
        lines.append(("runs:    " if not lines else "         ") + what)
    fit = rep.fit
    cost_parts = []
    for i, (name, desc) in enumerate((("V", "verify pass of 1 token"), ("v", "each further verified token"),
                                      ("d", "draft step"))):
        p = fit.param(i)
        txt = f"{name} {p['point']:.2f} ms"
        if not p["pinned"]:
            txt += f" [{p['lo']:.2f}-{p['hi']:.2f}, not pinned]"
        elif p["se"] is not None:
            txt += f" (+-{p['se']:.2f})"
        cost_parts.append(f"{txt} ({desc})")
    lines.append("cost:    round = V + v (M - 1) + d k; " + "; ".join(cost_parts))
    if rep.verify_share is not None:
        lines.append(f"         verify share {rep.verify_share.share:g} of a {rep.served.config.label} round, given "
                     "(--verify-share)")
    for code in fit.assumptions:
        lines.append(f"         assumed {code}: {ASSUMPTIONS[code]}")
    if rep.curve is not None:
        lines.append(f"accept:  {pr(rep.curve.source)}")
    else:
        lines.append("accept:  none for chains (the served run is a tree and no replay JSON was given)")
    if rep.gap is not None:
        g = rep.gap
        lines.append(f"gap:     measured {g.measured:.2f} vs replay {g.expected:.2f} ({pr(rep.gap_wiring or '')}): "
                     f"gap {g.gap:+.2f}, bar {g.bar:.2f} -> {'SERVING GAP' if g.found else 'no serving gap'}")
    elif rep.gap_note:
        lines.append(f"gap:     not tested: {pr(rep.gap_note)}")
    lines += ["", f"VERDICT: {pr(rep.verdict)}", ""]

    best = rep.best
    best_tok = best.tok_s if best is not None else None
    head = ["steps", "draft tokens", "round ms", "accept len", "tok/s", "speed-up", "measured"]
    rows = []
    for p in rep.predictions:
        if not p.config.chain:
            continue
        mark = ("*" if p.config == rep.served.config else "") + ("<" if best is not None and p is best else "")
        rows.append([f"{p.config.steps}{mark}", str(p.config.verified),
                     _range(p.round_s, p.round_lo, p.round_hi, ".2f", 1e3),
                     _range(p.accept, p.accept_lo, p.accept_hi, ".2f") + (" ~" if p.accept_how in (
                         "extrapolated", "geometric") else ""),
                     _range(p.tok_s, p.tok_lo, p.tok_hi, ".1f"),
                     "-" if p.speedup is None else f"{p.speedup:.2f}x",
                     "-" if p.measured_tok_s is None else f"{p.measured_tok_s:.1f} ({pr(p.measured_by or '')})"])
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("chain (topk 1):")
        lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)))
        lines.append("  " + "  ".join("-" * w for w in widths))
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        lines.append("  (* served, < best; [lo-hi] = what the runs allow; ~ accept length assumed past what was "
                     "measured)")
    trees = [p for p in rep.predictions if not p.config.chain]
    if trees:
        lines += ["", "topk > 1 (num_draft_tokens = steps + topk, at most topk x steps + 1):"]
        scored = [p for p in trees if p.tok_s is not None]
        for p in scored:
            lines.append(f"  {p.config.label}: round {_range(p.round_s, p.round_lo, p.round_hi, '.2f', 1e3)} ms, "
                         f"accept length {p.accept:.2f} ({pr(p.accept_how or '')}), "
                         f"{_range(p.tok_s, p.tok_lo, p.tok_hi, '.1f')} tok/s")
        open_rows = [p for p in trees if p.tok_s is None]
        if best_tok and open_rows:
            lines.append(f"  no accept length for these; the least each topk needs to beat {best_tok:.1f} tok/s "
                         "(at its cheapest step count):")
            for topk in sorted({p.config.topk for p in open_rows}):
                cheapest = min((p for p in open_rows if p.config.topk == topk), key=lambda p: p.break_even(best_tok))
                lines.append(f"    topk {topk}: accept length >= {cheapest.break_even(best_tok):.2f} at "
                             f"{cheapest.config.label} (round "
                             f"{_range(cheapest.round_s, cheapest.round_lo, cheapest.round_hi, '.2f', 1e3)} ms)")
    if rep.findings:
        lines += ["", "findings:"] + [f"  [{f.severity}] {f.code}: {pr(f.message)}" for f in rep.findings]
    if rep.gap is not None and rep.gap.found:
        lines += ["", "serving-path suspects (this run's arguments):"]
        for m in rep.suspects:
            lines.append(f"  [{m.status}] {m.suspect.code}: {pr(m.this_run)}; try: {m.suspect.try_} "
                         f"({', '.join(m.suspect.sources)})")
    if rep.todo:
        lines += ["", "what to do:"] + [f"  - {pr(t)}" for t in rep.todo]
    return "\n".join(lines)
