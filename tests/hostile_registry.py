"""A hostile OCI registry on 127.0.0.1: a small threaded http.server that serves a real little image and
answers chosen requests with what an attacker would send (a wrong size, an endless body, a wrong shape,
a wrong digest, a token service that answers something other than JSON).

The real registry client (`patchkit build --base 127.0.0.1:PORT/...`, or `patchkit.oci.registry`) is
driven against it; nothing of patchkit is replaced. Each route answers from a list of `Answer`s, one per
request in turn, the last repeated, so a test can break the second request of a path and not the first.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bases import DOCKER_CONFIG, DOCKER_LAYER, DOCKER_LIST, DOCKER_MANIFEST

CHUNK = 1 << 20


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def endless(chunk: bytes = b"\0" * CHUNK) -> Callable[[], Iterator[bytes]]:
    """A body that never ends (the client must stop reading it)."""
    def body() -> Iterator[bytes]:
        while True:
            yield chunk
    return body


@dataclass
class Answer:
    """One answer: a status, headers, and a body (bytes, or a function giving chunks: sent chunked
    unless `length` declares a Content-Length, true or not)."""

    status: int = 200
    body: bytes | Callable[[], Iterator[bytes]] = b""
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None


class HostileRegistry:
    """`with HostileRegistry() as reg:` -> reg.host; `reg.route(method, path, *answers)`;
    `reg.image(repo, ...)` serves a small valid image and returns what it served."""

    def __init__(self, token: bool = False):
        self.routes: dict[tuple[str, str], list[Answer]] = {}
        self.requests: list[tuple[str, str]] = []
        self.token = token          # challenge for a bearer token from /token first
        self._lock = threading.Lock()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # silent
                pass

            def _answer(self):
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with registry._lock:
                    registry.requests.append((self.command, self.path))
                    answers = registry.routes.get((self.command, path))
                    answer = (answers.pop(0) if len(answers) > 1 else answers[0]) if answers else None
                if registry.token and path.startswith("/v2/") and "Authorization" not in self.headers:
                    answer = Answer(401, b"", {"WWW-Authenticate": f'Bearer realm="http://{registry.host}/token",'
                                                                   'service="hostile"'})
                answer = answer or Answer(404, b'{"errors":[{"code":"NOT_FOUND","message":"no such thing"}]}')
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                try:
                    if isinstance(answer.body, bytes):
                        self.send_header("Content-Length", str(answer.length if answer.length is not None
                                                              else len(answer.body)))
                        self.end_headers()
                        if self.command != "HEAD":
                            self.wfile.write(answer.body)
                        return
                    if answer.length is not None:
                        self.send_header("Content-Length", str(answer.length))
                    else:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.body():
                        if answer.length is not None:
                            self.wfile.write(chunk)
                        else:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    if answer.length is None:
                        self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client stopped reading: what a bounded reader does

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HostileRegistry:
        self._thread.start()
        self.route("GET", "/v2/", Answer(200, b"{}"))
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def route(self, method: str, path: str, *answers: Answer) -> None:
        self.routes[(method, path)] = list(answers)

    def blob(self, repo: str, data: bytes, answer: Answer | None = None) -> str:
        digest = sha256(data)
        self.route("GET", f"/v2/{repo}/blobs/{digest}", answer or Answer(200, data))
        self.route("HEAD", f"/v2/{repo}/blobs/{digest}", Answer(200, b"", length=len(data)))
        return digest

    def manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> None:
        answer = Answer(200, data, {"Content-Type": media_type, "Docker-Content-Digest": sha256(data)})
        self.route("GET", f"/v2/{repo}/manifests/{ref}", answer)
        self.route("HEAD", f"/v2/{repo}/manifests/{ref}", answer)

    def image(self, repo: str, layers: list[bytes], *, config: dict | None = None, manifest: dict | None = None,
              tag: str = "base") -> dict:
        """A linux/arm64 image of `layers` (gzip layer blobs) behind a manifest list tagged `tag`; `config`
        and `manifest` replace the documents served (their descriptors still name what is served)."""
        config_doc = config if config is not None else {
            "architecture": "arm64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [sha256(b"diff %d" % i) for i in range(len(layers))]}}
        config_bytes = json.dumps(config_doc).encode()
        layer_descs = [{"mediaType": DOCKER_LAYER, "digest": self.blob(repo, blob), "size": len(blob)} for blob in layers]
        manifest_doc = manifest if manifest is not None else {
            "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "digest": self.blob(repo, config_bytes), "size": len(config_bytes)},
            "layers": layer_descs}
        manifest_bytes = json.dumps(manifest_doc).encode()
        self.manifest(repo, sha256(manifest_bytes), manifest_bytes, DOCKER_MANIFEST)
        index = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [
            {"mediaType": DOCKER_MANIFEST, "digest": sha256(manifest_bytes), "size": len(manifest_bytes),
             "platform": {"architecture": "arm64", "os": "linux"}}]}).encode()
        self.manifest(repo, tag, index, DOCKER_LIST)
        self.manifest(repo, sha256(index), index, DOCKER_LIST)
        return {"ref": f"{self.host}/{repo}:{tag}", "index": index, "manifest": manifest_bytes,
                "config": config_bytes, "config_digest": sha256(config_bytes), "layers": layer_descs}

    def served(self, pattern: str) -> int:
        """How many requests matched `pattern` (a regex over "METHOD PATH")."""
        return sum(bool(re.search(pattern, f"{m} {p}")) for m, p in self.requests)
