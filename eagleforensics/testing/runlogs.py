"""Server logs made from a known cost model, in each release's own line format: the ground truth ``plan`` must recover.

Not the product: for tests, scripts and the README's worked incident. A run is simulated round
by round: each round takes ``verify_s + per_token_s * (draft_tokens - 1) + draft_step_s * steps``
seconds (written out here, not taken from ``serving.roundcost``, so a bug there cannot hide
itself) times log-normal noise and accepts
``j`` drafts with P(at least j) = ``reach[j-1]``; the engine's logging interval then averages
what the engine averages and prints it the way that release prints it:

* SGLang (one ``Decode batch`` line every ``decode_log_interval`` decode batches; formats as
  ``engines.logs`` documents them, re-read in the wheels): ``Decode batch.`` and ``accept len``
  only up to 0.5.3; ``Decode batch [N],`` with ``accept rate`` = L / (steps + 1) in 0.5.4;
  ``Decode batch,`` with the same rate 0.5.5 - 0.5.5.post2; rate L / num_draft_tokens
  0.5.5.post3 - 0.5.10 (sglang PR #13212); accepted drafts / (rounds x (num_draft_tokens - 1))
  from 0.5.11 (PR #23530); the trailing ``, `` after ``#queue-req`` dropped from 0.5.9.
  Arguments line ``server_args=ServerArgs(...)`` up to 0.5.18, ``server_args={...}`` from 0.5.19
  (``engines.serverargs``).
* vLLM (every 10 s): ``Engine 000: Avg prompt throughput ..., Avg generation throughput ...`` and
  ``SpecDecoding metrics: ...`` (``Draft acceptance rate`` first up to 0.10.x, ``Mean acceptance
  length`` first with throughputs from 0.11.0; ``Avg Draft acceptance rate`` last from 0.20);
  arguments ``non-default args: {...}`` and the engine config line ``Initializing a V1 LLM
  engine (vX) with config: ...`` (the version).
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from packaging.version import Version


TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/eagle3-llama3.1-8b"


@dataclass(frozen=True)
class SimRun:
    """One server run to simulate: costs, launch, acceptance, how long, how noisy, the settings its arguments show."""

    engine: str  # sglang | vllm
    version: str
    steps: int = 0  # 0: a baseline without speculation (``decode_step_s`` per token)
    topk: int = 1
    draft_tokens: int | None = None  # tokens one verify pass checks; None: steps + 1
    verify_s: float = 0.0
    per_token_s: float = 0.0
    draft_step_s: float = 0.0
    reach: Sequence[float] = ()  # P(at least j drafts accepted), j = 1..steps
    decode_step_s: float = 0.0
    lines: int = 40  # data lines to write
    noise: float = 0.03  # log-normal sigma of each round's time
    seed: int = 0
    batch: int = 1
    decode_log_interval: int = 40
    tp: int = 1
    cuda_graph: bool = True
    prefix_cache: bool = True
    algorithm: str = "EAGLE3"
    start: datetime = field(default_factory=lambda: datetime(2026, 11, 29, 10, 0, 0))
    header: str = ""  # a '#' comment line at the top (the log reader skips it)


def _v(version: str) -> Version:
    return Version(version)


def _spec(run: SimRun) -> bool:
    return run.steps > 0


def verified(run: SimRun) -> int:
    """Tokens one verify pass checks (M)."""
    return run.draft_tokens if run.draft_tokens is not None else run.steps + 1


def round_seconds(run: SimRun) -> float:
    """The true round time of ``run`` (a decode step for a baseline)."""
    if not _spec(run):
        return run.decode_step_s
    return run.verify_s + run.per_token_s * (verified(run) - 1) + run.draft_step_s * run.steps


def _rounds(run: SimRun, rng: random.Random, count: int) -> tuple[float, int, list[int]]:
    """(seconds, tokens, accepted per round) of ``count`` rounds (decode steps for a baseline), all requests."""
    seconds, tokens, accepted = 0.0, 0, []
    per_round = round_seconds(run)
    for _ in range(count):
        seconds += per_round * math.exp(rng.gauss(0.0, run.noise) - run.noise ** 2 / 2)
        if not _spec(run):
            tokens += run.batch
            continue
        for _ in range(run.batch):
            u = rng.random()
            a = sum(1 for r in run.reach if u < r)
            accepted.append(a)
            tokens += a + 1
    return seconds, tokens, accepted


# --- SGLang ---------------------------------------------------------------------------------------

def _sgl_stamp(t: datetime, tp: int) -> str:
    rank = " TP0" if tp > 1 else ""
    return f"[{t:%Y-%m-%d %H:%M:%S}{rank}] "


def sglang_args_line(run: SimRun) -> str:
    """SGLang's arguments line: ``ServerArgs(...)`` repr up to 0.5.18, the resolved dict from 0.5.19."""
    spec = _spec(run)
    fields: dict[str, object] = {
        "model_path": TARGET, "tokenizer_path": TARGET, "tp_size": run.tp, "pp_size": 1, "dp_size": 1,
        "context_length": None, "disable_radix_cache": not run.prefix_cache, "disable_cuda_graph": not run.cuda_graph,
        "page_size": 1, "disaggregation_mode": "null",
        "speculative_algorithm": run.algorithm if spec else None,
        "speculative_draft_model_path": DRAFT if spec else None,
        "speculative_num_steps": run.steps if spec else None,
        "speculative_eagle_topk": run.topk if spec else None,
        "speculative_num_draft_tokens": verified(run) if spec else None,
        "decode_log_interval": run.decode_log_interval,
    }
    if _v(run.version) < _v("0.4.7"):
        fields.pop("pp_size")
    if _v(run.version) >= _v("0.5.19"):
        return f"[{run.start:%Y-%m-%d %H:%M:%S}] server_args={fields!r}"
    body = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"[{run.start:%Y-%m-%d %H:%M:%S}] server_args=ServerArgs({body})"


def sglang_decode_line(run: SimRun, when: datetime, *, forward_ct: int, tokens_in_use: int, length: float | None,
                       accepted: int, rounds: int, gen_throughput: float) -> str:
    """One ``Decode batch`` line as ``run.version`` writes it (see the module docstring)."""
    v = _v(run.version)
    head = "Decode batch."
    if v >= _v("0.5.4"):
        head = f"Decode batch [{forward_ct}]," if v < _v("0.5.5") else "Decode batch,"
    msg = f"{head} #running-req: {run.batch}, #token: {tokens_in_use}, token usage: 0.01, "
    if length is not None and _spec(run):
        msg += f"accept len: {length:.2f}, "
        if v >= _v("0.5.4"):
            if v >= _v("0.5.11"):
                rate = accepted / (rounds * (verified(run) - 1))
            elif v >= _v("0.5.5.post3"):
                rate = length / verified(run)
            else:
                rate = length / (run.steps + 1)
            msg += f"accept rate: {rate:.2f}, "
    msg += f"cuda graph: {run.cuda_graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: 0"
    if v < _v("0.5.9"):
        msg += ", "
    return _sgl_stamp(when, run.tp) + msg


def _sglang_lines(run: SimRun, rng: random.Random) -> list[str]:
    out = [sglang_args_line(run)]
    t = run.start + timedelta(seconds=30)
    out.append(f"{_sgl_stamp(t, run.tp)}Prefill batch, #new-seq: {run.batch}, #new-token: 512, #cached-token: 0, "
               f"token usage: 0.01, #running-req: 0, #queue-req: 0")
    used, forward = 512, 0
    for _ in range(run.lines):
        seconds, tokens, accepted = _rounds(run, rng, run.decode_log_interval)
        t += timedelta(seconds=seconds)
        forward += run.decode_log_interval
        used += tokens
        rounds = run.decode_log_interval * run.batch
        length = tokens / rounds if _spec(run) else None
        out.append(sglang_decode_line(run, t, forward_ct=forward, tokens_in_use=used, length=length,
                                      accepted=sum(accepted), rounds=rounds, gen_throughput=tokens / seconds))
    return out


# --- vLLM -----------------------------------------------------------------------------------------

def _vllm_prefix(run: SimRun, t: datetime, where: str, process: str = "APIServer pid=1") -> str:
    tag = f"({process}) " if _v(run.version) >= _v("0.10.1") else ""
    return f"{tag}INFO {t:%m-%d %H:%M:%S} [{where}] "


def vllm_args_lines(run: SimRun) -> list[str]:
    """vLLM's ``non-default args`` line and its engine config line (which names the version)."""
    args: dict[str, object] = {"model_tag": TARGET, "model": TARGET}
    spec_repr = "None"
    if _spec(run):
        method = run.algorithm.lower()
        args["speculative_config"] = {"method": method, "model": DRAFT, "num_speculative_tokens": run.steps}
        spec_repr = f"SpeculativeConfig(method={method!r}, model={DRAFT!r}, num_spec_tokens={run.steps})"
    if run.tp > 1:
        args["tensor_parallel_size"] = run.tp
    if not run.cuda_graph:
        args["enforce_eager"] = True
    args["enable_prefix_caching"] = run.prefix_cache
    where = "utils.py:233" if _v(run.version) < _v("0.23.0") else "api_utils.py:110"
    if _v(run.version) >= _v("0.33.0"):
        where = "startup.py:96"
    config = (f"model={TARGET!r}, speculative_config={spec_repr}, tokenizer={TARGET!r}, skip_tokenizer_init=False, "
              f"tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=8192, "
              f"download_dir=None, load_format=auto, tensor_parallel_size={run.tp}, pipeline_parallel_size=1, "
              f"disable_custom_all_reduce=False, quantization=None, enforce_eager={not run.cuda_graph}, "
              f"kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name={TARGET}, "
              f"enable_prefix_caching={run.prefix_cache}, chunked_prefill_enabled=True, pooler_config=None")
    return [_vllm_prefix(run, run.start, where) + f"non-default args: {args!r}",
            _vllm_prefix(run, run.start + timedelta(seconds=9), "core.py:77", "EngineCore_DP0 pid=301")
            + f"Initializing a V1 LLM engine (v{run.version}) with config: {config}"]


def vllm_spec_line(run: SimRun, *, drafts: int, accepted: list[int], seconds: float) -> str:
    """The ``SpecDecoding metrics`` text (no prefix) as ``run.version`` writes it."""
    k = run.steps
    drafted = drafts * k
    n_acc = sum(accepted)
    per_pos = ", ".join(f"{sum(1 for a in accepted if a > j) / drafts:.3f}" for j in range(k))
    mean_len = 1 + n_acc / drafts
    rate = 100.0 * n_acc / drafted
    v = _v(run.version)
    if v < _v("0.11.0"):
        return (f"SpecDecoding metrics: Draft acceptance rate: {rate:.1f}%, Mean acceptance length: {mean_len:.2f}, "
                f"Accepted: {n_acc} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {per_pos}")
    tail = f", Avg Draft acceptance rate: {rate:.1f}%" if v >= _v("0.20.0") else ""
    head = "" if v >= _v("0.20.0") else f"Draft acceptance rate: {rate:.1f}%, "
    return (f"SpecDecoding metrics: {head}Mean acceptance length: {mean_len:.2f}, Accepted throughput: "
            f"{n_acc / seconds:.2f} tokens/s, Drafted throughput: {drafted / seconds:.2f} tokens/s, Accepted: {n_acc} "
            f"tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {per_pos}{tail}")


def _vllm_lines(run: SimRun, rng: random.Random, interval: float = 10.0) -> list[str]:
    out = vllm_args_lines(run)
    t = run.start + timedelta(seconds=60)
    for _ in range(run.lines):
        seconds, tokens, rounds, accepted = 0.0, 0, 0, []
        while seconds < interval:
            s, n, acc = _rounds(run, rng, 1)
            seconds += s
            tokens += n
            rounds += 1
            accepted += acc
        t += timedelta(seconds=interval)
        out.append(_vllm_prefix(run, t, "loggers.py:123") +
                   f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: {tokens / seconds:.1f} "
                   f"tokens/s, Running: {run.batch} reqs, Waiting: 0 reqs, GPU KV cache usage: 0.5%, "
                   f"Prefix cache hit rate: 0.0%")
        if _spec(run):
            out.append(_vllm_prefix(run, t, "metrics.py:120") +
                       vllm_spec_line(run, drafts=rounds * run.batch, accepted=accepted, seconds=seconds))
    return out


def log_lines(run: SimRun) -> list[str]:
    """Every line of the simulated log (arguments line first), deterministic for a seed."""
    rng = random.Random(run.seed)
    lines = _sglang_lines(run, rng) if run.engine == "sglang" else _vllm_lines(run, rng)
    return ([f"# {run.header}"] if run.header else []) + lines


def write_log(path: str | Path, run: SimRun) -> Path:
    """Write the simulated log to ``path``; returns the path."""
    p = Path(path)
    p.write_text("\n".join(log_lines(run)) + "\n", encoding="utf-8")
    return p


def chain_reach(rates: Sequence[float]) -> list[float]:
    """reach@1..k from conditional acceptance rates per step (reach@j = rate_1 x ... x rate_j)."""
    out, r = [], 1.0
    for c in rates:
        r *= c
        out.append(r)
    return out
