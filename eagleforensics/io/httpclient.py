"""A small, well-behaved HTTP client for ``probe``: one deadline per call, no retries, bounded replies, abortable.

Built on the standard library's ``http.client``: one connection per call, never a retry (a
retried generation would count its tokens twice in the engine's counters). Each call has ONE
deadline, ``timeout`` seconds for all of it (connect, TLS handshake, request, reply headers and
body), kept by a watchdog that shuts the call's socket down when it passes, so a server that
trickles a byte at a time, never ends a chunked body or never answers cannot hold a call longer.
The client keeps its own reference to every socket it opened (``http.client`` drops its own
once a reply says ``Connection: close``), so ``abort()`` (Ctrl-C, SIGTERM) ends every call in
flight at once. Replies are bounded in bytes and, for JSON, in nesting, values and numbers
(``io.guards.parse_json``). Environment proxies are not used: ``probe`` talks to the server it
was given. The address and any key live only here; errors name the request path, never the key,
and the key is redacted from any text a server sends back (``redact``).
"""
from __future__ import annotations

import base64
import errno
import http.client
import ipaddress
import json
import math
import os
import re
import selectors
import socket
import threading
import time
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit

from ..errors import ForensicsError
from .guards import parse_json

MAX_REPLY = 64 * 1024 * 1024  # a /metrics page or a reply of a few thousand tokens is far below this
# bytes of replies one client holds at once, across its concurrent calls (64 requests of 65536 tokens each
# take ~50 MiB of real replies): what --concurrency may not multiply past
MAX_HELD = 256 * 1024 * 1024
MAX_TIMEOUT = 86400.0  # one day: past this a "timeout" is a typo (and socket timeouts overflow at inf)
_CHUNK = 64 * 1024
# what an Authorization header can carry: visible ASCII (RFC 9110 field values), no space inside the key. RFC 6750's
# b64token is narrower, but SGLang's and vLLM's --api-key compare whatever string they were given.
_TOKEN = re.compile(r"[\x21-\x7e]+")
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # RFC 1123 (and "_", as resolvers take)
REDACTED = "[key redacted]"


def bearer_key(raw: str, source: str) -> str:
    """The API key from ``source`` (e.g. "--api-key-env PROBE_KEY"), stripped of the spaces and line ends a
    ``.env`` file leaves (CRLF); one line naming ``source``, never the key, when it cannot be a Bearer token."""
    key = raw.strip()
    if not key:
        raise ForensicsError(f"{source}: the key is empty")
    if not _TOKEN.fullmatch(key):
        raise ForensicsError(f"{source}: the key holds a character an HTTP header cannot carry in a Bearer token (a "
                             "space, a control character or non-ASCII): check how it was set (the key is not shown)")
    return key


def check_timeout(timeout: float, option: str = "--timeout") -> float:
    """``timeout`` as seconds in (0, one day]; one line for 0, a negative number, NaN or infinity."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or \
            not 0 < timeout <= MAX_TIMEOUT:
        raise ForensicsError(f"{option} must be a number of seconds above 0 and at most {MAX_TIMEOUT:g} (one day), "
                             f"got {timeout!r}")
    return float(timeout)


def check_address(url: str, what: str = "the server") -> SplitResult:
    """``url`` split, checked as an ``http(s)://HOST[:PORT][/PREFIX]`` address: one line naming what is wrong
    (an unclosed IPv6 bracket, a space, a host label past 63 characters, a port out of range, a password)."""
    shape = "expected an http(s)://HOST[:PORT] address"
    if any(ord(ch) < 0x21 or ord(ch) > 0x7E for ch in url):
        raise ForensicsError(f"{what}: the address holds a space, a control character or non-ASCII ({shape}; "
                             "write an international host name in its xn-- form)")
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host = parts.hostname
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", a port that is not a number
        why = "the port is not a number from 1 to 65535" if "port" in str(exc).lower() else \
            "an unclosed or misplaced [IPv6] bracket" if "ipv6" in str(exc).lower() else "it does not parse"
        raise ForensicsError(f"{what}: {why} ({shape})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ForensicsError(f"{what}: {shape}")
    if port == 0:
        raise ForensicsError(f"{what}: the port is not a number from 1 to 65535 ({shape})")
    if parts.username is not None or parts.password is not None:
        raise ForensicsError(f"{what}: the address holds a user name or password, which probe never sends; "
                             "give the key with --api-key-env")
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ForensicsError(f"{what}: [{host}] is not an IPv6 address ({shape})") from None
    else:
        name = host[:-1] if host.endswith(".") else host
        labels = name.split(".")
        if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
            long = next((label for label in labels if len(label) > 63), None)
            why = (f"a label of {len(long)} characters, at most 63" if long else
                   "letters, digits, - and . only, at most 253 characters")
            raise ForensicsError(f"{what}: the host name is not valid ({why}; {shape})")
    return parts


class _Call:
    """One call's socket, owned here (http.client forgets it on ``Connection: close``), and whether its deadline
    passed; ``stop`` shuts the socket down from any thread, so a blocked read in another returns at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.expired = False
        self.stopped = False
        self.connected = False
        self.headers = False  # the reply's headers are in

    def own(self, sock: socket.socket) -> None:
        with self.lock:
            self.sock = sock
            if self.stopped:
                _shut(sock)

    def stop(self, *, expired: bool = False) -> None:
        with self.lock:
            self.expired = self.expired or expired
            self.stopped = True
            if self.sock is not None:
                _shut(self.sock)


def _resolve(host: str, port: int, call: _Call, deadline: float) -> list[Any]:
    """``getaddrinfo`` within the deadline: an address is answered at once; a name is looked up on a daemon
    thread (the resolver cannot be interrupted) while this one polls the deadline and ``abort()``."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except ValueError:
        pass
    box: dict[str, Any] = {}
    done = threading.Event()

    def look_up() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            box["error"] = exc
        done.set()

    threading.Thread(target=look_up, name="probe-resolve", daemon=True).start()
    while not done.wait(0.1):
        if call.stopped or time.monotonic() >= deadline:
            raise socket.timeout() if not call.stopped or call.expired else OSError(errno.EINTR, "stopped")
    if "error" in box:
        raise box["error"]
    return box["infos"]


def _connect_polled(sock: socket.socket, addr: Any, call: _Call, deadline: float) -> None:
    """Connect ``sock`` without blocking, polling every 0.1 s until it is connected, the deadline passes
    (``socket.timeout``) or the call is stopped (``OSError``)."""
    sock.setblocking(False)
    err = sock.connect_ex(addr)
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_WRITE)
        while err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EAGAIN):
            left = deadline - time.monotonic()
            if call.stopped or left <= 0:
                raise socket.timeout() if call.expired or left <= 0 else OSError(errno.EINTR, "stopped")
            if sel.select(min(0.1, left)):
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))


def _shut(sock: socket.socket) -> None:
    try:  # socket.socket's own method: on a TLS socket it shuts the descriptor without touching the TLS state
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing left to stop


class Client:
    """Calls to one server: ``get_json``, ``get_text``, ``post_json``; ``what`` names it in errors."""

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None, what: str = "the server") -> None:
        parts = check_address(url, what)
        self.timeout = check_timeout(timeout)
        self.scheme = parts.scheme
        self.host = parts.hostname or ""
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self.what = what
        self._key = bearer_key(api_key, "the API key") if api_key is not None else None
        self._secret = _secret_pattern(self._key) if self._key else None
        self._calls: set[_Call] = set()
        self._lock = threading.Lock()
        self._aborted = False
        self._held = 0  # reply bytes read and not yet parsed, over every call in flight

    # -- calls -------------------------------------------------------------------------------------
    def get_text(self, path: str, *, limit: int = MAX_REPLY) -> str:
        status, body = self._call("GET", path, None, limit)
        try:
            if status != 200:
                raise self._status_error("GET", path, status, body)
            return self.redact(self._decode(path, body))
        finally:
            self._hold(-len(body))

    def get_json(self, path: str, *, missing_ok: bool = False, limit: int = MAX_REPLY,
                 max_items: int | None = None) -> Any:
        """The JSON reply of ``GET path``; None on 404 when ``missing_ok`` (an endpoint a release lacks)."""
        status, body = self._call("GET", path, None, limit)
        try:
            if status == 404 and missing_ok:
                return None
            if status != 200:
                raise self._status_error("GET", path, status, body)
            return self._json(path, body, max_items)
        finally:
            self._hold(-len(body))

    def post_json(self, path: str, payload: dict[str, Any], *, limit: int = MAX_REPLY,
                  max_items: int | None = None) -> Any:
        status, body = self._call("POST", path, json.dumps(payload).encode(), limit)
        try:
            if status != 200:
                raise self._status_error("POST", path, status, body)
            return self._json(path, body, max_items)
        finally:
            self._hold(-len(body))

    def abort(self) -> None:
        """End every call in flight at once (from any thread) and refuse new ones: their sockets are shut down."""
        with self._lock:
            self._aborted = True
            calls = list(self._calls)
        for call in calls:
            call.stop()

    def redact(self, text: str) -> str:
        """``text`` with the key (as sent, percent-encoded, base64, any case) replaced: what a server echoes back."""
        return text if self._secret is None else self._secret.sub(REDACTED, text)

    # -- plumbing ----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: bytes | None, limit: int) -> tuple[int, bytes]:
        deadline = time.monotonic() + self.timeout
        call = _Call()
        with self._lock:
            if self._aborted:
                raise ForensicsError(f"{self.what}: {method} {path} interrupted")
            self._calls.add(call)
        watchdog = threading.Timer(self.timeout, call.stop, kwargs={"expired": True})
        watchdog.daemon = True  # never keeps the interpreter waiting at exit
        watchdog.start()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {"Accept": "application/json, text/plain", "User-Agent": "eagleforensics-probe"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            conn.sock = self._connect(call, deadline)  # http.client sends on the socket it is given
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            call.headers = not call.expired  # the watchdog's shutdown can also end a trickle of headers
            data = self._read(resp, limit, method, path)
            if call.expired:  # the watchdog's shutdown can read as a clean end of the body
                self._hold(-len(data))
                raise socket.timeout()
            return resp.status, data
        except ForensicsError:
            raise
        except ConnectionRefusedError:
            raise ForensicsError(f"{self.what} refused the connection ({method} {path}): is it running, on this "
                                 "port?") from None
        except (http.client.HTTPException, OSError, ValueError) as exc:
            if call.expired or isinstance(exc, (socket.timeout, TimeoutError)):
                raise self._late(call, method, path) from None
            if self._aborted:
                raise ForensicsError(f"{self.what}: {method} {path} interrupted") from None
            text = self.redact(" ".join(str(exc).split()))[:120] or type(exc).__name__
            raise ForensicsError(f"{self.what}: {method} {path} failed: {text}") from None
        finally:
            watchdog.cancel()
            with self._lock:
                self._calls.discard(call)
            conn.close()
            if call.sock is not None:
                call.sock.close()

    def _connect(self, call: _Call, deadline: float) -> socket.socket:
        """A connected socket (TLS for https), owned by ``call`` before it connects: the connect itself waits in
        short polls that see the deadline and ``abort()`` (a blocking connect to a server that never accepts
        could not be woken from another thread)."""
        port = self.port or (443 if self.scheme == "https" else 80)
        last: OSError = OSError(f"{self.host} has no address")
        for family, kind, proto, _, addr in _resolve(self.host, port, call, deadline):
            sock = socket.socket(family, kind, proto)
            call.own(sock)
            try:
                _connect_polled(sock, addr, call, deadline)
                break
            except (socket.timeout, TimeoutError):
                sock.close()
                raise
            except OSError as exc:  # refused on this address: the next one may answer
                sock.close()
                last = exc
                if call.stopped:
                    raise
        else:
            raise last
        call.connected = True
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        if self.scheme != "https":
            return sock
        import ssl

        tls = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        call.own(tls)  # wrapping took the descriptor over from ``sock``
        tls.do_handshake()
        return tls

    def _read(self, resp: http.client.HTTPResponse, limit: int, method: str, path: str) -> bytes:
        """The whole body, refused once past ``limit`` bytes (read in chunks: nothing is allocated at the size a
        server declares) or past what the client may hold at once (``MAX_HELD``), and refused when it ends before
        its declared length. The bytes returned stay counted as held until the caller releases them."""
        parts: list[bytes] = []
        total = 0
        try:
            while True:
                chunk = resp.read1(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise ForensicsError(f"{self.what}: the reply to {method} {path} is larger than "
                                         f"{_size(limit)} (what this endpoint can hold)")
                self._hold(len(chunk), method, path)
                parts.append(chunk)
            if resp.length:  # bytes the server declared and never sent
                raise http.client.IncompleteRead(b"", resp.length)
        except BaseException:
            self._hold(-sum(len(p) for p in parts))
            raise
        return b"".join(parts)

    def _hold(self, n: int, method: str = "", path: str = "") -> None:
        with self._lock:
            if n > 0 and self._held + n > MAX_HELD:
                raise ForensicsError(f"{self.what}: the replies in flight (at {method} {path}) hold more than "
                                     f"{_size(MAX_HELD)} together: lower --concurrency or --max-tokens")
            self._held += n

    def _late(self, call: _Call, method: str, path: str) -> ForensicsError:
        if not call.connected:
            return ForensicsError(f"{self.what} did not take the connection within {self.timeout:g} s ({method} "
                                  f"{path}): is the address right, the server up and not overloaded?")
        if call.headers:
            return ForensicsError(f"{self.what} did not finish its reply to {method} {path} within {self.timeout:g} s "
                                  "(trickling? --timeout bounds the whole call; raise it for a slow server)")
        return ForensicsError(f"{self.what} did not send its reply headers within {self.timeout:g} s on {method} "
                              f"{path} (stalled or trickling? raise --timeout for a slow server)")

    def _decode(self, path: str, body: bytes) -> str:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise ForensicsError(f"{self.what}: the reply to {path} is not UTF-8 text") from None

    def _json(self, path: str, body: bytes, max_items: int | None) -> Any:
        try:
            doc = parse_json(self._decode(path, body), self.what, f"the reply to {path}", max_items=max_items,
                             strict_numbers=True)
        except json.JSONDecodeError as exc:
            raise ForensicsError(f"{self.what}: the reply to {path} is not JSON ({exc.msg} at {exc.pos})") from None
        return doc if self._secret is None else self._scrub(doc)

    def _scrub(self, value: Any) -> Any:
        """``value`` with the key redacted from every string in it (parse_json bounds the depth)."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self._scrub(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(k): self._scrub(v) for k, v in value.items()}
        return value

    def _status_error(self, method: str, path: str, status: int, body: bytes) -> ForensicsError:
        text = self.redact(body[:4096].decode("utf-8", "replace"))  # redacted whole, then cut
        text = " ".join(text.split())[:160]
        return ForensicsError(f"{self.what} answered HTTP {status} to {method} {path}" + (f": {text}" if text else ""))


def _secret_pattern(key: str) -> re.Pattern[str]:
    """The key as a server might echo it: as sent, percent-encoded, base64 (alone or as ``Bearer KEY``), any case."""
    forms = {key, quote(key, safe=""), base64.b64encode(key.encode()).decode().rstrip("="),
             base64.b64encode(f"Bearer {key}".encode()).decode().rstrip("=")}
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
