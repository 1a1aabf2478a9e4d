"""Hostile servers for the probe's hardening tests: raw HTTP on 127.0.0.1 whose bytes each test writes.

A ``Hostile`` server answers the SGLang endpoints probe reads (``/model_info``, ``/server_info``,
``/generate``) or vLLM's (``/version``, ``/v1/models``, ``/metrics``, ``/v1/completions``) with
what a route returns, and routes can misbehave at the transport level: trickle the headers or the
body a byte at a time, never end a chunked body, say ``Connection: close`` and then stall, or never
accept at all (``accept=False``). Every server binds 127.0.0.1 on an ephemeral port, runs at most
``lifetime`` seconds and stops by itself; every loop checks that stop, so nothing outlives its test.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

LIFETIME = 45.0  # seconds: every server stops by itself after this, whatever the test does
MODEL = "/models/tiny-llama"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Route = Callable[[Request, "Conn"], None]


class Conn:
    """One accepted connection: ``send`` a whole reply, or write raw bytes (``raw``) and ``pause`` between them."""

    def __init__(self, sock: socket.socket, server: "Hostile") -> None:
        self.sock = sock
        self.server = server

    def live(self) -> bool:
        return not self.server.stopped.is_set() and time.monotonic() < self.server.end

    def raw(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:  # the client left (probe gave up, as it should)
            return False

    def pause(self, seconds: float) -> bool:
        """Sleep (stopping early when the server stops); False once the server is stopping."""
        return not self.server.stopped.wait(seconds) and self.live()

    def send(self, status: int, body: Any, ctype: str = "application/json", close: bool = False) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                + ("Connection: close\r\n" if close else "") + "\r\n").encode()
        self.raw(head + data)


def sglang_routes(*, server_info: dict[str, Any] | None = None, generate: Route | None = None,
                  reply: Callable[[Request], Any] | None = None) -> dict[str, Route]:
    """SGLang 0.5.13's endpoints (the formats of tests/probeservers.py), with what a test changes."""
    args = {"model_path": MODEL, "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "version": "0.5.13",
            **(server_info or {})}

    def default_reply(req: Request) -> Any:
        n = int(json.loads(req.body)["sampling_params"]["max_new_tokens"])
        ids = [10 + (i * 7) % 400 for i in range(n)]
        return {"text": " ".join(f"w{t}" for t in ids), "output_ids": ids,
                "meta_info": {"id": "r", "finish_reason": {"type": "length"}, "completion_tokens": n,
                              "spec_verify_ct": max(1, n // 2), "spec_correct_drafts_histogram": [0, n // 2, 0, 0]}}

    make = reply or default_reply

    def gen(req: Request, conn: Conn) -> None:
        got = make(req)
        conn.send(200, got if isinstance(got, bytes) else json.dumps(got).encode())

    return {"/model_info": lambda r, c: c.send(200, {"model_path": MODEL, "is_generation": True}),
            "/server_info": lambda r, c: c.send(200, args),
            "/generate": generate or gen}


def vllm_routes(metrics: Callable[[], bytes], *, completion: Route | None = None) -> dict[str, Route]:
    """vLLM 0.11.0's endpoints with a /metrics page the test writes."""
    def complete(req: Request, conn: Conn) -> None:
        n = int(json.loads(req.body)["max_tokens"])
        conn.send(200, {"choices": [{"index": 0, "text": "w1 " * n, "finish_reason": "length"}],
                        "usage": {"completion_tokens": n}})

    return {"/version": lambda r, c: c.send(200, {"version": "0.11.0"}),
            "/v1/models": lambda r, c: c.send(200, {"object": "list", "data": [{"id": MODEL}]}),
            "/metrics": lambda r, c: c.send(200, metrics(), "text/plain; version=0.0.4"),
            "/v1/completions": completion or complete}


# -- transport-level misbehaviour (routes) ---------------------------------------------------------------

def trickle_headers(req: Request, conn: Conn) -> None:
    """A status line, then one header whose value never ends: a byte every 0.5 s."""
    conn.raw(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while conn.pause(0.5) and conn.raw(b"a"):
        pass


def trickle_body(req: Request, conn: Conn) -> None:
    """Headers promising a megabyte, then a byte every 0.5 s."""
    conn.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n[")
    while conn.pause(0.5) and conn.raw(b"1"):
        pass


def endless_chunks(req: Request, conn: Conn) -> None:
    """A chunked body that never ends: a small chunk every 0.1 s."""
    conn.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    while conn.pause(0.1) and conn.raw(b"2\r\n[1\r\n"):
        pass


def close_then_stall(req: Request, conn: Conn) -> None:
    """Headers saying ``Connection: close`` with no length (the body runs to the end of the connection), then
    one byte of it and nothing more: http.client has dropped its socket, the read goes on."""
    conn.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{")
    conn.server.stalled.set()
    while conn.pause(0.5):
        pass


def quoting_401(req: Request, conn: Conn) -> None:
    """A 401 page that quotes the credential it was sent (as some gateways do)."""
    auth = req.headers.get("authorization", "")
    conn.send(401, f"<html>invalid credential {auth!r} (token {auth.removeprefix('Bearer ')})</html>".encode(),
              "text/html")


class Hostile:
    """A raw HTTP server on 127.0.0.1: ``url``; ``seen`` lists (method, path) of each request; ``close()``."""

    def __init__(self, routes: dict[str, Route], *, accept: bool = True, accept_limit: int | None = None,
                 lifetime: float = LIFETIME) -> None:
        self.routes = routes
        self.stopped = threading.Event()
        self.stalled = threading.Event()  # set by a route once it has sent what it will send
        self.accept_limit = accept_limit  # stop accepting after this many connections, backlog filled
        self.end = time.monotonic() + lifetime
        self.seen: list[tuple[str, str]] = []
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(0 if not accept else 8)
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.fillers: list[socket.socket] = []
        self._socks: list[socket.socket] = []
        if accept:
            self.lsock.settimeout(0.1)
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()
        else:  # never accepted: fill the backlog so the probe's connect waits in SYN-SENT
            self.thread = None
            self._fill(4)
            timer = threading.Timer(lifetime, self.close)
            timer.daemon = True
            timer.start()

    def __enter__(self) -> "Hostile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stopped.set()
        for s in [*self._socks, *self.fillers, self.lsock]:
            try:
                s.close()
            except OSError:
                pass
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)

    def _fill(self, n: int) -> None:
        """Connect ``n`` idle clients that are never accepted: the backlog is full, later connects hang."""
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", self.lsock.getsockname()[1]))
            except BlockingIOError:
                pass
            self.fillers.append(s)

    def _serve(self) -> None:
        accepted = 0
        while not self.stopped.is_set() and time.monotonic() < self.end:
            if self.accept_limit is not None and accepted >= self.accept_limit:
                self._fill(16)  # the backlog (8) full: the next client's connect hangs
                self.stalled.set()
                self.stopped.wait(max(0.0, self.end - time.monotonic()))
                break
            try:
                sock, _ = self.lsock.accept()
            except (socket.timeout, OSError):
                continue
            accepted += 1
            self._socks.append(sock)
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()
        self.stopped.set()

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(5.0)
        try:
            with sock:
                req = self._request(sock)
                if req is None:
                    return
                self.seen.append((req.method, req.path))
                route = self.routes.get(req.path)
                conn = Conn(sock, self)
                if route is None:
                    conn.send(404, {"detail": "Not Found"})
                else:
                    route(req, conn)
        except OSError:
            pass

    @staticmethod
    def _request(sock: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk or len(data) > 1 << 20:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        want = int(headers.get("content-length", "0"))
        while len(body) < want:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            body += chunk
        return Request(method, path, headers, body)
