"""Media types, canonical JSON, digests and platforms: the vocabulary every other oci module shares."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from patchkit.errors import PatchkitError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYER_NONDIST_GZIP = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_FOREIGN_GZIP = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
# Layers patchkit can read (to find the target files). zstd needs a decompressor Python 3.11 lacks.
READABLE_LAYERS = frozenset({OCI_LAYER_TAR, OCI_LAYER_GZIP, OCI_LAYER_NONDIST_GZIP, DOCKER_LAYER_GZIP,
                             DOCKER_FOREIGN_GZIP})

# The output is always OCI: Docker schema 2 has no annotations, and the blobs are byte-identical under
# either name, so converting a Docker base only renames descriptors (what crane does too).
TO_OCI = {
    DOCKER_LIST: OCI_INDEX,
    DOCKER_MANIFEST: OCI_MANIFEST,
    DOCKER_CONFIG: OCI_CONFIG,
    DOCKER_LAYER_GZIP: OCI_LAYER_GZIP,
    DOCKER_FOREIGN_GZIP: OCI_LAYER_NONDIST_GZIP,
}

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def canonical_json(obj: object) -> bytes:
    """Sorted keys, no insignificant whitespace, UTF-8: the same object always hashes the same."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class InvalidDigest(PatchkitError):
    """A digest that is not sha256:<64 hex digits> (exit 2): `what` names where it was found, `digest` the
    value (any type: it comes from outside)."""

    def __init__(self, what: str, digest: object):
        self.what, self.digest = what, digest
        super().__init__(f"{what} {digest!r} is not a sha256 digest (sha256: followed by 64 hex digits)")


class InvalidPlatform(PatchkitError):
    """A platform that is not OS/ARCH[/VARIANT] (exit 2): `text` as given."""

    def __init__(self, text: str):
        self.text = text
        super().__init__(f"platform {text!r} is not OS/ARCH[/VARIANT], e.g. linux/arm64")


def check_digest(digest: str, what: str = "digest") -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise InvalidDigest(what, digest)
    return digest


def descriptor(media_type: str, data: bytes, **extra: object) -> dict:
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data), **extra}


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise InvalidPlatform(text)
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def matches(self, other: dict) -> bool:
        """True when an index entry's or a config's platform fields name this platform.

        arm64 images are published both with and without variant "v8"; both mean the same machine.
        """
        if other.get("os") != self.os or other.get("architecture") != self.architecture:
            return False
        want, got = self.variant, other.get("variant")
        if self.architecture == "arm64":
            want, got = want or "v8", got or "v8"
        return want is None or want == got

    def as_dict(self) -> dict:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out
