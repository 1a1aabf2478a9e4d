"""A small, well-behaved HTTP client for ``probe``: a timeout on every call, no retries, bounded replies, abortable.

Built on the standard library's ``http.client``: one connection per call, never a retry (a
retried generation would count its tokens twice in the engine's counters), a socket timeout on
every read, replies bounded in size, and ``abort()`` closes every open connection so Ctrl-C does
not wait for a slow server. Environment proxies are not used: ``probe`` talks to the server it
was given. The address and any key live only here; errors name the request path, never the key.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from ..errors import ForensicsError

MAX_REPLY = 64 * 1024 * 1024  # a /metrics page or a reply of a few thousand tokens is far below this


class Client:
    """Calls to one server: ``get_json``, ``get_text``, ``post_json``; ``what`` names it in errors."""

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None, what: str = "the server") -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ForensicsError(f"{what}: expected an http(s)://HOST[:PORT] address")
        try:
            port = parts.port
        except ValueError:
            raise ForensicsError(f"{what}: the port is not a number") from None
        if not timeout > 0:
            raise ForensicsError("--timeout must be above 0 seconds")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port
        self.prefix = parts.path.rstrip("/")
        self.timeout = float(timeout)
        self.what = what
        self._key = api_key
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._aborted = False

    # -- calls -------------------------------------------------------------------------------------
    def get_text(self, path: str) -> str:
        status, body = self._call("GET", path, None)
        if status != 200:
            raise self._status_error("GET", path, status, body)
        return self._decode(path, body)

    def get_json(self, path: str, *, missing_ok: bool = False) -> Any:
        """The JSON reply of ``GET path``; None on 404 when ``missing_ok`` (an endpoint a release lacks)."""
        status, body = self._call("GET", path, None)
        if status == 404 and missing_ok:
            return None
        if status != 200:
            raise self._status_error("GET", path, status, body)
        return self._json(path, body)

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        status, body = self._call("POST", path, json.dumps(payload).encode())
        if status != 200:
            raise self._status_error("POST", path, status, body)
        return self._json(path, body)

    def abort(self) -> None:
        """Close every open connection (from another thread): calls in flight end at once with an error."""
        with self._lock:
            self._aborted = True
            conns = list(self._open)
        for conn in conns:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- plumbing ----------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        headers = {"Accept": "application/json, text/plain", "User-Agent": "eagleforensics-probe"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            conn.connect()  # a socket first, so that abort() has one to shut down
            with self._lock:
                if self._aborted:
                    raise ForensicsError(f"{self.what}: {method} {path} interrupted")
                self._open.add(conn)
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read(MAX_REPLY + 1)
            if len(data) > MAX_REPLY:
                raise ForensicsError(f"{self.what}: the reply to {method} {path} is larger than "
                                     f"{MAX_REPLY >> 20} MiB")
            return resp.status, data
        except (socket.timeout, TimeoutError):
            raise ForensicsError(f"{self.what} sent nothing for {self.timeout:g} s on {method} {path} (stalled? "
                                 "raise --timeout for a slow server)") from None
        except ConnectionRefusedError:
            raise ForensicsError(f"{self.what} refused the connection ({method} {path}): is it running, on this "
                                 "port?") from None
        except (http.client.HTTPException, OSError) as exc:
            if self._aborted:
                raise ForensicsError(f"{self.what}: {method} {path} interrupted") from None
            text = " ".join(str(exc).split())[:120] or type(exc).__name__
            raise ForensicsError(f"{self.what}: {method} {path} failed: {text}") from None
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def _decode(self, path: str, body: bytes) -> str:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise ForensicsError(f"{self.what}: the reply to {path} is not UTF-8 text") from None

    def _json(self, path: str, body: bytes) -> Any:
        try:
            return json.loads(self._decode(path, body))
        except json.JSONDecodeError as exc:
            raise ForensicsError(f"{self.what}: the reply to {path} is not JSON ({exc.msg} at {exc.pos})") from None

    def _status_error(self, method: str, path: str, status: int, body: bytes) -> ForensicsError:
        text = " ".join(body[:300].decode("utf-8", "replace").split())[:160]
        return ForensicsError(f"{self.what} answered HTTP {status} to {method} {path}" + (f": {text}" if text else ""))
