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


class NotACheckpoint(PatchkitError):
    """A checkpoint folder that is not there or lacks a file identity checks read (exit 2): the `root` and
    the `missing` file ("" when the root itself is not a directory)."""

    def __init__(self, root: Path, missing: str = ""):
        self.root, self.missing = root, missing
        super().__init__(f"checkpoint {root} has no {missing}" if missing else f"checkpoint {root} is not a directory")


class PinsIncomplete(PatchkitError):
    """An identity check asked for without both pins (exit 2): the files left `unpinned`."""

    def __init__(self, unpinned: tuple[str, ...]):
        self.unpinned = unpinned
        super().__init__(f"identity check needs both pins (config.json and index), {', '.join(unpinned)} has none; "
                         "refusing an unpinned check")


class PinMismatch(PatchkitError):
    """A checkpoint file whose sha256 is not its pin (exit 2): the file's `path`, its `actual` digest and
    the `pin`; nothing of it is parsed."""

    def __init__(self, path: Path, actual: str, pin: str | None):
        self.path, self.actual, self.pin = path, actual, pin
        super().__init__(f"{path}: sha256 {actual} does not match the pin {pin}; refusing to read it")


class InvalidWeightMap(PatchkitError):
    """An index whose weight_map cannot name the shards (exit 2): the index `path`, the `problem` ("none":
    absent or empty, "shard-name": a shard name with a directory or not .safetensors) and the `tensor` and
    `shard` at fault (None for "none")."""

    def __init__(self, path: Path | str, problem: str, tensor: str | None = None, shard: str | None = None):
        self.path, self.problem, self.tensor, self.shard = path, problem, tensor, shard
        super().__init__(f"{path}: tensor {tensor!r} maps to an invalid shard name {shard!r}" if problem == "shard-name"
                         else f"{path}: no weight_map (a non-empty object of tensor name -> shard)")


def read_checkpoint_file(root: Path, name: str) -> bytes:
    """The bytes of config.json or the index: a regular file within its kind's limit, never a FIFO's wait."""
    path = root / name
    if not path.exists() and not path.is_symlink():
        raise NotACheckpoint(root, name)
    return read_file(path, KINDS[name])


def verify_identity(root: Path, pins: Pins) -> VerifiedCheckpoint:
    """Hash, compare, then parse config.json and the index; PatchkitError on any mismatch."""
    if not pins.complete:
        raise PinsIncomplete(tuple(label for label, pin in ((CONFIG, pins.config_sha256), (INDEX, pins.index_sha256))
                                   if pin is None))
    if not root.is_dir():
        raise NotACheckpoint(root)
    parsed = {}
    digests = {}
    for name, pin in ((CONFIG, pins.config_sha256), (INDEX, pins.index_sha256)):
        data = read_checkpoint_file(root, name)
        digest = sha256_bytes(data)
        if digest != pin:
            raise PinMismatch(root / name, digest, pin)
        digests[name] = digest
        parsed[name] = data
    config = load_json_object(parsed[CONFIG], str(root / CONFIG))
    index = load_json_object(parsed[INDEX], str(root / INDEX))
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InvalidWeightMap(root / INDEX, "none")
    conform(weight_map, dict[str, str], str(root / INDEX), "$.weight_map")
    for tensor, shard in weight_map.items():
        if "/" in shard or not shard.endswith(".safetensors"):
            raise InvalidWeightMap(root / INDEX, "shard-name", tensor, shard)
    return VerifiedCheckpoint(root, config, index, digests[CONFIG], digests[INDEX])
