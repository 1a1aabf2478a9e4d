"""How much ``probe`` itself costs at the size users run it, against what the loopback HTTP round trips cost here.

A stand-in server (tests/probeservers.py, answering at once: no decode time) serves N requests of
T tokens; the probe runs as a user runs it (``python -m eagleforensics probe ... --json``, a fresh
process under ``peakrss.py``). The machine's own limit is the same calls made bare with
``http.client``: one generation round trip with its reply read and JSON-decoded, plus, for vLLM at
concurrency 1, two reads of a /metrics page of realistic size (``--metrics-kib``; a real vLLM
page carries every histogram) without parsing. Printed: probe's marginal wall per request (the
difference between N and N/8 requests, so start-up and imports cancel), the bare cost per request,
their ratio (target <= 3x at concurrency 1: the parsing and statistics on top of the calls), and
the probe's peak RSS.

    python benchmarks/bench_probe.py                     # 1024 requests x 2048 tokens, vLLM 0.11.0 and SGLang 0.5.13
    python benchmarks/bench_probe.py --requests 256 --max-tokens 512 --concurrency 1 16
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from probeservers import Plan, StandIn  # noqa: E402


def bare_cost(url: str, engine: str, max_tokens: int, metrics_reads: int, repeat: int) -> float:
    """Seconds per request for the bare calls: one generation (reply read and decoded) and the /metrics reads."""
    host, port = url.removeprefix("http://").split(":")
    body = ({"input_ids": list(range(10, 60)), "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
            if engine == "sglang" else
            {"model": "m", "prompt": list(range(10, 60)), "max_tokens": max_tokens, "temperature": 0,
             "return_token_ids": True})
    path = "/generate" if engine == "sglang" else "/v1/completions"
    data = json.dumps(body).encode()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            json.loads(conn.getresponse().read())
            conn.close()
            for _ in range(metrics_reads):
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                conn.close()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def run_probe(url: str, prompts: Path, requests: int, max_tokens: int, concurrency: int) -> tuple[float, int, dict]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peakrss.py"), sys.executable, "-m", "eagleforensics", "probe",
           url, "--prompts", str(prompts), "--requests", str(requests), "--max-tokens", str(max_tokens),
           "--concurrency", str(concurrency), "--timeout", "60", "--json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):
        raise SystemExit(f"probe failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    rss = int(res.stderr.strip().splitlines()[-1].split("=")[1])
    return wall, rss, json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--metrics-kib", type=int, default=300, help="size of vLLM's /metrics page to serve")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("".join(f"Prompt number {i}: write about topic {i}.\n" for i in range(64)))
        for engine, release in (("vllm", "0.11.0"), ("sglang", "0.5.13")):
            pad = max(0, args.metrics_kib * 1024 // 2400)  # one padded histogram series writes ~2.4 KB
            with StandIn(Plan(engine=engine, release=release, round_s=0.0, metrics_pad=pad)) as s:
                page = len(http_get(s.url, "/metrics")) if engine == "vllm" else 0
                for c in args.concurrency:
                    reads = 2 if engine == "vllm" and c == 1 else 0
                    bare = bare_cost(s.url, engine, args.max_tokens, reads, repeat=32)
                    small = max(1, args.requests // 8)
                    wall0, _, _ = run_probe(s.url, prompts, small, args.max_tokens, c)
                    wall, rss, doc = run_probe(s.url, prompts, args.requests, args.max_tokens, c)
                    per = (wall - wall0) / (args.requests - small)  # start-up and imports cancel
                    # bare calls made one at a time; at concurrency c the server and client overlap them
                    rows.append((f"{engine} {release}", c, page, per * 1e3, bare * 1e3, per / bare, rss / 1024,
                                 doc["acceptance"]["rounds"], doc["verdict"].split(";")[0]))
    head = ("server", "conc", "/metrics B", "probe ms/req", "bare ms/req", "ratio", "peak RSS MiB", "rounds",
            "health")
    print(f"{args.requests} requests x {args.max_tokens} tokens; the stand-in answers at once (no decode time)")
    print("  ".join(head))
    for r in rows:
        print(f"{r[0]:<14}  {r[1]:>4}  {r[2]:>10}  {r[3]:>12.2f}  {r[4]:>11.2f}  {r[5]:>5.2f}x  {r[6]:>12.0f}  "
              f"{r[7]:>6.0f}  {r[8]}")
    print("ratio: probe's marginal wall per request / the bare calls' (made one at a time); target <= 3x at "
          "concurrency 1")


def http_get(url: str, path: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path)
    data = conn.getresponse().read()
    conn.close()
    return data


if __name__ == "__main__":
    main()
