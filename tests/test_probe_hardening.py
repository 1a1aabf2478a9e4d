"""``probe`` against hostile servers and mistyped input (issue 40): bounded in time, memory, parse and disclosure.

What is a process's behaviour (exit code, stderr, the time it takes, its peak memory, a file that
must not appear) is run as a real process (``python -m eagleforensics probe``), each under a
timeout. Servers bind 127.0.0.1 only and stop by themselves (tests/probehostile.py,
tests/probeservers.py). The time bounds are the issue's contract ("--timeout T returns within
T + 5 s", "within 3 s of Ctrl-C or SIGTERM"), with the process's own start-up measured and added.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eagleforensics.cli.probe import probe as probe_cmd

from . import probehostile as ph
from .probehostile import Hostile, sglang_routes, vllm_routes
from .probeservers import Plan, StandIn

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-secret-123"


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float
    maxrss: int  # bytes, the child's peak resident memory

    @property
    def lines(self) -> list[str]:
        return self.err.strip().splitlines()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROBE_TEST_KEY"}
    env.update(PYTHONPATH=str(ROOT), EAGLEFORENSICS_FUSED="0", **extra)
    return env


PEAKRSS = ROOT / "benchmarks" / "peakrss.py"


def run_probe(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None,
              signal_when=None) -> Run:  # type: ignore[no-untyped-def]
    """``python -m eagleforensics probe ARGS`` as a process; its exit, output, time and peak memory (os.wait4).

    ``signal_when``: ``(ready, signum)``, where ``ready()`` returns once the moment has come (called while
    the process runs); then ``signum`` is sent and ``seconds`` is the time from the signal to the exit.
    """
    # Linux carries the forking process's RSS high-water mark into a child's ru_maxrss (exec keeps it): late in
    # the suite pytest holds over 1 GiB, so a probe forked straight from it reported pytest's peak. Unless the test
    # signals the probe itself, it starts from benchmarks/peakrss.py (a small parent that prints the child's own).
    via = [] if signal_when is not None else [sys.executable, str(PEAKRSS)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen([*via, sys.executable, "-m", "eagleforensics", "probe", *args], stdout=out,
                                stderr=err, env=env or _env(), cwd=str(ROOT), start_new_session=True,
                                # a shell's background job starts with SIGINT ignored: give the child the default
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        if signal_when is not None:
            ready, signum = signal_when
            ready()
            start = time.monotonic()
            os.kill(proc.pid, signum)  # not send_signal: its poll() would reap the child before wait4 reads it
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                out.seek(0), err.seek(0)
                pytest.fail(f"probe ran past {timeout:g} s: {err.read().decode(errors='replace')[-500:]}")
            time.sleep(0.02)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        text, maxrss = err.read().decode(errors="replace"), usage.ru_maxrss * 1024
        if via:
            text, _, kib = text.rpartition("\npeak_rss_kib=")
            maxrss = int(kib) * 1024
        return Run(proc.returncode, out.read().decode(errors="replace"), text, seconds, maxrss)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    p.write_text("Tell me about the sea.\nWrite a poem about trees.\n")
    return p


@pytest.fixture(scope="module")
def startup(prompts: Path) -> float:
    """Seconds a probe process takes to start and end on a port where nothing listens (refused at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    run = run_probe(f"http://127.0.0.1:{port}", "--prompts", str(prompts), "--engine", "sglang", "--timeout", "3")
    assert run.code == 2 and "refused" in run.err, run.err
    return run.seconds


def _one_line(run: Run) -> str:
    assert len(run.lines) == 1 and run.lines[0].startswith("eagleforensics: error:"), run.err
    return run.lines[0]


# -- 1. one deadline per call ------------------------------------------------------------------------------

@pytest.mark.parametrize("where,route", [("/model_info", ph.trickle_headers), ("/generate", ph.trickle_body),
                                         ("/generate", ph.endless_chunks), ("/generate", ph.close_then_stall),
                                         ("accept", None)])
def test_timeout_bounds_the_whole_call(where: str, route, prompts: Path, startup: float) -> None:  # type: ignore[no-untyped-def]
    """--timeout 3 returns within 3 + 5 s (plus start-up) against a server that trickles headers or a body, never
    ends a chunked body, says Connection: close and stalls, or never accepts: one line, exit 2."""
    routes = sglang_routes()
    if route is not None:
        routes[where] = route
    with Hostile(routes, accept=route is not None) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--timeout", "3", "--max-tokens", "8", timeout=35)
    line = _one_line(run)
    assert run.code == 2 and "3 s" in line, line
    assert run.seconds < 3 + 5 + startup, (run.seconds, startup, line)


def test_a_hung_name_lookup_is_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver cannot be interrupted: a name is looked up on a daemon thread the call does not wait past its
    deadline for (a literal address is never looked up)."""
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.httpclient import Client

    real = socket.getaddrinfo
    looked: list[str] = []

    def slow(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        looked.append(host)
        if host == "slow.example":
            time.sleep(8)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    start = time.monotonic()
    with pytest.raises(ForensicsError, match="did not take the connection within 1 s"):
        Client("http://slow.example:80", timeout=1).get_json("/model_info")
    assert time.monotonic() - start < 3.0
    assert looked == ["slow.example"]


# -- 2. Ctrl-C and SIGTERM within 3 s ----------------------------------------------------------------------

def _metrics_page(positions: int = 3) -> bytes:
    """A vLLM 0.11.0 /metrics page (names of vllm/v1/spec_decode/metrics.py) whose counters stand still."""
    lines = []
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        lines += [f"# HELP vllm:spec_decode_{name} x", f"# TYPE vllm:spec_decode_{name} counter",
                  f'vllm:spec_decode_{name}_total{{engine="0",model_name="m"}} 0.0']
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name} x", f"# TYPE {name} counter"]
    lines += [f'{name}_total{{engine="0",model_name="m",position="{i}"}} 0.0' for i in range(positions)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("engine,signum", [("sglang", signal.SIGINT), ("sglang", signal.SIGTERM),
                                           ("vllm", signal.SIGTERM), ("vllm", signal.SIGINT)])
def test_signal_ends_the_probe_within_3_s(engine: str, signum: int, prompts: Path) -> None:
    """Once a reply's headers are in and said Connection: close, Ctrl-C and SIGTERM still end the probe within
    3 s: SGLang's requests run on worker threads (the main thread waits), vLLM's per-request windows in the main
    thread."""
    if engine == "sglang":
        routes = sglang_routes(generate=ph.close_then_stall)
    else:
        routes = vllm_routes(lambda: _metrics_page(), completion=ph.close_then_stall)
    with Hostile(routes) as server:
        def ready() -> None:
            assert server.stalled.wait(30), "the probe never got its reply headers"
            time.sleep(0.3)

        run = run_probe(server.url, "--prompts", str(prompts), "--timeout", "120", "--concurrency",
                        "2" if engine == "sglang" else "1", signal_when=(ready, signum), timeout=20)
    assert run.seconds < 3.0, (run.seconds, run.err)
    if signum == signal.SIGTERM:
        assert run.code == 143 and run.lines == ["eagleforensics: terminated"], run.err
    else:
        assert run.code == 2 and "interrupted (Ctrl-C)" in _one_line(run), run.err


def test_signal_ends_a_worker_stuck_connecting(prompts: Path) -> None:
    """A server that stops accepting after the probe's first calls: the generation's connect, on a worker thread,
    waits in SYN-SENT under --timeout 120; Ctrl-C still ends the probe within 3 s (a blocking connect cannot be
    woken from another thread, so the probe connects in short polls that see the abort)."""
    # detect: /model_info; info: /model_info, /server_info; then no more
    with Hostile(sglang_routes(), accept_limit=3) as server:
        def ready() -> None:
            assert server.stalled.wait(30), "the probe never made its first calls"
            time.sleep(1.0)

        run = run_probe(server.url, "--prompts", str(prompts), "--timeout", "120", "--concurrency", "2",
                        signal_when=(ready, signal.SIGINT), timeout=20)
    assert run.seconds < 3.0, (run.seconds, run.err)
    assert run.code == 2 and "interrupted (Ctrl-C)" in _one_line(run), run.err


# -- 3. bounded parse ----------------------------------------------------------------------------------------

def _reply(meta_extra: str = "", completion: str = "8") -> bytes:
    ids = list(range(10, 18))
    return (f'{{"text": "{" ".join(f"w{t}" for t in ids)}", "output_ids": {ids}, "meta_info": {{"completion_tokens": '
            f'{completion}, "spec_verify_ct": 4{meta_extra}}}}}').encode()


@pytest.mark.parametrize("body,env", [
    (b"[" * 100_000 + b"]" * 100_000, {}),  # RecursionError on main
    (_reply(completion="1" * 5000), {}),  # past int()'s 4300 digits: ValueError on main
    (_reply(completion="7" * 200_000), {"PYTHONINTMAXSTRDIGITS": "0"}),  # no digit limit: refused by its length
    (_reply(', "spec_accept_length": NaN'), {}),  # "Out of range float values are not JSON compliant" on main
    (_reply(', "spec_accept_length": 1e999'), {}),  # json.loads reads infinity
])
def test_hostile_reply_is_one_line(body: bytes, env: dict[str, str], prompts: Path) -> None:
    with Hostile(sglang_routes(reply=lambda req: body)) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", "--json", env=_env(**env),
                        timeout=30)
    line = _one_line(run)
    assert run.code == 2 and run.out == "" and "/generate" in line, run.err


@pytest.mark.parametrize("line", ['{"prompt": "hi", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                  '{"prompt": "hi", "n": ' + "9" * 5000 + "}",
                                  '{"prompt": "hi", "score": NaN}'])
def test_hostile_prompts_line_is_one_line(line: str, tmp_path: Path) -> None:
    """--prompts JSON lines go through the guarded parser: one line naming the file and line, no request sent."""
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with Hostile(sglang_routes()) as server:
        run = run_probe(server.url, "--prompts", str(p), "--json", timeout=30)
        assert server.seen == []
    text = _one_line(run)
    assert run.code == 2 and "prompts.jsonl" in text and "line 2" in text, text


# -- 4. and 5. bounded server-declared values, linear per-position sums -------------------------------------

@pytest.mark.parametrize("steps", [10 ** 12, 5000])
def test_impossible_step_count_is_refused(steps: int, prompts: Path, tmp_path: Path) -> None:
    """10^12 steps looped chain_reach for ever; 5000 went into --out, which plan then refused."""
    out = tmp_path / "run.json"
    with Hostile(sglang_routes(server_info={"speculative_num_steps": steps})) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", "--out", str(out), timeout=30)
    line = _one_line(run)
    assert run.code == 2 and "speculative_num_steps" in line and "128" in line, line
    assert not out.exists()


def test_impossible_k_in_per_request_metrics_is_refused(prompts: Path) -> None:
    """vLLM 0.29+'s metrics.speculative_decoding names k (num_spec_tokens): 10^12 of them looped chain_reach."""
    def complete(req: ph.Request, conn: ph.Conn) -> None:
        n = int(json.loads(req.body)["max_tokens"])
        conn.send(200, {"choices": [{"index": 0, "text": "w1 " * n, "finish_reason": "length"}],
                        "usage": {"completion_tokens": n},
                        "metrics": {"speculative_decoding": {
                            "num_spec_steps": 2, "num_accepted_draft_tokens": 1, "num_draft_tokens": 2,
                            "num_spec_tokens": 10 ** 12, "acceptance_histogram": [1, 1]}}})

    with Hostile(vllm_routes(lambda: _metrics_page(), completion=complete)) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", timeout=30)
    line = _one_line(run)
    assert run.code == 2 and "num_spec_tokens" in line and "128" in line, line


def test_impossible_adaptive_steps_gauge_is_refused(prompts: Path) -> None:
    """SGLang's adaptive steps gauge (sglang:spec_num_steps) of 10^12 became the steps the probe fits."""
    routes = sglang_routes(server_info={"speculative_adaptive": True})
    routes["/metrics"] = lambda req, conn: conn.send(
        200, b"# TYPE sglang:spec_num_steps gauge\nsglang:spec_num_steps 1e12\n", "text/plain")
    with Hostile(routes) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", timeout=30)
    line = _one_line(run)
    assert run.code == 2 and "sglang:spec_num_steps" in line and "128" in line, line


def test_long_histogram_is_refused(prompts: Path) -> None:
    """A 200,000-count histogram (quadratic per-position sums: minutes on main) is more than any engine's steps."""
    def reply(req):  # type: ignore[no-untyped-def]
        return _reply(', "spec_correct_drafts_histogram": [' + ",".join(["0"] * 199_999 + ["4"]) + "]")

    with Hostile(sglang_routes(reply=reply)) as server:
        # --max-tokens 65536: a reply may then hold the 200,000 values, so the histogram's own bound is what refuses
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "65536", timeout=30)
    line = _one_line(run)
    assert run.code == 2 and "spec_correct_drafts_histogram" in line and "200,000 entries" in line, line


def test_per_position_is_linear() -> None:
    """Suffix sums: the same figures as counting each position's tail, and 200,000 counts at once."""
    import random

    from eagleforensics.evidence.probestats import per_position

    rng = random.Random(5)
    hists = [[rng.randrange(0, 9) for _ in range(rng.randrange(2, 9))] for _ in range(20)]
    width = max(len(h) for h in hists)
    total = [sum(h[j] for h in hists if j < len(h)) for j in range(width)]
    want = [sum(total[i:]) / sum(total) for i in range(1, width)]
    assert per_position(hists) == pytest.approx(want)

    def late(*_: object) -> None:
        raise TimeoutError("per_position took past 10 s on 200,000 counts (quadratic?)")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(10)  # the quadratic sum takes hours here; the linear one ~0.05 s
    try:
        got = per_position([[1] * 200_000])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert got is not None and len(got) == 199_999 and got[0] == pytest.approx(199_999 / 200_000)


def test_run_reader_takes_every_step_count_probe_writes() -> None:
    from eagleforensics.engines.probeformats import MAX_STEPS
    from eagleforensics.io.proberun import MAX_POSITIONS

    assert MAX_POSITIONS == MAX_STEPS


# -- 6. /metrics: positions and series bounded, the page read once per window ------------------------------

def test_metrics_with_100000_positions_is_refused(prompts: Path, tmp_path: Path) -> None:
    page = _metrics_page(100_000)
    out = tmp_path / "run.json"
    with Hostile(vllm_routes(lambda: page)) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", "--out", str(out), timeout=40)
    line = _one_line(run)
    assert run.code == 2 and "/metrics" in line, line
    assert not out.exists()


def test_metrics_position_past_any_engine_is_refused(prompts: Path) -> None:
    page = _metrics_page(3).replace(b'position="2"', b'position="5000"')
    with Hostile(vllm_routes(lambda: page)) as server:
        code = CliRunner().invoke(probe_cmd, [server.url, "--prompts", str(prompts), "--max-tokens", "8"])
    assert code.exit_code == 2 and "5000" in code.output and "no engine runs" in code.output, code.output


def test_metrics_page_read_once_per_window(prompts: Path) -> None:
    """vLLM at --concurrency 1: one window per request, each window's end the next one's start, so each request
    more reads the page once more (main: twice more)."""
    reads = {}
    for n in (4, 8):
        with StandIn(Plan(engine="vllm", release="0.11.0")) as s:
            res = CliRunner().invoke(probe_cmd, [s.url, "--prompts", str(prompts), "--requests", str(n),
                                                 "--max-tokens", "32", "--json"])
            reads[n] = sum(1 for e in s.plan.seen if e["path"] == "/metrics")
        assert res.exit_code in (0, 1), res.output
        assert len(json.loads(res.stdout)["windows"]) == n
    assert reads[8] - reads[4] == 4, reads


# -- 7. bounded replies: bytes and values ------------------------------------------------------------------

def test_huge_model_info_is_refused_in_little_memory(prompts: Path) -> None:
    """A 64 MiB /model_info of [{},{},...] took 1.7 GiB to parse: refused past 1 MiB, the process stays small."""
    body = b"[" + b"{}," * ((64 * 1024 * 1024 - 8) // 3) + b"{}]"  # just under the old 64 MiB cap
    assert len(body) <= 64 * 1024 * 1024
    routes = sglang_routes()
    routes["/model_info"] = lambda req, conn: conn.send(200, body)
    with Hostile(routes) as server:
        run = run_probe(server.url, "--prompts", str(prompts), timeout=60)
    line = _one_line(run)
    assert run.code == 2 and "/model_info" in line and "1 MiB" in line, line
    assert run.maxrss < 400 * 1024 * 1024, run.maxrss


def test_many_values_are_refused_before_they_are_built() -> None:
    from eagleforensics.errors import ForensicsError
    from eagleforensics.io.guards import parse_json

    with pytest.raises(ForensicsError, match="holds 600,002 values"):  # each {} counts its brace and its comma
        parse_json(b"[" + b"{}," * 300_000 + b"{}]", "x", "reply", max_items=100_000)
    assert parse_json(b'[{"a": "[,{"}, 1]', "x", max_items=3) == [{"a": "[,{"}, 1]  # in strings: not values


def test_replies_in_flight_are_bounded_together(prompts: Path) -> None:
    """60 MiB replies eight at a time (each within the per-reply cap at --max-tokens 65536) stop at the client's
    budget for replies held at once instead of multiplying by --concurrency."""
    body = b"[" + b"{}," * (60 * 1024 * 1024 // 3) + b"{}]"
    routes = sglang_routes(generate=lambda req, conn: conn.send(200, body))
    with Hostile(routes) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "65536", "--requests", "8",
                        "--concurrency", "8", timeout=90)
    line = _one_line(run)
    assert run.code == 2 and "/generate" in line, line
    assert run.maxrss < 1024 * 1024 * 1024, run.maxrss


# -- 8. the key: validated before use, redacted from anything a server echoes -------------------------------

def test_key_with_a_crlf_is_stripped(prompts: Path) -> None:
    """A CRLF .env leaves "\\r" on the key: http.client raised with the whole key on stderr, exit 3."""
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        run = run_probe(s.url, "--prompts", str(prompts), "--max-tokens", "16", "--api-key-env", "PROBE_TEST_KEY",
                        env=_env(PROBE_TEST_KEY=KEY + "\r\n"), timeout=60)
        auth = {e["auth"] for e in s.plan.seen}
    assert run.code in (0, 1), run.err
    assert auth == {f"Bearer {KEY}"} and KEY not in run.out + run.err


@pytest.mark.parametrize("bad", [KEY + " 2", KEY + "\x1b[2J", KEY + "\u00e9", "Bearer " + KEY])
def test_bad_key_is_one_line_without_the_key(bad: str, prompts: Path) -> None:
    with Hostile(sglang_routes()) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--api-key-env", "PROBE_TEST_KEY",
                        env=_env(PROBE_TEST_KEY=bad), timeout=30)
        assert server.seen == []  # refused before any request
    line = _one_line(run)
    assert run.code == 2 and "--api-key-env PROBE_TEST_KEY" in line and "environment variable" in line
    assert "secret" not in run.err


def _variants(key: str) -> list[str]:
    return [key, key.upper(), base64.b64encode(key.encode()).decode().rstrip("="),
            base64.b64encode(f"Bearer {key}".encode()).decode().rstrip("=")]


def test_401_page_quoting_the_key_is_redacted(prompts: Path) -> None:
    routes = sglang_routes()
    routes["/model_info"] = ph.quoting_401
    with Hostile(routes) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--api-key-env", "PROBE_TEST_KEY",
                        env=_env(PROBE_TEST_KEY=KEY), timeout=30)
    line = _one_line(run)
    assert run.code == 2 and "HTTP 401" in line and "[key redacted]" in line, line
    assert not any(v in run.err for v in _variants(KEY))


def test_key_echoed_by_the_server_is_redacted_everywhere(prompts: Path, tmp_path: Path) -> None:
    """A server that echoes the credential (in its model name, a reply's finish reason, base64-encoded in its
    version): no copy reaches stdout, --json, --out or the HTML report."""
    def echo(req: ph.Request) -> str:
        return req.headers.get("authorization", "").removeprefix("Bearer ")

    routes = sglang_routes()
    routes["/model_info"] = lambda req, conn: conn.send(200, {"model_path": f"/models/{echo(req)}"})
    routes["/server_info"] = lambda req, conn: conn.send(200, {
        "model_path": "m", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
        "version": base64.b64encode(f"Bearer {echo(req)}".encode()).decode()})

    def gen(req: ph.Request, conn: ph.Conn) -> None:
        body = json.loads(_reply())
        body["meta_info"]["finish_reason"] = {"type": f"stop {echo(req).upper()}"}
        conn.send(200, body)

    routes["/generate"] = gen
    out, html = tmp_path / "run.json", tmp_path / "run.html"
    with Hostile(routes) as server:
        run = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", "--api-key-env", "PROBE_TEST_KEY",
                        "--json", "--out", str(out), "--report", str(html), env=_env(PROBE_TEST_KEY=KEY), timeout=60)
        text = run_probe(server.url, "--prompts", str(prompts), "--max-tokens", "8", "--api-key-env",
                         "PROBE_TEST_KEY", env=_env(PROBE_TEST_KEY=KEY), timeout=60)
    assert run.code in (0, 1) and text.code in (0, 1), run.err + text.err
    written = run.out + run.err + text.out + text.err + out.read_text() + html.read_text()
    assert "[key redacted]" in written
    assert not any(v in written for v in _variants(KEY))


# -- 9. mistyped arguments -----------------------------------------------------------------------------------

@pytest.mark.parametrize("url,args,says", [
    ("http://[::1", (), "IPv6"),
    ("http://a b/", (), "space"),
    ("http://" + "a" * 64 + ".example/", (), "label of 64 characters"),
    ("http://user:pw@127.0.0.1:9", (), "password"),
    ("http://127.0.0.1:99999", (), "port"),
    ("http://127.0.0.1:9/v1 x", (), "space"),
    ("http://127.0.0.1:9", ("--timeout", "inf"), "--timeout"),
    ("http://127.0.0.1:9", ("--timeout", "nan"), "--timeout"),
    ("http://127.0.0.1:9", ("--timeout", "-1"), "--timeout"),
    ("http://127.0.0.1:9", ("--timeout", "0"), "--timeout"),
    ("http://127.0.0.1:9", ("--baseline", "http://[::1"), "--baseline"),
])
def test_mistyped_arguments_are_one_line(url: str, args: tuple[str, ...], says: str, prompts: Path) -> None:
    res = CliRunner().invoke(probe_cmd, [url, "--prompts", str(prompts), *args])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and says in res.output, res.output
    assert res.output.startswith("eagleforensics: error:")


def test_mistyped_address_as_a_process(prompts: Path) -> None:
    run = run_probe("http://[::1", "--prompts", str(prompts), timeout=30)
    assert run.code == 2 and "IPv6" in _one_line(run)


# -- 10. every writing option is an output, checked before any request -------------------------------------

def test_probe_out_twice_overwrites_its_own_run(prompts: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        for _ in range(2):
            res = CliRunner().invoke(probe_cmd, [s.url, "--prompts", str(prompts), "--max-tokens", "32", "--out",
                                                 str(out)])
            assert res.exit_code in (0, 1), res.output
    assert json.loads(out.read_text())["schema"] == "eagleforensics-probe-v1"


@pytest.mark.parametrize("option", ["--out", "--report"])
def test_output_onto_an_input_is_refused_before_any_request(option: str, tmp_path: Path) -> None:
    p = tmp_path / ("prompts.html" if option == "--report" else "prompts.txt")
    p.write_text("Tell me about the sea.\n")
    with StandIn(Plan(engine="sglang", release="0.5.13")) as s:
        res = CliRunner().invoke(probe_cmd, [s.url, "--prompts", str(p), option, str(p)])
        assert s.plan.seen == []  # nothing sent
    assert res.exit_code == 2 and "would overwrite the input --prompts " in res.output, res.output  # as typed
    assert p.read_text() == "Tell me about the sea.\n"


def test_every_writing_option_is_an_output_for_the_guard() -> None:
    """Every command's option that names a file it writes is in OUTPUT_PARAMS (else the overwrite guard takes it
    for an input and refuses the second run); and no reading option is."""
    from eagleforensics.cli import main
    from eagleforensics.cli.common import OUTPUT_PARAMS

    ctx = click.Context(main)
    writing, reading = set(), set()
    for name in main.list_commands(ctx):
        for param in main.get_command(ctx, name).params:
            if not isinstance(param, click.Option) or param.is_flag:
                continue
            help_text = (param.help or "").lower()
            writes = bool(set(param.opts) & {"-o", "--output", "--out", "--report"}) or any(
                w in help_text for w in ("also write", "where to write", "to write"))
            (writing if writes else reading).add((name, param.name))
    assert writing, "no writing option found"
    assert {n for _, n in writing} <= OUTPUT_PARAMS, writing
    assert not {(c, n) for c, n in reading if n in OUTPUT_PARAMS}, reading
