"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real registry (tests/registry.py's docker-registry,
or tests/hostile_registry.py): stdlib sockets and http.server, one thread per connection.

Each request is matched against a list of `Rule`s, by its index since the last `reset` or by method and a
regex over its path, and the first rule that matches it does what it says:
  - "drop": reset the connection (RST) after reading the request's head and half its body, never
    forwarding it: the client's send breaks off mid-request;
  - "lose": forward the request, let the registry act on it, then reset the connection instead of
    answering: the client never learns that the blob or manifest arrived;
  - a status (500, 429, 403, ...): answer it with a registry-style error body (error code `code`)
    without forwarding; a 429 carries `retry_after` as its Retry-After;
  - "cut": forward, then send the answer's head and half its body and reset: the answer breaks off;
  - "delay": wait `seconds`, then forward (a slow registry: overlapping requests, read timeouts).
Otherwise the request is forwarded unchanged (its Host header too, so the registry's Location headers
name the proxy), and the upstream's address in any answer header is rewritten to the proxy's (a token
realm), as a reverse proxy does. Every request is logged with when it arrived and when it was answered.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate"}


@dataclass
class Rule:
    """`action` the `nth` request (1-based; 0: every one) that matches `index` (the request's place since
    the last reset, 0-based), `method` and `path` (a regex searched in the path with its query)."""

    action: str | int
    method: str | None = None
    path: str | None = None
    index: int | None = None
    nth: int = 1
    retry_after: str = "1"
    seconds: float = 0.0
    code: str = "FAULT"
    matched: int = 0
    fired: int = 0

    def applies(self, index: int, method: str, path: str) -> bool:
        if self.index is not None and index != self.index:
            return False
        if self.method is not None and method != self.method:
            return False
        if self.path is not None and not re.search(self.path, path):
            return False
        self.matched += 1
        return not self.nth or self.matched == self.nth


@dataclass
class Seen:
    index: int
    method: str
    path: str
    start: float
    end: float = 0.0
    fault: str | int | None = None


@dataclass
class FaultProxy:
    """`with FaultProxy(upstream) as proxy:` -> proxy.host; `proxy.reset(rules)`; `proxy.log`."""

    upstream: str
    rules: list[Rule] = field(default_factory=list)
    log: list[Seen] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        proxy = self
        up_host, up_port = self.upstream.rsplit(":", 1)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # silent
                pass

            def _handle(self):
                with proxy._lock:
                    seen = Seen(len(proxy.log), self.command, self.path, time.monotonic())
                    proxy.log.append(seen)
                    # every rule counts the requests it matches, whichever of them fires
                    firing = [r for r in proxy.rules if r.applies(seen.index, self.command, self.path)]
                    rule = firing[0] if firing else None
                    if rule is not None:
                        rule.fired += 1
                    seen.fault = rule.action if rule else None
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    if rule is not None and rule.action == "drop":
                        self.rfile.read(length // 2)
                        return self._reset(seen)
                    body = self.rfile.read(length) if length else b""
                    if rule is not None and isinstance(rule.action, int):
                        return self._error(rule, seen)
                    if rule is not None and rule.action == "delay":
                        time.sleep(rule.seconds)
                    status, reason, headers, answer = self._forward(body)
                    if rule is not None and rule.action == "lose":
                        return self._reset(seen)
                    self.send_response(status, reason)
                    for key, value in headers:
                        self.send_header(key, value.replace(proxy.upstream, proxy.host))
                    self.end_headers()
                    if rule is not None and rule.action == "cut":
                        self.wfile.write(answer[:len(answer) // 2])
                        return self._reset(seen)
                    if self.command != "HEAD":
                        self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up on this request (a read timeout)
                seen.end = time.monotonic()

            def _forward(self, body: bytes):
                conn = http.client.HTTPConnection(up_host, int(up_port), timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST",
                                                                                             "PATCH") else None,
                                 headers=headers)
                    resp = conn.getresponse()
                    answer = resp.read() if self.command != "HEAD" else b""
                    kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP
                            and (k.lower() != "content-length" or self.command == "HEAD")]
                    if self.command != "HEAD":
                        kept.append(("Content-Length", str(len(answer))))
                    return resp.status, resp.reason, kept, answer
                finally:
                    conn.close()

            def _error(self, rule: Rule, seen: Seen):
                body = json.dumps({"errors": [{"code": rule.code, "message": f"injected {rule.action}"}]}).encode()
                self.send_response(rule.action)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if rule.action == 429:
                    self.send_header("Retry-After", rule.retry_after)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                seen.end = time.monotonic()

            def _reset(self, seen: Seen):
                """Close with RST (SO_LINGER 0), not a polite FIN: what a crashed proxy or a dropped route gives."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                seen.end = time.monotonic()

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self, rules: list[Rule] = ()) -> None:
        with self._lock:
            self.log = []
            self.rules = list(rules)

    def requests(self, pattern: str = "") -> list[Seen]:
        """The logged requests whose "METHOD PATH" matches `pattern`."""
        with self._lock:
            return [s for s in self.log if re.search(pattern, f"{s.method} {s.path}")]

    def most_at_once(self, pattern: str) -> int:
        """The most requests matching `pattern` that were in flight at the same moment."""
        spans = [(s.start, s.end or time.monotonic()) for s in self.requests(pattern)]
        events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return most
