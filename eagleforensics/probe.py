"""The probe pipeline: is a running server healthy, what does it accept per request, and does that match replay?

``make_probe(ProbeInputs(url, ...))`` sends the training records' own prompts (or a prompts file)
to a live SGLang or vLLM server (``engines.probeapi``, formats from the released wheels in
``engines.probeformats``) and reads back:

* health: the server answers, names its model, and each output is text, not degenerate; with a
  baseline server (no speculation) the greedy outputs are compared token by token;
* acceptance: SGLang per request (``spec_verify_ct`` per finished request), vLLM per counter
  window (its ``/metrics`` counters before and after), with a window dropped, and said, when the
  counters moved more than the probe's own tokens explain (other traffic); accept length with its
  standard error, per-position acceptance where the engine gives it, tok/s per request. No
  accept length is called from fewer than ``MIN_ROUNDS`` verify rounds;
* with a replay JSON: the serving-gap test (``serving.servinggap``) against replay's figure for
  the wiring the engine feeds, on the same prompts when replay ran on the same records.

Its JSON (schema ``eagleforensics-probe-v1``) is a run ``plan`` reads like a log (``run``).
Exit code: 1 when there is something to do (``TODO_CODES``), else 0; bad input, a stalled or
malformed server are ``ForensicsError`` (exit 2).
"""
from __future__ import annotations

import json
import math
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .engines import probecounts as pc
from .engines import probeformats as pf
from .engines.probeapi import (DECLARED, ENGINES, FAMILIES, Reply, ServerInfo, counters, detect, generate, info,
                               info_json, metrics_page, v0_k)
from .errors import ForensicsError, printable
from .serving.acceptcurve import accepted_variance
from .evidence.probestats import MIN_ROUNDS, NOTHING, chain_reach, degenerate, first_difference, per_position, ratio
from .serving.servinggap import FLOOR, GapTest
from .io.httpclient import Client
from .results import Finding

SCHEMA = "eagleforensics-probe-v1"
MAX_REQUESTS = 1024
DEFAULT_RECORDS = 16  # records read when --requests is not given
MAX_PROMPTS_BYTES = 16 * 1024 * 1024
HIDDEN = "(not shown; --show-url writes it)"

FINDING_CODES = {
    "degenerate-output": "an output is empty, stops at once, repeats one token sequence, or is not text",
    "greedy-differs": "a greedy output differs from the baseline server's (speculation must not change greedy text)",
    "accepts-nothing": "accept length about 1.00: the server verifies drafts but accepts (almost) none",
    "too-few-rounds": "too few verify rounds to call an accept length (the count is said)",
    "counters-moved": "vLLM's counters moved more than the probe's own tokens explain (other traffic): windows "
                      "dropped",
    "counters-short": "vLLM's counters did not account for the probe's tokens within the settle time",
    "serving-gap": "the server accepts well below replay's figure for the wiring it feeds, on the same prompts",
    "serving-gap-above": "the server accepts more than replay expects, past the bar",
    "no-speculation": "the server runs without speculative decoding: health and tok/s only",
    "release-unknown": "the server's release is not one the formats were read from (fields read by name)",
    "compared-by-text": "the release returns no token ids: outputs compared character by character",
    "metrics-disabled": "vLLM's /metrics carries no vllm: family (--disable-log-stats): acceptance cannot be read",
    "one-backend-metrics": "some requests moved vLLM's counters and others did not: /metrics is one back-end's of a "
                           "pool behind a router, so the figure is that back-end's, not the deployment's",
    "backends-differ": "the server's own account differs between reads (port, start time, launch): requests are "
                       "answered by several back-ends behind a router or balancer",
    "requests-disagree": "the requests' accept lengths disagree beyond their standard errors: the split is said",
    "adaptive-steps": "the server adapts its step count at run time: the steps actually run are read and used",
    "control-loss": "positive control: the server accepts less than replay predicts on the same records: the loss "
                    "is on the serving side",
    "control-holds": "positive control: the server accepts what replay predicts on the same records",
}
TODO_CODES = ("degenerate-output", "greedy-differs", "accepts-nothing", "too-few-rounds", "counters-moved",
              "counters-short", "serving-gap", "metrics-disabled", "one-backend-metrics", "backends-differ",
              "requests-disagree", "control-loss")
PART_OF_POOL = 0.9  # a V1 window holding less than this share of the probe's own tokens saw only part of them
ALTERNATES = 2.33  # runs-test z past which two groups alternate in arrival order (one-sided p 0.01)
CONTROL_FLOOR = 0.1  # the control's bar floor: same records, so only bf16 near-ties and teacher forcing remain


@dataclass(frozen=True)
class ProbeInputs:
    """What probe sends where: the server, the prompts, the generation, the optional baseline and replay."""

    url: str
    engine: str | None = None
    prompts: str | None = None
    train: tuple[str, ...] = ()
    target: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    baseline: str | None = None
    requests: int | None = None
    concurrency: int = 1
    timeout: float = 120.0
    replay: str | None = None
    api_key: str | None = None
    show_url: bool = False
    settle: float = 15.0
    control: bool = False  # positive control: replay's trained-wiring figure on the same records
    since: str | None = None  # an earlier probe JSON: the traffic between its end and this probe's start
    log: str | None = None  # the server's log: with ``since``, its decode lines between the two probes


@dataclass(frozen=True)
class Prompt:
    """One prompt: where it came from, its token ids (records) and its text."""

    label: str
    ids: tuple[int, ...] | None
    text: str

    @property
    def payload(self) -> list[int] | str:
        return list(self.ids) if self.ids is not None else self.text


@dataclass(frozen=True)
class Window:
    """vLLM counter deltas over some requests, and whether the probe's own tokens explain them."""

    requests: int
    tokens: int
    drafts: float
    accepted: float
    per_pos: tuple[float, ...] | None
    status: str  # ok | moved | short
    emitted: float

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "tokens": self.tokens, "drafts": _num(self.drafts),
                "accepted": _num(self.accepted), "emitted": _num(self.emitted), "per_position_accepted": list(self.per_pos) if self.per_pos else None,
                "status": self.status}


@dataclass
class ProbeReport:
    """Everything probe measured, its findings, and the forms (text, JSON)."""

    inputs: ProbeInputs
    server: ServerInfo
    prompts: list[Prompt]
    replies: list[Reply]
    windows: list[Window]
    accept_length: float
    accept_length_se: float
    rounds: float
    units: int
    per_pos: tuple[float, ...] | None
    tok_s: float
    tok_s_se: float
    findings: list[Finding]
    baseline: ServerInfo | None = None
    differs: list[tuple[int, int | None]] = field(default_factory=list)  # (request, first differing index)
    gap: GapTest | None = None
    gap_note: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    degenerate: list[str | None] = field(default_factory=list)  # per request: why its output is not text
    deployment: dict[str, Any] = field(default_factory=dict)  # heterogeneity, back-ends, steps as served
    control: GapTest | None = None
    control_note: str | None = None
    server_counters: dict[str, Any] | None = None  # cumulative counters at the probe's start and end
    between: dict[str, Any] | None = None  # --since: the window from the earlier probe's end to this one's start

    def request_acceptance(self, i: int) -> tuple[float | None, float | None]:
        """(verify rounds, accept length) of request ``i``: SGLang's fields, vLLM's per-request spec metrics, or
        its own vLLM counter window."""
        r = self.replies[i]
        if r.verify:
            return float(r.verify), r.completion_tokens / r.verify
        spec = r.extra.get("spec")
        if spec is not None and spec.steps:
            return float(spec.steps), spec.accept_length
        if len(self.windows) == len(self.replies) and self.windows[i].status == "ok" and self.windows[i].drafts > 0:
            w = self.windows[i]
            return w.drafts, (w.drafts + w.accepted) / w.drafts
        return None, None

    @property
    def per_request_figure(self) -> bool:
        """Whether the figure rests on requests (SGLang's fields, vLLM's per-request metrics), not counter windows."""
        return self.server.engine == "sglang" or (bool(self.replies) and all(
            r.extra.get("spec") is not None for r in self.replies))

    @property
    def called(self) -> bool:
        return math.isfinite(self.accept_length) and self.rounds >= MIN_ROUNDS

    @property
    def exit_code(self) -> int:
        return 1 if any(f.code in TODO_CODES and f.severity != "info" for f in self.findings) else 0

    @property
    def todo(self) -> list[str]:
        return [f.fix for f in self.findings if f.code in TODO_CODES and f.severity != "info" and f.fix]

    @property
    def healthy(self) -> bool:
        return not any(f.code in ("degenerate-output", "greedy-differs") for f in self.findings)

    @property
    def verdict(self) -> str:
        s = self.server
        parts = [f"{'healthy' if self.healthy else 'UNHEALTHY'}: {s.engine} {s.version or '(release not said)'} "
                 f"serving {s.model}"]
        codes = {f.code for f in self.findings}
        if any(f.code == "metrics-disabled" and f.severity == "warning" for f in self.findings):
            parts.append("metrics disabled: acceptance cannot be read (vLLM runs with --disable-log-stats)")
        elif not s.speculative:
            parts.append("no speculative decoding")
        elif self.called:
            parts.append(f"accept length {self.accept_length:.2f}" + (
                f" +- {self.accept_length_se:.2f}" if math.isfinite(self.accept_length_se) else " (SE n/a)") +
                f" over {self.rounds:.0f} rounds" +
                (" (ONE BACK-END's of a pool, not the deployment's)" if any(
                    f.code == "one-backend-metrics" and f.severity == "warning" for f in self.findings) else ""))
            if "requests-disagree" in codes and self.deployment.get("heterogeneity"):
                low, high = self.deployment["heterogeneity"]["split"]
                parts.append(f"requests disagree: {len(low['units'])} at {low['accept_length']:.2f}, "
                             f"{len(high['units'])} at {high['accept_length']:.2f}")
        elif self.windows and not any(w.status == "ok" for w in self.windows):
            why = "moved by other traffic" if any(w.status == "moved" for w in self.windows) else "not published"
            parts.append(f"accept length not called: vLLM's counters were {why} in every window")
        else:
            parts.append(f"accept length not called: {self.rounds:.0f} rounds, {MIN_ROUNDS} needed")
        if math.isfinite(self.tok_s):
            parts.append(f"{self.tok_s:.1f} tok/s per request")
        if "backends-differ" in codes or "one-backend-metrics" in codes:
            parts.append("behind a router: several back-ends answer")
        if self.gap is not None:
            parts.append(f"serving gap: {'yes' if self.gap.found else 'no'} (measured {self.gap.measured:.2f}, "
                         f"replay {self.gap.expected:.2f})")
        if self.control is not None:
            c = self.control
            parts.append(f"control: the server loses {c.gap:.2f} +- {c.combined_se:.2f} of replay's {c.expected:.2f} "
                         "on the same records (serving side)" if c.found else
                         f"control: the server accepts what the drafter can ({c.measured:.2f} vs replay "
                         f"{c.expected:.2f})")
        return "; ".join(parts)

    # -- forms ------------------------------------------------------------------------------------
    def run_record(self) -> dict[str, Any]:
        """The part ``plan`` reads: this server as one run (accept length, tok/s, its launch)."""
        s = self.server
        running = (self.deployment.get("steps") or {}).get("running")  # adaptive: the steps actually run
        return {"engine": s.engine, "speculative": bool(s.speculative), "requests": len(self.replies),
                "rounds": self.rounds, "accept_length": _num(self.accept_length) if self.called else None,
                "accept_length_se": _num(self.accept_length_se) if self.called else None,
                "tok_s": _num(self.tok_s), "tok_s_se": _num(self.tok_s_se),
                "batch": max(1, min(self.inputs.concurrency, len(self.replies))),
                "per_position_acceptance": list(self.per_pos) if self.per_pos and self.called else None,
                "server_args": {"engine": s.engine, "version": s.version, "model": s.model, "draft": s.draft,
                                "algorithm": s.algorithm, "num_steps": running or s.num_steps, "topk": s.topk,
                                "launch_num_steps": s.num_steps,
                                "num_draft_tokens": running + 1 if running and (s.topk or 1) == 1 else
                                s.num_draft_tokens, "cuda_graph": s.cuda_graph,
                                "prefix_cache": s.prefix_cache}}

    def to_dict(self) -> dict[str, Any]:
        reqs = []
        for i, (p, r) in enumerate(zip(self.prompts, self.replies)):
            reqs.append({"prompt": p.label, "completion_tokens": r.completion_tokens, "finish_reason": r.finish,
                         "seconds": r.seconds, "tok_s": r.completion_tokens / r.seconds if r.seconds > 0 else None,
                         "verify_passes": r.verify, "rounds": self.request_acceptance(i)[0],
                         "accept_length": self.request_acceptance(i)[1],
                         "engine_accept_length": r.accept_length,
                         "degenerate": self.degenerate[i] if i < len(self.degenerate) else None,
                         "differs_from_baseline_at": next((d for j, d in self.differs if j == i), None)})
        return {
            "schema": SCHEMA, "verdict": self.verdict, "exit_code": self.exit_code, "todo": self.todo,
            "server": {"url": self.inputs.url if self.inputs.show_url else HIDDEN, "engine": self.server.engine,
                       "version": self.server.version, "model": self.server.model,
                       "speculative": self.server.speculative,
                       "counters": self.server.counters.name if self.server.counters else None},
            "run": self.run_record(),
            "acceptance": {"accept_length": _num(self.accept_length), "accept_length_se": _num(self.accept_length_se),
                           "called": self.called, "rounds": self.rounds, "min_rounds": MIN_ROUNDS,
                           "units": self.units, "per": "request" if self.per_request_figure else "window",
                           "per_position_acceptance": list(self.per_pos) if self.per_pos else None},
            "requests": reqs, "windows": [w.to_dict() for w in self.windows],
            "baseline": None if self.baseline is None else {
                "url": self.inputs.baseline if self.inputs.show_url else HIDDEN, "engine": self.baseline.engine,
                "version": self.baseline.version, "model": self.baseline.model,
                "differing_outputs": sum(1 for _, d in self.differs if d is not None)},
            "serving_gap": None if self.gap is None else {**self.gap.to_dict(), "note": self.gap_note},
            "serving_gap_note": self.gap_note if self.gap is None else None,
            "deployment": self.deployment, "server_counters": self.server_counters, "between_runs": self.between,
            "control": None if self.control is None and self.control_note is None else {
                **(self.control.to_dict() if self.control is not None else {}), "note": self.control_note},
            "findings": [f.to_dict() for f in self.findings], "notes": self.notes,
            "settings": {"max_tokens": self.inputs.max_tokens, "temperature": self.inputs.temperature,
                         "concurrency": self.inputs.concurrency, "timeout_s": self.inputs.timeout},
            "seconds": self.seconds,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False, default=str)

    def to_text(self) -> str:
        return render_text(self)


def _fmt(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "n/a"


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


# --- prompts ---------------------------------------------------------------------------------------

def _record_files(paths: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
            if not files:
                raise ForensicsError("no record files in this folder", path=p)
            out += files
        elif p.exists():
            out.append(p)
        else:
            raise ForensicsError("no such training record", path=p)
    return out


def load_prompts(inputs: ProbeInputs) -> list[Prompt]:
    """The prompts to send: a prompts file (one per line, or JSON lines with ``prompt``) or the records' own."""
    if inputs.prompts is not None and inputs.train:
        raise ForensicsError("give --prompts or --train, not both")
    if inputs.prompts is not None:
        from .io.guards import parse_json, read_regular

        p = Path(inputs.prompts)
        if not p.exists():
            raise ForensicsError("no such prompts file", path=p)
        try:
            text = read_regular(p, MAX_PROMPTS_BYTES, "prompts file").decode("utf-8")
        except UnicodeDecodeError:
            raise ForensicsError("not UTF-8 text: one prompt per line (or JSON lines with \"prompt\")", path=p) from None
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            value = line
            if line.lstrip().startswith("{"):
                try:
                    obj = parse_json(line, p, f"line {n}", max_items=10_000, strict_numbers=True)
                except json.JSONDecodeError:
                    raise ForensicsError(f"line {n} starts with '{{' but is not JSON", path=p) from None
                value = obj.get("prompt") if isinstance(obj, dict) else None
                if not isinstance(value, str) or not value:
                    raise ForensicsError(f"line {n}: a JSON line needs a non-empty \"prompt\" string", path=p)
            out.append(Prompt(f"{p.name}:{n}", None, value))
        if not out:
            raise ForensicsError("has no prompts", path=p)
        return out
    if not inputs.train:
        raise ForensicsError("probe needs prompts: --train RECORDS (with --target DIR, the target's tokenizer) or "
                             "--prompts FILE")
    if inputs.target is None:
        raise ForensicsError("--train needs --target DIR: the records' prompts are decoded with the target's tokenizer")
    from .io.tokenizer import load_tokenizer
    from .io.training import load_training

    tok = load_tokenizer(inputs.target)
    out = []
    # a record is read whole (its hidden states too), so only as many as the requests use
    for f in _record_files(inputs.train)[:min(MAX_REQUESTS, inputs.requests or DEFAULT_RECORDS)]:
        rec = load_training(f)
        if rec.input_ids is None or len(rec.input_ids) < 2:
            raise ForensicsError("the record has no input_ids to take a prompt from", path=f)
        ids = [int(v) for v in rec.input_ids]
        cut = None
        if rec.loss_mask is not None:
            marked = [i for i, m in enumerate(rec.loss_mask) if m]
            cut = marked[0] if marked and marked[0] > 0 else None
        cut = cut or max(1, len(ids) // 2)  # no answer marked: the first half stands in for the prompt
        prompt = ids[:cut]
        if any(i < 0 or i >= tok.vocab_size for i in prompt):
            raise ForensicsError(f"token ids outside the target tokenizer's vocabulary ({tok.vocab_size}): the "
                                 "records were not written with this target's tokenizer", path=f)
        out.append(Prompt(f.name, tuple(prompt), tok.decode(prompt)))
    return out


# --- running -----------------------------------------------------------------------------------------

def _run(client: Client, server: ServerInfo, prompts: list[Prompt], inputs: ProbeInputs, *, temperature: float,
         per_request_windows: bool) -> tuple[list[Reply], list[tuple[dict[str, float], dict[str, float]]]]:
    """Send every prompt (at most ``concurrency`` at a time); vLLM: counter snapshots around each window."""
    snaps: list[tuple[dict[str, float], dict[str, float]]] = []
    replies: list[Reply | None] = [None] * len(prompts)

    def one(i: int) -> Reply:
        return generate(client, server.engine, prompts[i].payload, max_tokens=inputs.max_tokens,
                        temperature=temperature, model=server.model)

    try:
        if per_request_windows:  # one request at a time; the page read once per window (one window's end is
            after = None  # the next one's start)
            for i in range(len(prompts)):
                before = counters(client) if after is None else after
                replies[i] = one(i)
                after = counters(client)
                snaps.append((before, after))
            return [r for r in replies if r is not None], snaps
        before = counters(client) if server.engine == "vllm" else None
        # not a ``with`` block: its exit joins the workers before an interrupt could abort their calls
        pool = ThreadPoolExecutor(max_workers=max(1, inputs.concurrency), thread_name_prefix="probe")
        try:
            futures = {pool.submit(one, i): i for i in range(len(prompts))}
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in done:  # the first error, if any, is the one reported
                if fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
            for fut, i in futures.items():
                replies[i] = fut.result()
        except BaseException:
            client.abort()  # calls in flight end now, queued ones are dropped: no request runs on after this
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        if before is not None:
            snaps.append((before, counters(client)))
        return [r for r in replies if r is not None], snaps
    except KeyboardInterrupt:
        client.abort()  # calls in flight end now, so the pool's threads exit at once
        raise


def _window(before: dict[str, float], after: dict[str, float], fmt: pf.CounterFormat, k: int | None,
            requests: int, tokens: int, slack: float | None = None) -> Window:
    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if fmt is pf.V1:
        drafts, accepted = d(pf.V1_DRAFTS), d(pf.V1_ACCEPTED)
        positions = sorted((int(key.split("|")[1]), key) for key in after if key.startswith(pf.V1_PER_POS + "|"))
        per_pos = tuple(d(key) for _, key in positions) or None
        emitted = drafts + accepted
    elif fmt is pf.V1_EARLY:
        accepted = d(pf.V1_ACCEPTED)
        drafts = d(pf.V1_DRAFT_TOKENS) / k if k else math.nan
        per_pos = None
        emitted = drafts + accepted
    else:
        accepted, emitted = d(pf.V0_ACCEPTED), d(pf.V0_EMITTED)
        drafts = d(pf.V0_DRAFT_TOKENS) / k if k else math.nan
        per_pos = None
    if min(drafts, accepted, emitted) < 0:
        raise ForensicsError("vLLM's spec-decode counters went down during the probe (the server restarted, or a "
                             "router answers /metrics from different back-ends in turn: probe each back-end)")
    # Each request's first token comes from prefill, every later one from a round: own rounds + accepted
    # <= own tokens - requests, plus the drafts the engine counts past the cut at the stop (``slack``:
    # engines/probecounts.overshoot, per release and finish). Without it (0.7.3's V0, not read for that)
    # one token of slack per request.
    limit = tokens - requests + slack + 2 if slack is not None else tokens + requests + 2
    if emitted > limit:
        status = "moved"
    elif emitted < 0.5 * max(0, tokens - requests):
        status = "short"
    else:
        status = "ok"
    return Window(requests, tokens, drafts, accepted, per_pos, status, emitted)


def _v1_without_counters(version: str | None) -> bool:
    """vLLM 0.8.0 - 0.8.2: the V1 engine (the default) exports no spec-decode counter (0.8.2 ``vllm/v1/metrics``)."""
    from packaging.version import InvalidVersion, Version

    try:
        return version is not None and Version("0.8.0") <= Version(version) < Version("0.8.3")
    except InvalidVersion:
        return False


def _early_k(server: ServerInfo, snaps: list[tuple[dict[str, float], dict[str, float]]], replies: list[Reply],
             per_request: bool, notes: list[str]) -> tuple[ServerInfo, set[int]]:
    """vLLM 0.8.3/0.8.4: k from the probe's own tokens, and the windows that disagree with it (other traffic).

    Those releases count draft tokens and accepted tokens but not drafts, and declare the counters
    whether or not the server speculates. Every token after a request's first comes from a round,
    so a window's rounds are its tokens - requests - accepted, and k = draft tokens / rounds.
    """
    from statistics import median

    if per_request:
        units = [(b, a, r.completion_tokens, 1) for (b, a), r in zip(snaps, replies)]
    else:
        b, a = snaps[0]
        units = [(b, a, sum(r.completion_tokens for r in replies), len(replies))]
    est: list[float | None] = []
    total_draft = 0.0
    for b, a, tokens, n in units:
        dt = a.get(pf.V1_DRAFT_TOKENS, 0.0) - b.get(pf.V1_DRAFT_TOKENS, 0.0)
        acc = a.get(pf.V1_ACCEPTED, 0.0) - b.get(pf.V1_ACCEPTED, 0.0)
        total_draft += dt
        rounds = tokens - n - acc
        est.append(dt / rounds if rounds > 0 and dt > 0 else None)
    if total_draft <= 0:
        notes.append("vLLM 0.8.3/0.8.4 declare their spec-decode counters at start whether or not they speculate; "
                     "these stayed at 0 through the probe, so the server runs without speculation")
        return replace(server, speculative=False, counters=None), set()
    good = [e for e in est if e is not None]
    if not good:
        return server, set(range(len(units)))
    k = max(1, int(round(median(good))))
    if k > pf.MAX_STEPS:
        raise ForensicsError(f"vLLM's counters give {k} draft tokens per round, more than any engine runs (at most "
                             f"{pf.MAX_STEPS}; docs/probe.md, Hardening)")
    off = {i for i, e in enumerate(est) if e is None or abs(e - k) > 0.2 * k}
    notes.append(f"vLLM 0.8.3/0.8.4 count no drafts: k = {k} draft tokens per round, taken from the probe's own tokens "
                 "(tokens after a request's first = rounds + accepted)" +
                 ("" if per_request else "; in one window other traffic cannot be told apart (--concurrency 1 "
                                         "checks each request against k)"))
    return replace(server, num_steps=k, topk=1, num_draft_tokens=k + 1), (off if per_request else set())


def _settle(client: Client, fmt: pf.CounterFormat, before: dict[str, float], after: dict[str, float], k: int | None,
            requests: int, tokens: int, settle: float) -> dict[str, float]:
    """Read the counters again until they account for the probe's tokens (vLLM 0.7.3 updates them when it
    logs), at most ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while _window(before, after, fmt, k, requests, tokens).status == "short" and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        after = counters(client)
    return after


def _settle_declared(client: Client, after: dict[str, float], settle: float) -> dict[str, float]:
    """Read the counters again until spec-decode samples appear, at most ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while pf.counter_format(set(after)) is None and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        after = counters(client)
    return after


def _acceptance(server: ServerInfo, replies: list[Reply], windows: list[Window]
                ) -> tuple[float, float, float, int, tuple[float, ...] | None]:
    """(accept length, SE, rounds, units, per-position acceptance) from requests (SGLang) or clean windows (vLLM)."""
    if server.engine == "sglang":
        units = [r for r in replies if r.verify]
        rounds = float(sum(r.verify or 0 for r in units))
        length, se = ratio([r.completion_tokens for r in units], [r.verify or 0 for r in units])
        pos = per_position([r.histogram for r in replies if r.histogram])
        return length, _floor_se(se, length, pos, rounds, server.num_steps), rounds, len(units), pos
    clean = [w for w in windows if w.status == "ok" and w.drafts > 0]
    rounds = float(sum(w.drafts for w in clean))
    length, se = ratio([w.drafts + w.accepted for w in clean], [w.drafts for w in clean])
    pos = None
    if clean and all(w.per_pos for w in clean) and rounds > 0:
        width = min(len(w.per_pos or ()) for w in clean)
        pos = tuple(sum((w.per_pos or ())[j] for w in clean) / rounds for j in range(width))
    return length, _floor_se(se, length, pos, rounds, server.num_steps), rounds, len(clean), pos


def _floor_se(se: float, length: float, pos: tuple[float, ...] | None, rounds: float, steps: int | None) -> float:
    """The larger of the SE across requests (or windows) and the sampling error of the rounds themselves.

    The spread across requests holds prompt-to-prompt variation, but a handful of requests (or the
    same prompt sent again) can show none; the rounds' own error, sqrt(Var(accepted drafts) / rounds),
    comes from the per-position acceptance (``acceptcurve.accepted_variance``) or, where the engine
    gives none (SGLang 0.4.6, vLLM 0.7.3), from a chain with one acceptance probability per step
    fitted to the accept length (``probestats.chain_reach``).
    """
    if not (rounds > 0 and math.isfinite(length)):
        return se
    reach = pos or (chain_reach(length, steps) if steps else None)
    own = math.sqrt(accepted_variance(reach) / rounds) if reach else math.nan
    parts = [x for x in (se, own) if math.isfinite(x)]
    return max(parts) if parts else math.nan


def _spec_acceptance(server: ServerInfo, specs: list[pc.RequestSpec]
                     ) -> tuple[float, float, float, int, tuple[float, ...] | None]:
    """(accept length, SE, rounds, units, per-position acceptance) from vLLM's per-request spec metrics."""
    rounds = float(sum(x.steps for x in specs))
    length, se = ratio([x.steps + x.accepted for x in specs], [x.steps for x in specs])
    pos = per_position([x.histogram for x in specs])
    return length, _floor_se(se, length, pos, rounds, server.num_steps), rounds, len(specs), pos


def _units(server: ServerInfo, replies: list[Reply], windows: list[Window], specs: list[pc.RequestSpec],
           per_request: bool) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per request: (index, counted tokens, rounds, own sampling SE of its accept length), where the engine
    gives a figure per request (SGLang's fields, vLLM's per-request metrics or its per-request windows)."""
    from .evidence.probepool import histogram_variance

    idx: list[int] = []
    ys: list[float] = []
    xs: list[float] = []
    ses: list[float] = []

    def add(i: int, y: float, x: float, var: float) -> None:
        if x <= 0 or not math.isfinite(y):
            return
        if not math.isfinite(var):
            reach = chain_reach(y / x, server.num_steps) if server.num_steps else None
            var = accepted_variance(reach) if reach else math.nan
        if not math.isfinite(var):
            return
        idx.append(i)
        ys.append(y)
        xs.append(x)
        ses.append(math.sqrt((var + 1.0 / x) / x))  # 1/x: a request whose rounds all agree still has some SE

    if specs:
        for i, x in enumerate(specs):
            add(i, x.steps + x.accepted, x.steps, histogram_variance(x.histogram))
    elif server.engine == "sglang":
        for i, r in enumerate(replies):
            if r.verify:
                add(i, r.completion_tokens, r.verify, histogram_variance(r.histogram) if r.histogram else math.nan)
    elif per_request and len(windows) == len(replies):
        for i, w in enumerate(windows):
            if w.status == "ok" and w.drafts > 0:
                var = accepted_variance(tuple(v / w.drafts for v in w.per_pos)) if w.per_pos else math.nan
                add(i, w.drafts + w.accepted, w.drafts, var)
    return idx, ys, xs, ses


def _deployment(client: Client, server: ServerInfo, prompts: list[Prompt], replies: list[Reply],
                windows: list[Window], specs: list[pc.RequestSpec], pos: tuple[float, ...] | None, length: float,
                se: float, per_request: bool, findings: list[Finding], notes: list[str], out: dict[str, Any]
                ) -> ServerInfo:
    """A deployment as it is: one back-end or a pool behind a router, and the steps it actually runs.

    Returns the server as served (its running step count where it adapts) for the gap tests; fills
    ``out`` (the JSON's ``deployment``) and adds the findings.
    """
    from .evidence.probepool import alternation_z, heterogeneity

    # vLLM: counters that hold only some of the probe's requests are one back-end's of a pool. One window per
    # request: the requests that left them still went elsewhere; one window for the whole probe: V1 counters
    # move per step, so a window short of the probe's own tokens saw only part of them
    seen_by = None
    if per_request and len(windows) == len(replies) and len(windows) >= 2:
        idle = [i for i, w in enumerate(windows)
                if w.emitted == 0 and w.drafts == 0 and replies[i].completion_tokens > 1]
        moving = [i for i, w in enumerate(windows) if w.status == "ok" and w.drafts > 0]
        if idle and moving:
            out["metrics_backend_requests"] = moving
            seen_by = (f"{len(idle)} of {len(windows)} requests left vLLM's spec-decode counters where they were "
                       f"while the other {len(moving)} moved them by their own tokens")
    elif len(windows) == 1 and server.counters is pf.V1 and windows[0].requests > 1 and windows[0].emitted > 0:
        w = windows[0]
        share = w.emitted / max(1, w.tokens - w.requests)
        if share < PART_OF_POOL:
            out["metrics_share_of_probe_tokens"] = share
            seen_by = (f"vLLM's spec-decode counters account for {share:.0%} of the probe's own tokens "
                       f"({w.emitted:.0f} counted for {w.tokens} generated by {w.requests} requests)")
    if seen_by is not None:
        findings[:] = [f for f in findings if f.code != "counters-short"]
        findings.append(Finding(
            "one-backend-metrics", "info" if specs else "warning",
            f"{seen_by}: /metrics is one back-end's of a pool (a router or balancer sends requests to others), so "
            + ("the counters are that back-end's; the figure comes from each reply's own metrics" if specs else
               f"the accept length {length:.2f} is that back-end's, not the deployment's"),
            fix="probe each back-end at its own address, or start vLLM 0.29+ with "
                f"{pc.ENABLE_PER_REQUEST} (each reply then carries its own figure)"))
    # SGLang: the server's own account, read again: another back-end answers with another port or start time
    if server.engine == "sglang" and server.identity:
        seen = [server.identity]
        for _ in range(4):  # a round-robin router answers successive reads from successive back-ends
            try:
                args = next((got for got in (info_json(client, p, missing_ok=True) for p in pf.SGLANG_SERVER_INFO)
                             if got is not None), None)
            except ForensicsError:
                break
            again = pc.identity(args) if isinstance(args, dict) else ()
            if again and again not in seen:
                seen.append(again)
        if len(seen) > 1:
            fields = sorted({k for ident in seen for k, v in ident if dict(seen[0]).get(k) != v})
            out["backends"] = [dict(ident) for ident in seen]
            findings.append(Finding(
                "backends-differ", "warning",
                f"the server's own account (/server_info) differs between reads ({', '.join(fields)}): at least "
                f"{len(seen)} back-ends answer behind this address (a router or balancer), so the figure "
                f"{length:.2f} is the pool's, over whichever back-ends the requests reached",
                fix="probe each back-end at its own address to tell which one accepts less"))
    # do the requests agree? (a pool of back-ends that accept differently, or prompts of very different kinds)
    idx, ys, xs, ses = _units(server, replies, windows, specs, per_request)
    het = heterogeneity(ys, xs, ses)
    if het is not None:
        out["heterogeneity"] = {**het.to_dict(), "split": [
            {**g, "units": [idx[j] for j in g["units"]]} for g in het.to_dict()["split"]]}  # type: ignore[union-attr]
        if het.disagree:
            lo, hi = het.low, het.high
            clear = het.split_gap > max(FLOOR, 3 * het.split_se) if math.isfinite(het.split_se) else False
            # prompts of different kinds also disagree; a pool shows itself by more: the same prompt on both
            # sides, groups that alternate in arrival order (round robin), or the router seen otherwise
            high = {idx[j] for j in hi.members}
            payload = [json.dumps(p.payload) for p in prompts]
            straddle = any(payload[i] == payload[j] for i in high for j in idx if j not in high)
            z = alternation_z([i in high for i in idx])
            routed = any(f.code in ("backends-differ", "one-backend-metrics") for f in findings)
            why = [w for w, on in (("the same prompt lands in both groups", straddle),
                                   (f"the groups alternate in arrival order (runs test z {z:.1f})",
                                    math.isfinite(z) and z > ALTERNATES),
                                   ("several back-ends answer (above)", routed)) if on]
            out["heterogeneity"]["pool_evidence"] = why
            pool = clear and bool(why)
            findings.append(Finding(
                "requests-disagree", "warning" if pool else "info",
                f"the {len(idx)} requests disagree beyond their standard errors (Cochran's Q {het.q:.0f} on {het.df} "
                f"degrees of freedom, p {het.p:.1g}): {len(lo.members)} at {lo.accept_length:.2f} +- {lo.se:.2f}, "
                f"{len(hi.members)} at {hi.accept_length:.2f} +- {hi.se:.2f}" +
                (f"; {'; '.join(why)}: the figure {length:.2f} is a mix over a pool of back-ends that accept "
                 "differently behind one address (a router or balancer)" if pool else
                 "; nothing ties the split to back-ends: prompts of different kinds" if clear else
                 "; the split is within the bar of max(0.3, 3 SE)"),
                fix="probe each back-end at its own address and compare"))
    # steps as served: SGLang's adaptive steps move at run time; the gauge, else the per-position curve
    if server.adaptive:
        running, how = None, ""
        try:
            value = pc.gauge(metrics_page(client), pc.SGLANG_STEPS_GAUGE)
        except ForensicsError:
            value = None
        if value is not None and value > pf.MAX_STEPS:
            raise ForensicsError(f"{client.what}: /metrics says {pc.SGLANG_STEPS_GAUGE} = {value:g}, which no engine "
                                 f"runs (at most {pf.MAX_STEPS}; docs/probe.md, Hardening)")
        if value is not None and value >= 1:
            running, how = int(round(value)), f"the gauge {pc.SGLANG_STEPS_GAUGE} on /metrics"
        elif pc.served_steps(pos) is not None:
            running = pc.served_steps(pos)
            how = (f"the per-position acceptance ({', '.join(f'{v:.3f}' for v in (pos or ())[:running + 1])}) falls "
                   f"off after position {running}")
        out["steps"] = {"launched": server.num_steps, "running": running, "adaptive": True, "how": how or None}
        if running is not None and running != server.num_steps:
            findings.append(Finding(
                "adaptive-steps", "info",
                f"the server adapts its step count (speculative_adaptive): launched at {server.num_steps} steps, "
                f"running at {running} by {how}; replay is compared at {running} steps"))
            return replace(server, num_steps=running, num_draft_tokens=running + 1 if (server.topk or 1) == 1
                           else server.num_draft_tokens)
        notes.append("the server adapts its step count (speculative_adaptive)" +
                     (f"; running at {running} by {how}" if running else
                      "; the steps it runs could not be read (start SGLang with --enable-metrics for the gauge "
                      f"{pc.SGLANG_STEPS_GAUGE})"))
    return server


def _snapshot(client: Client, engine: str) -> dict[str, float] | None:
    """The server-wide cumulative counters a window's accept length comes from, or None where there are none:
    vLLM's drafts and accepted drafts; SGLang's generated tokens and verify passes (``--enable-metrics``)."""
    if engine == "vllm":
        values = counters(client)
        keep = {k: values[k] for k in (pf.V1_DRAFTS, pf.V1_ACCEPTED) if k in values}
        return keep if len(keep) == 2 else None
    try:
        text = metrics_page(client)
    except ForensicsError:  # 404 without --enable-metrics
        return None
    gen, calls = (pc.gauge(text, n, combine=sum) for n in (pc.SGLANG_GENERATED, pc.SGLANG_VERIFY_CALLS))
    return None if gen is None or calls is None else {pc.SGLANG_GENERATED: gen, pc.SGLANG_VERIFY_CALLS: calls}


def _between(earlier: dict[str, Any], now: dict[str, float] | None, now_time: float, engine: str,
             steps: int | None) -> dict[str, Any]:
    """The accept length of the traffic between an earlier probe's last read and this probe's first (the keys
    ``accept_length``, ``accept_length_se``, ``rounds``, ``tokens``, ``seconds``, ``note``; None where unknown)."""
    return {"accept_length": None, "accept_length_se": None, "rounds": None, "tokens": None,
            **_between_counts(earlier, now, now_time, engine, steps)}


def _between_counts(earlier: dict[str, Any], now: dict[str, float] | None, now_time: float, engine: str,
                    steps: int | None) -> dict[str, Any]:
    seconds = now_time - earlier["end_time"]
    before = earlier["end"]
    if now is None or before is None:
        return {"note": "not measured: the server's cumulative counters are not on /metrics (SGLang: start it with "
                        "--enable-metrics, or pass its log with --log; vLLM: the V1 counters with drafts)",
                "seconds": seconds}
    if engine == "vllm":
        rounds = now[pf.V1_DRAFTS] - before.get(pf.V1_DRAFTS, math.nan)
        tokens = rounds + now[pf.V1_ACCEPTED] - before.get(pf.V1_ACCEPTED, math.nan)
    else:
        rounds = now[pc.SGLANG_VERIFY_CALLS] - before.get(pc.SGLANG_VERIFY_CALLS, math.nan)
        tokens = now[pc.SGLANG_GENERATED] - before.get(pc.SGLANG_GENERATED, math.nan)
    if not (math.isfinite(rounds) and math.isfinite(tokens)) or rounds < 0 or tokens < 0 or seconds < 0:
        return {"note": "not measured: the counters went down since the earlier probe (the server restarted, or "
                        "another server answered)", "seconds": seconds}
    if rounds < MIN_ROUNDS:
        return {"note": f"not called: {rounds:.0f} verify rounds ran between the two probes ({MIN_ROUNDS} needed)",
                "seconds": seconds, "rounds": rounds}
    length = tokens / rounds
    reach = chain_reach(length, steps) if steps else None
    se = math.sqrt(accepted_variance(reach) / rounds) if reach else None
    return {"accept_length": length, "accept_length_se": se, "rounds": rounds, "tokens": tokens, "seconds": seconds,
            "note": "one window of every request the server finished between the two probes (SE: the rounds' own "
                    "sampling error, a chain fitted to the figure; no spread across requests)"}


def _log_between(between: dict[str, Any], log: str, engine: str, since: float, until: float) -> dict[str, Any]:
    """Add the server log's figure between two probes: its decode lines stamped after the earlier probe's
    end and a second before this one's start (the log's stamps are whole seconds on the server's clock,
    read as this machine's local time), the median accept length over them with its SE."""
    from datetime import datetime

    from .engines.logs import PLACEHOLDER_YEAR, parse_log
    from .serving.servinggap import median_se

    df = parse_log(log, engine=engine)
    t0, t1 = datetime.fromtimestamp(since), datetime.fromtimestamp(until - 1.0)
    if engine == "vllm":  # vLLM's stamps have no year (engines.logs)
        t0, t1 = t0.replace(year=PLACEHOLDER_YEAR), t1.replace(year=PLACEHOLDER_YEAR)
    rows = df[(df["time"] > t0) & (df["time"] < t1)] if len(df) else df
    values = [float(v) for v in rows["accept_length"].dropna()] if len(rows) else []
    got: dict[str, Any] = {"lines": len(values), "from": t0.isoformat(timespec="seconds"),
                           "to": t1.isoformat(timespec="seconds")}
    if values:
        values.sort()
        mid = len(values) // 2
        med = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        se = median_se(values)
        got.update(median_accept_length=med, median_accept_length_se=_num(se))
    out = {**between, "log": got}
    if out.get("accept_length") is None and values:
        out.update(accept_length=got["median_accept_length"], accept_length_se=got["median_accept_length_se"],
                   rounds=None, note=f"from the server log: the median over its {len(values)} decode lines between "
                                     "the two probes (each an interval's average; the counters, with SGLang's "
                                     "--enable-metrics, give the exact figure)")
    elif not values:
        out["log"]["note"] = "no decode line with an accept length between the two probes"
    return out


def _control(inputs: ProbeInputs, server: ServerInfo, length: float, se: float, called: bool,
             findings: list[Finding]) -> tuple[GapTest | None, str]:
    """The positive control: replay's trained-wiring figure on the same records against what the server accepts."""
    got = _replay_figure(inputs.replay or "", server, inputs.temperature, trained=True)
    if isinstance(got, str):
        return None, got
    if not called:
        return None, "not tested: the accept length is not called (too few rounds)"
    test = GapTest(length, se, got[0], got[1], floor=CONTROL_FLOOR)
    lost = test.gap / (test.expected - 1.0) if test.expected > 1.0 else math.nan
    if test.found:
        findings.append(Finding(
            "control-loss", "warning",
            f"positive control: on the records replay scored, the drafter can reach {test.expected:.2f} tokens per "
            f"verify and the server accepts {test.measured:.2f}: the server loses {test.gap:.2f} +- "
            f"{test.combined_se:.2f}" + (f" ({lost:.0%} of the accepted drafts)" if math.isfinite(lost) else "") +
            f", past the bar of {test.bar:.2f}: the cause is on the serving side (wiring, flags, quantization, cache)",
            fix="eagleforensics doctor on the drafter and the served launch (the layers the engine feeds, the "
                "draft path, quantization, CUDA graphs, the cache)"))
    else:
        findings.append(Finding(
            "control-holds", "info",
            f"positive control: the server accepts what the drafter can on the records replay scored "
            f"({test.measured:.2f} against replay's {test.expected:.2f}, gap {test.gap:+.2f}, bar {test.bar:.2f})"))
    return test, got[2] + "; replay must have scored these records (replay --json with the same --train files)"


def _replay_figure(replay: str, server: ServerInfo, temperature: float = 0.0, *, trained: bool = False
                   ) -> tuple[float, float, str] | str:
    """(expected accept length, SE, how) from replay for the served launch and temperature, or why there is none.

    Replay's reach is greedy unless it was run at a temperature (``sampled_reach``); a probe at a
    temperature replay did not use has no expectation (acceptance falls as the temperature rises).
    ``trained``: replay's row for the trained wiring (what the drafter can), not the one the engine feeds.
    """
    from .io.replayfile import read_replay

    rf = read_replay(replay)
    if trained:
        w = rf.trained
        how = "the trained wiring: what the drafter can on these records"
        if w is None:
            return "replay names no trained wiring (run replay with the training record, --train)"
    else:
        w, how = rf.fed_by(server.engine)
    if w is None:
        return f"replay measured no wiring ({how})"
    steps, topk = server.num_steps, server.topk or 1
    if not steps:
        return "the server does not say its step count, so replay's figure for it is unknown"
    if topk > 1:
        tree = w.tree
        if tree and tree.get("topk") == topk and tree.get("steps") == steps and tree.get("accept_length") is not None:
            return float(tree["accept_length"]), math.nan, f"replay's tree figure for {w.label}; wiring: {how}"
        return (f"the server drafts a tree (topk {topk}); replay has no figure for it (run replay --topk {topk} "
                f"--draft-tokens {server.num_draft_tokens} --steps {steps})")
    source = w.reach
    if temperature > 0:
        if not w.sampled_reach or w.temperature is None or abs(w.temperature - temperature) > 1e-6:
            return (f"the probe sampled at temperature {temperature:g} and replay has no figure at it (replay's "
                    "reach is greedy unless run at a temperature): probe at --temperature 0, or replay at this one")
        source = w.sampled_reach
    reach = []
    for r in source:
        if r is None:
            break
        reach.append(r)
    if not reach:
        return f"replay has no reach for {w.label}"
    k = min(steps, len(reach))
    se = math.sqrt(accepted_variance(reach[:k]) / w.starts) if w.starts else math.nan
    what = f"replay {w.label} at {k} step{'s' if k != 1 else ''}" + (
        "" if k == steps else f" (a lower bound for {steps})")
    return 1.0 + sum(reach[:k]), se, f"{what}; wiring: {how}"


# --- the pipeline ----------------------------------------------------------------------------------

def _check(inputs: ProbeInputs) -> None:
    if inputs.engine is not None and inputs.engine not in ENGINES:
        raise ForensicsError(f"--engine must be one of {', '.join(ENGINES)}")
    if not 1 <= inputs.max_tokens <= 65536:
        raise ForensicsError("--max-tokens must be between 1 and 65536")
    if not (math.isfinite(inputs.temperature) and 0.0 <= inputs.temperature <= 10.0):
        raise ForensicsError("--temperature must be between 0 and 10")
    if inputs.control and (inputs.replay is None or not inputs.train):
        raise ForensicsError("--control needs --train RECORDS and --replay REPLAY.json (replay --json on the same "
                             "records): replay's figure for the trained wiring on them is the control's expectation")
    if inputs.log is not None and inputs.since is None:
        raise ForensicsError("--log reads the server's log between two probes: give --since EARLIER.json too")
    if inputs.baseline is not None and inputs.temperature != 0.0:
        raise ForensicsError("--baseline compares greedy outputs token by token: --temperature must be 0")
    if inputs.requests is not None and not 1 <= inputs.requests <= MAX_REQUESTS:
        raise ForensicsError(f"--requests must be between 1 and {MAX_REQUESTS}")
    if not 1 <= inputs.concurrency <= 64:
        raise ForensicsError("--concurrency must be between 1 and 64")
    if not (math.isfinite(inputs.settle) and 0 <= inputs.settle <= 600):
        raise ForensicsError("--settle must be between 0 and 600 seconds")


def make_probe(inputs: ProbeInputs) -> ProbeReport:
    """Run the probe pipeline (see the module docstring)."""
    _check(inputs)
    started = time.monotonic()
    prompts = load_prompts(inputs)
    given = len(prompts)
    if inputs.replay is not None:
        from .io.replayfile import read_replay

        read_replay(inputs.replay)  # a bad replay file is said before any request is sent
    n = inputs.requests or min(len(prompts), MAX_REQUESTS)
    distinct = len({p.ids if p.ids is not None else p.text for p in prompts})
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    client = Client(inputs.url, timeout=inputs.timeout, api_key=inputs.api_key, what="the server")
    engine = inputs.engine or detect(client)
    server = info(client, engine)
    earlier = None
    if inputs.since is not None:
        from .io.proberun import read_probe_counters

        earlier = read_probe_counters(inputs.since)
        if earlier["engine"] != engine:
            raise ForensicsError(f"--since: that probe ran against {earlier['engine']}, this server is {engine}")
    start_counts, start_time = _snapshot(client, engine), time.time()
    findings: list[Finding] = []
    notes: list[str] = []
    note = pf.release_note(engine, server.version)
    if note:
        findings.append(Finding("release-unknown", "info", note))

    if inputs.requests is None and given > n:
        notes.append(f"the first {n} of {given} prompts were sent (--requests sends more, up to {MAX_REQUESTS})")
    if distinct < len(prompts):
        notes.append(f"{len(prompts)} requests over {distinct} distinct prompt{'s' if distinct != 1 else ''}: a "
                     "prompt sent again adds rounds, not prompt-to-prompt variety")
    per_request = (engine == "vllm" and server.counters in (pf.V1, pf.V1_EARLY) and inputs.concurrency == 1)
    replies, snaps = _run(client, server, prompts, inputs, temperature=inputs.temperature,
                          per_request_windows=per_request)
    windows: list[Window] = []
    metrics_off = False
    if engine == "vllm" and not server.speculative and snaps:
        before, after = snaps[-1]
        if pf.counter_format(set(after)) is None and DECLARED + pf.V0_EMITTED.removesuffix("_total") in after:
            after = _settle_declared(client, after, inputs.settle)  # 0.7.3: samples appear when it logs
            snaps[-1] = (before, after)
        fmt = pf.counter_format(set(after))
        if fmt is not None:
            server = replace(server, speculative=True, counters=fmt)
        elif DECLARED + pf.V0_EMITTED.removesuffix("_total") in after:
            notes.append(f"vLLM 0.7.3 declares its spec-decode counters whether or not it speculates; none were "
                         f"written within --settle {inputs.settle:g} s after the probe, so it is taken to run "
                         "without speculation")
        elif FAMILIES not in after:
            metrics_off = True
    early_moved: set[int] = set()
    if engine == "vllm" and server.counters is pf.V1_EARLY:
        server, early_moved = _early_k(server, snaps, replies, per_request, notes)
    if engine == "vllm" and server.speculative and server.counters is not None:
        fmt = server.counters
        k = server.num_steps
        slack = None if fmt is pf.V0 else [pc.overshoot(server.version, k, r.finish) for r in replies]
        if per_request:
            windows = [_window(b, a, fmt, k, 1, r.completion_tokens, None if slack is None else slack[i])
                       for i, ((b, a), r) in enumerate(zip(snaps, replies))]
            windows = [replace(w, status="moved") if i in early_moved else w for i, w in enumerate(windows)]
        else:
            before, after = snaps[0]
            tokens = sum(r.completion_tokens for r in replies)
            if fmt is pf.V0:
                after = _settle(client, fmt, before, after, k, len(replies), tokens, inputs.settle)
                k = k or v0_k(after)
                if k and not server.num_steps:
                    server = replace(server, num_steps=k, topk=1, num_draft_tokens=k + 1)
                notes.append("vLLM 0.7.3 counts no drafts per request: one window, its SE from a chain with one "
                             "acceptance probability per step fitted to the accept length")
            windows = [_window(before, after, fmt, k, len(replies), tokens, None if slack is None else sum(slack))]
            if inputs.concurrency > 1:
                notes.append(f"{inputs.concurrency} requests at a time: vLLM's counters give one window for the "
                             "whole probe (run --concurrency 1 for one window per request and an SE across them)")
        moved = [w for w in windows if w.status == "moved"]
        short = [w for w in windows if w.status == "short"]
        # what is left still carries a figure: the dropped windows are said, nothing to do about them
        enough = sum(w.drafts for w in windows if w.status == "ok" and w.drafts > 0) >= MIN_ROUNDS
        if moved:
            findings.append(Finding(
                "counters-moved", "info" if enough else "warning",
                f"vLLM's spec-decode counters moved by more than the probe's own tokens in {len(moved)} of "
                f"{len(windows)} windows (e.g. {moved[0].emitted:.0f} tokens counted against {moved[0].tokens} "
                "generated): other requests ran on the server, and those windows are left out" +
                ("; the figure rests on the others" if enough else ""),
                fix="probe when nothing else runs on the server (or point --url at a replica without traffic)"))
        if short:
            findings.append(Finding(
                "counters-short", "info" if enough else "warning",
                f"vLLM's spec-decode counters account for fewer tokens than the probe generated in {len(short)} of "
                f"{len(windows)} windows (e.g. {short[0].emitted:.0f} counted against {short[0].tokens}): the "
                "server had not published them" + (f" within --settle {inputs.settle:g} s" if
                                                    server.counters is pf.V0 else ""),
                fix="raise --settle (vLLM 0.7.3 updates its counters when it logs, every few seconds)"))

    end_counts, end_time = _snapshot(client, engine), time.time()
    server_counters = {"start": start_counts, "end": end_counts, "start_time": start_time, "end_time": end_time}
    between = None if earlier is None else _between(earlier, start_counts, start_time, engine, server.num_steps)
    if between is not None and inputs.log is not None:
        between = _log_between(between, inputs.log, engine, earlier["end_time"], start_time)
    specs = [r.extra.get("spec") for r in replies] if engine == "vllm" else []
    use_specs = bool(specs) and all(x is not None for x in specs)
    if use_specs:
        k = max(x.k for x in specs)
        server = replace(server, speculative=True, num_steps=server.num_steps or k, topk=server.topk or 1,
                         num_draft_tokens=server.num_draft_tokens or k + 1)
        notes.append("vLLM's per-request spec-decode metrics (metrics.speculative_decoding) give each request's "
                     "rounds and accepted drafts: the figure and its SE are across requests")
        # the counters no longer carry the figure
        findings[:] = [replace(f, severity="info") if f.code in ("counters-moved", "counters-short") else f
                       for f in findings]
        notes[:] = [n for n in notes if "give one window for the whole probe" not in n]
    if metrics_off:
        findings.append(Finding(
            "metrics-disabled", "info" if use_specs else "warning",
            "metrics disabled: vLLM's /metrics carries no vllm: family at all (the server runs with "
            "--disable-log-stats, so no stat logger was built): acceptance cannot be read from the counters, which "
            "is not the same as no speculative decoding" +
            ("; the per-request spec-decode metrics carry the figure" if use_specs else ""),
            fix=f"restart without --disable-log-stats, or (vLLM 0.29+) with {pc.ENABLE_PER_REQUEST}, and probe "
                "again"))
    if use_specs:
        length, se, rounds, units, pos = _spec_acceptance(server, specs)
    else:
        length, se, rounds, units, pos = _acceptance(server, replies, windows)
    served = server
    deployment: dict[str, Any] = {}
    if server.speculative:
        served = _deployment(client, server, prompts, replies, windows, specs if use_specs else [], pos, length, se,
                             per_request, findings, notes, deployment)
    tok_s, tok_se = ratio([r.completion_tokens for r in replies], [r.seconds for r in replies])

    # -- health ------------------------------------------------------------------------------------
    whys = [degenerate(r.ids if r.ids is not None else r.text.split(), r.completion_tokens, r.finish, r.text)
            for r in replies]
    bad = [(p.label, why) for p, why in zip(prompts, whys) if why]
    if bad:
        findings.append(Finding(
            "degenerate-output", "warning",
            f"{len(bad)} of {len(replies)} outputs are not plausible text: {printable(bad[0][0])}: {bad[0][1]}" +
            (f"; {printable(bad[1][0])}: {bad[1][1]}" if len(bad) > 1 else ""),
            fix="check the server's model and weights (a broken checkpoint, a wrong dtype or quantization), "
                "then the drafter (a speculative server must write the target's greedy text)"))

    base_info = None
    differs: list[tuple[int, int | None]] = []
    if inputs.baseline is not None:
        bclient = Client(inputs.baseline, timeout=inputs.timeout, api_key=inputs.api_key, what="the baseline server")
        bengine = inputs.engine or detect(bclient)
        base_info = info(bclient, bengine)
        if base_info.model != server.model:
            notes.append(f"the baseline serves {printable(base_info.model)}, the server {printable(server.model)}")
        breplies, _ = _run(bclient, base_info, prompts, inputs, temperature=0.0, per_request_windows=False)
        by_text = False
        for i, (a, b) in enumerate(zip(replies, breplies)):
            if a.ids is not None and b.ids is not None:
                differs.append((i, first_difference(a.ids, b.ids)))
            else:
                by_text = True
                differs.append((i, first_difference(a.text, b.text)))
        if by_text:
            findings.append(Finding("compared-by-text", "info",
                                    "a server returned no output token ids (SGLang 0.4.6's text reply, vLLM before "
                                    "return_token_ids): those outputs were compared character by character, and the "
                                    "index is a character's"))
        diff = [(i, d) for i, d in differs if d is not None]
        if diff:
            i, d = diff[0]
            findings.append(Finding(
                "greedy-differs", "warning",
                f"{len(diff)} of {len(differs)} greedy outputs differ from the baseline server's; the first at "
                f"{'token' if not by_text else 'position'} {d} of {printable(prompts[i].label)}. Speculative decoding "
                "must not change greedy text: one late difference can be a near-tie flipped by another batch shape, "
                "several early ones are a serving bug",
                fix="compare the two servers' launch (dtype, quantization, attention backend, the target's revision); "
                    "if only speculation differs, the verify step is wrong (report it to the engine)"))

    # -- acceptance --------------------------------------------------------------------------------
    called = math.isfinite(length) and rounds >= MIN_ROUNDS
    if server.speculative is False and metrics_off:
        pass  # said above: metrics-disabled, not no-speculation
    elif server.speculative is False:
        blind = engine == "vllm" and _v1_without_counters(server.version)
        findings.append(Finding("no-speculation", "info",
                                (f"vLLM {server.version}'s V1 engine exports no spec-decode counter (they came in "
                                 "0.8.3), so speculation cannot be seen from outside: health and tok/s only"
                                 if blind else
                                 f"the {engine} server runs without speculative decoding (" +
                                 ("its server info names no speculative algorithm" if engine == "sglang" else
                                  "its /metrics has no spec_decode counter that moved") +
                                 "): health and tok/s only")))
    elif not called and not any(f.code in ("counters-moved", "counters-short", "one-backend-metrics")
                                for f in findings):
        missing = engine == "sglang" and not any(r.verify is not None for r in replies)
        findings.append(Finding(
            "too-few-rounds", "warning",
            (f"the server runs {server.algorithm} but no reply carries {pf.SGLANG_VERIFY[0]} (fields are read by "
             "name: a release that renamed it reads as missing); " if missing else "") +
            f"the accept length rests on {rounds:.0f} verify rounds" + (
                f" ({length:.2f} measured)" if math.isfinite(length) else "") +
            f"; at least {MIN_ROUNDS} are needed before it is called",
            fix=f"send more tokens: --max-tokens {max(inputs.max_tokens, 512)} --requests "
                f"{max(len(replies) * 2, 8)}"))
    elif length < NOTHING:
        findings.append(Finding(
            "accepts-nothing", "warning",
            f"accept length {length:.2f} over {rounds:.0f} rounds: the server drafts and verifies, but (almost) no "
            "draft is accepted",
            fix="run eagleforensics doctor on the drafter and target (wiring ids, vocabulary map, embedding, the "
                "draft path the server loaded)"))

    gap = None
    gap_note = None
    if inputs.replay is not None and server.speculative:
        got = _replay_figure(inputs.replay, served, inputs.temperature)
        if isinstance(got, str):
            gap_note = got
        elif not called:
            gap_note = "not tested: the accept length is not called (too few rounds)"
        else:
            gap = GapTest(length, se, got[0], got[1])
            gap_note = got[2]
            if gap.found:
                findings.append(Finding(
                    "serving-gap", "warning",
                    f"the server accepts {gap.measured:.2f} tokens per verify, replay expects {gap.expected:.2f} on "
                    f"the same prompts: {gap.gap:.2f} below, past the bar of {gap.bar:.2f} (max of {FLOOR:g} and 3 "
                    "standard errors): the drafter and its wiring are fine, the loss is in the serving path",
                    fix="eagleforensics plan RUN.json --replay REPLAY.json names this server's suspects; check the "
                        "serving path (CUDA graphs, quantized drafter, attention backend, the draft model it loaded)",
                    source="docs/causes.md row 3"))
            elif gap.above:
                findings.append(Finding("serving-gap-above", "info",
                                        f"the server accepts {gap.measured:.2f}, more than replay's {gap.expected:.2f} "
                                        f"by {-gap.gap:.2f}: replay's prompts or steps differ from the probe's"))
    if inputs.replay is not None and inputs.prompts is not None:
        notes.append("the prompts come from --prompts, not the records replay scored: the gap test compares "
                     "different text")
    control, control_note = None, None
    if inputs.control and inputs.replay is not None:
        control, control_note = _control(inputs, served, length, se, called, findings)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    return ProbeReport(inputs, server, prompts, replies, windows, length, se, rounds, units, pos, tok_s, tok_se,
                       findings, base_info, differs, gap, gap_note, notes, time.monotonic() - started, whys,
                       deployment, control, control_note, server_counters, between)


# --- text ------------------------------------------------------------------------------------------

def render_text(rep: ProbeReport) -> str:
    """The probe for people: the server, per-request figures, acceptance, findings; server text escaped."""
    pr = printable
    s = rep.server
    launch = "no speculative decoding" if not s.speculative else (
        f"{s.algorithm or 'speculative'}" + (f", {s.num_steps} step{'s' if s.num_steps != 1 else ''}" if s.num_steps else "") +
        (f", topk {s.topk}" if s.topk else "") + (f", {s.num_draft_tokens} draft tokens" if s.num_draft_tokens else ""))
    steps = rep.deployment.get("steps") or {}
    if steps.get("running") and steps["running"] != s.num_steps:
        launch += f" (launched; adaptive: running {steps['running']} steps)"
    lines = [f"server:  {pr(s.engine)} {pr(s.version or '(release not said)')}, model {pr(s.model)}; {pr(launch)}",
             f"probe:   {len(rep.replies)} requests, max {rep.inputs.max_tokens} tokens, temperature "
             f"{rep.inputs.temperature:g}, {rep.inputs.concurrency} at a time"]
    head = ["request", "tokens", "finish", "s", "tok/s", "rounds", "accept len", "baseline"]
    rows = []
    for i, (p, r) in enumerate(zip(rep.prompts, rep.replies)):
        d = next((x for j, x in rep.differs if j == i), None) if rep.differs else None
        rounds, length = rep.request_acceptance(i)
        rows.append([pr(p.label)[:32], str(r.completion_tokens), pr(r.finish or "-"), f"{r.seconds:.2f}",
                     f"{r.completion_tokens / r.seconds:.1f}" if r.seconds > 0 else "-",
                     "-" if rounds is None else f"{rounds:.0f}", "-" if length is None else f"{length:.2f}",
                     "-" if not rep.differs else ("same" if d is None else f"differs at {d}")])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines += ["", "  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)),
              "  " + "  ".join("-" * w for w in widths)]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    if rep.windows:
        lines += ["", "vLLM counter windows: " + "; ".join(
            f"{w.requests} req: {_fmt(w.drafts)} drafts, {w.accepted:.0f} accepted, {w.emitted:.0f} counted for "
            f"{w.tokens} generated ({w.status})" for w in rep.windows[:8]) + (" ..." if len(rep.windows) > 8 else "")]
    lines.append("")
    if s.speculative:
        if math.isfinite(rep.accept_length):
            se = f" +- {rep.accept_length_se:.3f}" if math.isfinite(rep.accept_length_se) else " (SE n/a)"
            called = "" if rep.called else f"  [NOT CALLED: {rep.rounds:.0f} rounds < {MIN_ROUNDS}]"
            lines.append(f"accept:  {rep.accept_length:.3f}{se} over {rep.rounds:.0f} rounds in {rep.units} "
                         f"{'request' if rep.per_request_figure else 'window'}{'s' if rep.units != 1 else ''}{called}")
        elif rep.windows:
            lines.append("accept:  no clean counter window (see the windows above)")
        else:
            lines.append("accept:  no verify rounds counted")
        if rep.per_pos:
            lines.append("         per position: " + ", ".join(f"{v:.2f}" for v in rep.per_pos))
    if math.isfinite(rep.tok_s):
        lines.append(f"tok/s:   {rep.tok_s:.1f}" + (f" +- {rep.tok_s_se:.1f}" if math.isfinite(rep.tok_s_se) else "") +
                     " per request (tokens / seconds from request to reply)")
    if rep.gap is not None:
        g = rep.gap
        lines.append(f"gap:     measured {g.measured:.2f} vs replay {g.expected:.2f} ({pr(rep.gap_note or '')}): gap "
                     f"{g.gap:+.2f}, bar {g.bar:.2f} -> {'SERVING GAP' if g.found else 'no serving gap'}")
    elif rep.gap_note:
        lines.append(f"gap:     not tested: {pr(rep.gap_note)}")
    b = rep.between
    if b is not None:
        if b.get("accept_length") is not None:
            se = f" +- {b['accept_length_se']:.3f}" if b.get("accept_length_se") is not None else ""
            over = (f"{b['rounds']:.0f} rounds" if b.get("rounds") is not None else
                    f"{(b.get('log') or {}).get('lines', 0)} log lines (median)")
            lines.append(f"between: accept length {b['accept_length']:.3f}{se} over {over} in the "
                         f"{b['seconds']:.0f} s since the earlier probe (other clients' traffic)")
        else:
            lines.append(f"between: {pr(b['note'])}")
        log = b.get("log")
        if log is not None and log.get("median_accept_length") is not None and b.get("rounds") is not None:
            lines.append(f"         the log's decode lines then: median {log['median_accept_length']:.3f} over "
                         f"{log['lines']} lines")
    het = rep.deployment.get("heterogeneity")
    if het and het.get("p") is not None:
        low, high = het["split"]
        verb = "DISAGREE beyond" if het["disagree"] else "agree within"
        lines.append(f"spread:  requests {verb} their SE (Q {het['q']:.1f} "
                     f"on {het['df']} df, p {het['p']:.2g}); split {len(low['units'])} at "
                     f"{low['accept_length']:.2f}, {len(high['units'])} at {high['accept_length']:.2f}")
    if rep.control is not None:
        c = rep.control
        lines.append(f"control: measured {c.measured:.2f} vs replay {c.expected:.2f} on the same records "
                     f"({pr(rep.control_note or '')}): gap {c.gap:+.2f} +- {c.combined_se:.2f}, bar {c.bar:.2f} -> "
                     f"{'LOST ON THE SERVING SIDE' if c.found else 'nothing lost'}")
    elif rep.control_note:
        lines.append(f"control: not tested: {pr(rep.control_note)}")
    lines += ["", f"VERDICT: {pr(rep.verdict)}"]
    if rep.findings:
        lines += ["", "findings:"] + [f"  [{f.severity}] {f.code}: {pr(f.message)}" for f in rep.findings]
    if rep.notes:
        lines += ["", "notes:"] + [f"  {pr(n)}" for n in rep.notes]
    if rep.todo:
        lines += ["", "what to do:"] + [f"  - {pr(t)}" for t in rep.todo]
    return "\n".join(lines)


def render_html(rep: ProbeReport) -> str:
    """One offline page: the text form, escaped (server text never reaches the page unescaped)."""
    import html

    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>eagleforensics probe</title></head><body>"
            f"<h1>probe</h1><pre>{html.escape(rep.to_text())}</pre></body></html>\n")
