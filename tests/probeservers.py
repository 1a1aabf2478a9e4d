"""Stand-in SGLang and vLLM servers for the probe tests: each release's HTTP formats, on 127.0.0.1 only.

The endpoints, reply fields and counter names follow the released wheels (sglang 0.4.6, 0.5.3 and 0.5.13,
vLLM 0.7.3, 0.8.4 and 0.11.0; ``eagleforensics.engines.probeformats`` cites the files). vLLM's /metrics
page is written by ``prometheus_client`` itself, as the real server's is, with the counters declared
under the names and labels the wheels declare. Decoding is simulated round by round: each verify
round of a chain of ``steps`` drafts accepts the next draft with probability ``q`` (seeded per
prompt), so the reach at step j is q^j, as replay's is. Planted faults: ``differ_at`` (greedy text
changed at that token), ``degenerate`` (one token repeated), ``other_traffic`` (every request also
moves the counters for phantom requests), ``stall`` (no reply until the test ends), ``malformed``
(a reply that is not the engine's). Every wait is bounded; the server binds an ephemeral port.
"""
from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODEL = "/models/tiny-llama"
STALL_LIMIT = 20.0  # a stalled handler gives up after this, whatever the test does


@dataclass
class Plan:
    """What the stand-in does: engine, release, speculation, and the planted fault."""

    engine: str = "sglang"
    release: str = "0.5.13"
    speculative: bool = True
    steps: int = 3
    q: float = 0.47
    round_s: float = 0.0005
    differ_at: int | None = None
    degenerate: bool = False
    other_traffic: int = 0
    other_on: tuple[int, ...] | None = None  # the generation requests (0-based, in arrival order) with other traffic
    stall: bool = False
    malformed: str | None = None  # "json" (not JSON) | "fields" (JSON without the engine's fields) | "metrics"
    publish: bool = True  # vLLM: counters move (False: they never catch up)
    drop: tuple[str, ...] = ()  # SGLang: meta_info fields a (hypothetical) later release renamed
    metrics_pad: int = 0  # vLLM: this many extra histogram series on /metrics (a real page is hundreds of KiB)
    seen: list[dict[str, Any]] = field(default_factory=list)


def _seed(prompt: Any) -> int:
    return int(hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:8], 16)


def tokens_for(prompt: Any, n: int) -> list[int]:
    """The target's greedy continuation in this stand-in: varied ids fixed by the prompt."""
    rng = random.Random(_seed(prompt))
    return [rng.randrange(10, 500) for _ in range(n)]


def reply(handler: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str = "application/json") -> None:
    """Write one whole HTTP reply (status, content type and length, body) from a request handler."""
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 resets connections at --concurrency 16 (uvicorn's backlog is 2048)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left first (probe stops at the first bad reply while other requests are in flight) is
        normal here: socketserver would print its traceback onto the stderr the tests read as probe's output."""
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class StandIn:
    """A running stand-in server: ``url``; ``close()`` stops it (and releases a stalled handler)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._declare()
        handler = self._handler()
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.requests = threading.Event()  # set when a generation request arrives

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> "StandIn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- vLLM counters, declared as the wheels declare them ------------------------------------------
    def _declare(self) -> None:
        p = self.plan
        if p.engine == "vllm":  # stats on: the scheduler gauges are declared (0.9.2 v1/metrics/loggers.py)
            Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ["model_name"],
                  registry=self.registry).labels(MODEL).set(0)
        if p.engine == "vllm" and p.metrics_pad:
            pad = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                            ["model_name", "engine", "series"], registry=self.registry,
                            buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0])
            for i in range(p.metrics_pad):
                pad.labels(MODEL, "0", str(i)).observe(0.1 * i)
        if p.engine == "vllm" and p.release == "0.8.4":  # vllm/v1/metrics/loggers.py: labelled at start, always
            names, labels = ["model_name", "engine"], [MODEL, "0"]
            self.c = {
                "draft_tokens": Counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", names,
                                        registry=self.registry).labels(*labels),
                "accepted": Counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", names,
                                    registry=self.registry).labels(*labels),
            }
            return
        if p.engine != "vllm" or not p.speculative or p.release == "0.8.2":  # 0.8.2's V1 engine exports none
            self.c = {}
            return
        if p.release == "0.11.0":  # vllm/v1/spec_decode/metrics.py SpecDecodingProm
            names, labels = ["model_name", "engine"], [MODEL, "0"]
            self.c = {
                "drafts": Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", names,
                                  registry=self.registry).labels(*labels),
                "draft_tokens": Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", names,
                                        registry=self.registry).labels(*labels),
                "accepted": Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", names,
                                    registry=self.registry).labels(*labels),
            }
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              names + ["position"], registry=self.registry)
            self.pos = [per_pos.labels(*labels, str(i)) for i in range(p.steps)]
        else:  # 0.7.3, vllm/engine/metrics.py (V0): labelled (so written) only once stats are logged
            names = ["model_name"]
            self.c = {
                "accepted": Counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", names,
                                    registry=self.registry),
                "draft_tokens": Counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", names,
                                        registry=self.registry),
                "emitted": Counter("vllm:spec_decode_num_emitted_tokens_total", "Number of emitted tokens.", names,
                                   registry=self.registry),
            }
            self.rate = Gauge("vllm:spec_decode_draft_acceptance_rate", "Speulative token acceptance rate.", names,
                              registry=self.registry)
            self.eff = Gauge("vllm:spec_decode_efficiency", "Speculative decoding system efficiency.", names,
                             registry=self.registry)
            self.tot = {"accepted": 0, "draft_tokens": 0, "emitted": 0}
            if not p.publish:  # stats logged once, then never again: the counters stand still
                for c in self.c.values():
                    c.labels(MODEL)

    def _count(self, accepted: list[int]) -> None:
        """Add one request's rounds (accepted drafts per round) to the counters."""
        p = self.plan
        if not self.c or not p.publish or (not p.speculative and p.release != "0.8.4"):
            return
        with self.lock:
            if p.release == "0.8.4":
                if p.speculative:
                    self.c["draft_tokens"].inc(len(accepted) * p.steps)
                    self.c["accepted"].inc(sum(accepted))
            elif p.release == "0.11.0":
                self.c["drafts"].inc(len(accepted))
                self.c["draft_tokens"].inc(len(accepted) * p.steps)
                self.c["accepted"].inc(sum(accepted))
                for i in range(p.steps):
                    self.pos[i].inc(sum(1 for a in accepted if a > i))
            else:
                for key, v in (("accepted", sum(accepted)), ("draft_tokens", len(accepted) * p.steps),
                               ("emitted", sum(a + 1 for a in accepted))):
                    self.c[key].labels(MODEL).inc(v)
                    self.tot[key] += v
                self.rate.labels(MODEL).set(self.tot["accepted"] / self.tot["draft_tokens"])
                self.eff.labels(MODEL).set(self.tot["emitted"] / (self.tot["draft_tokens"] // p.steps * (p.steps + 1)))

    # -- decoding ------------------------------------------------------------------------------------
    def decode(self, prompt: Any, max_tokens: int) -> tuple[list[int], list[int]]:
        """(output ids, accepted drafts per verify round) for one request."""
        p = self.plan
        ids = tokens_for(prompt, max_tokens)
        if p.degenerate:
            ids = [ids[0]] * max_tokens
        if p.differ_at is not None and p.differ_at < len(ids):
            ids[p.differ_at] = 3 if ids[p.differ_at] != 3 else 4
        rounds: list[int] = []
        if p.speculative:
            rng = random.Random(_seed(prompt) + 1)
            left = max_tokens - 1  # the first token comes from prefill
            while left > 0:
                a = 0
                while a < p.steps and rng.random() < p.q:
                    a += 1
                a = min(a, left - 1)
                rounds.append(a)
                left -= a + 1
        time.sleep(p.round_s * max(1, len(rounds) or max_tokens))
        return ids, rounds

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
                reply(self, status, body if isinstance(body, bytes) else json.dumps(body).encode(), ctype)

            def do_GET(self) -> None:  # noqa: N802
                stand.plan.seen.append({"method": "GET", "path": self.path,
                                        "auth": self.headers.get("Authorization")})
                route = stand.get_routes().get(self.path)
                if route is None:
                    self._send(404, {"detail": "Not Found"})
                    return
                status, body, ctype = route()
                self._send(status, body, ctype)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                stand.plan.seen.append({"method": "POST", "path": self.path, "body": payload,
                                        "auth": self.headers.get("Authorization")})
                stand.requests.set()
                p = stand.plan
                if p.stall:
                    stand.release.wait(STALL_LIMIT)
                    return
                want = "/generate" if p.engine == "sglang" else "/v1/completions"
                if self.path != want:
                    self._send(404, {"detail": "Not Found"})
                    return
                if p.malformed == "json":
                    self._send(200, b"<html>upstream error</html>", "text/html")
                    return
                if p.malformed == "fields":
                    self._send(200, {"output": "no text here"})
                    return
                self._send(200, stand.reply(payload))

        return Handler

    def get_routes(self) -> dict[str, Any]:
        p = self.plan
        json_ct = "application/json"
        if p.engine == "sglang":
            model = {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True}
            args = {"model_path": MODEL, "tp_size": 1, "disable_cuda_graph": False, "disable_radix_cache": False,
                    "speculative_algorithm": "EAGLE3" if p.speculative else None,
                    "speculative_draft_model_path": "/models/drafter" if p.speculative else None,
                    "speculative_num_steps": p.steps if p.speculative else None,
                    "speculative_eagle_topk": 1 if p.speculative else None,
                    "speculative_num_draft_tokens": p.steps + 1 if p.speculative else None,
                    "version": p.release}
            routes = {"/get_model_info": lambda: (200, model, json_ct), "/get_server_info": lambda: (200, args, json_ct),
                      "/health": lambda: (200, b"", "text/plain")}
            if p.release == "0.5.13":  # srt/entrypoints/http_server.py: /model_info and /server_info
                routes["/model_info"] = routes["/get_model_info"]
                routes["/server_info"] = lambda: (200, {**args, "internal_states": [{}]}, json_ct)
            return routes

        def metrics() -> tuple[int, bytes, str]:
            if p.malformed == "metrics":
                return 200, b"vllm:spec_decode_num_drafts_total{engine=\"0\" 12\n", "text/plain"
            return 200, generate_latest(self.registry), "text/plain; version=0.0.4; charset=utf-8"

        return {"/version": lambda: (200, {"version": p.release}, json_ct),
                "/v1/models": lambda: (200, {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                         "owned_by": "vllm", "root": MODEL}]},
                                       json_ct),
                "/metrics": metrics, "/health": lambda: (200, b"", "text/plain")}

    def reply(self, payload: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        if p.engine == "sglang":
            prompt = payload.get("input_ids", payload.get("text"))
            n = int(payload["sampling_params"]["max_new_tokens"])
        else:
            prompt = payload["prompt"]
            n = int(payload["max_tokens"])
        start = time.time()
        ids, rounds = self.decode(prompt, n)
        with self.lock:
            self.served = getattr(self, "served", 0) + 1
            nth = self.served - 1
        busy = p.other_traffic if p.other_on is None or nth in p.other_on else 0
        for _ in range(busy):  # phantom requests from other clients
            self._count(self.decode(["other", random.random()], n)[1])
        self._count(rounds)
        text = " ".join(f"w{t}" for t in ids)
        if p.engine == "sglang":  # srt/managers/tokenizer_manager.py
            meta: dict[str, Any] = {"id": "r1", "finish_reason": {"type": "length", "length": n},
                                    "prompt_tokens": len(prompt) if isinstance(prompt, list) else 8,
                                    "completion_tokens": len(ids), "cached_tokens": 0}
            if p.speculative:
                meta["spec_verify_ct"] = len(rounds)
            if p.speculative and p.release == "0.5.13" and rounds:
                correct = sum(rounds)
                meta.update({"spec_accept_rate": correct / (len(rounds) * p.steps),
                             "spec_accept_length": len(ids) / len(rounds), "spec_num_correct_drafts": correct,
                             "spec_num_proposed_drafts": len(rounds) * p.steps,
                             "spec_accepted_drafts": correct, "spec_proposed_drafts": len(rounds) * p.steps})
                hist = [sum(1 for a in rounds if a == j) for j in range(p.steps + 1)]
                meta["spec_correct_drafts_histogram"] = hist
                meta["spec_accept_histogram"] = hist
            meta["e2e_latency"] = time.time() - start
            for key in p.drop:
                meta.pop(key, None)
            out: dict[str, Any] = {"text": text, "meta_info": meta}
            if p.release in ("0.5.3", "0.5.13"):
                out = {"text": text, "output_ids": ids, "meta_info": meta}
            return out
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None}
        if p.release == "0.11.0" and payload.get("return_token_ids"):
            choice.update({"token_ids": ids, "prompt_logprobs": None, "prompt_token_ids": None})
        return {"id": "cmpl-1", "object": "text_completion", "created": int(start), "model": MODEL,
                "choices": [choice], "usage": {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 8,
                                               "total_tokens": len(ids) + 8, "completion_tokens": len(ids)}}
