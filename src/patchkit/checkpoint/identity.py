"""A checkpoint's identity: config.json and model.safetensors.index.json, hashed, compared with the pins,
and only then parsed.

`verify_identity` hashes both files and parses the very bytes it hashed, only after both match their
pins: nothing unverified is ever parsed, and a file swapped between hashing and reading cannot slip
through. Every other part of a checkpoint is read through the VerifiedCheckpoint it returns (headers.py
reads only the shards the verified index names).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from patchkit.checkpoint.shapes import conform
from patchkit.errors import PatchkitError
from patchkit.jsondata import load_json_object
from patchkit.untrusted import read_file
from patchkit.variants.definitions import Pins

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# Where each file's bytes are bounded (patchkit.untrusted.LIMITS).
KINDS = {CONFIG: "config", INDEX: "checkpoint-index"}


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """config.json and the index, parsed from the exact bytes whose SHA-256 matched the pins."""

    root: Path
    config: dict
    index: dict
    config_sha256: str
    index_sha256: str


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_checkpoint_file(root: Path, name: str) -> bytes:
    """The bytes of config.json or the index: a regular file within its kind's limit, never a FIFO's wait."""
    path = root / name
    if not path.exists() and not path.is_symlink():
        raise PatchkitError(f"checkpoint {root} has no {name}")
    return read_file(path, KINDS[name])


def verify_identity(root: Path, pins: Pins) -> VerifiedCheckpoint:
    """Hash, compare, then parse config.json and the index; PatchkitError on any mismatch."""
    if not pins.complete:
        raise PatchkitError("identity check needs both pins (config.json and index); refusing an unpinned check")
    if not root.is_dir():
        raise PatchkitError(f"checkpoint {root} is not a directory")
    parsed = {}
    digests = {}
    for name, pin in ((CONFIG, pins.config_sha256), (INDEX, pins.index_sha256)):
        data = read_checkpoint_file(root, name)
        digest = sha256_bytes(data)
        if digest != pin:
            raise PatchkitError(f"{root / name}: sha256 {digest} does not match the pin {pin}; refusing to read it")
        digests[name] = digest
        parsed[name] = data
    config = load_json_object(parsed[CONFIG], str(root / CONFIG))
    index = load_json_object(parsed[INDEX], str(root / INDEX))
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PatchkitError(f"{root / INDEX}: no weight_map")
    conform(weight_map, dict[str, str], str(root / INDEX), "$.weight_map")
    for tensor, shard in weight_map.items():
        if "/" in shard or not shard.endswith(".safetensors"):
            raise PatchkitError(f"{root / INDEX}: tensor {tensor!r} maps to an invalid shard name {shard!r}")
    return VerifiedCheckpoint(root, config, index, digests[CONFIG], digests[INDEX])
