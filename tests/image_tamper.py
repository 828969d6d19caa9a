"""Broken images for the in-image proof's negative cases: a built image's layout copied with its top
layer (patchkit's own) rewritten by an edit, config and manifest redone, base blobs hard-linked.

The edits are what a wrong build would write: a patched file at another path, a bytecode stub over a
patched module, an extra wheel built for another Python, a dependency deleted by a whiteout.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

from patchkit.oci.layer import Entry, build_layer, iter_layer
from patchkit.oci.layout import Layout, LocalBlob, write_layout
from patchkit.oci.media import OCI_INDEX, OCI_MANIFEST, canonical_json, sha256_digest

Files = dict[str, Entry]


def top_entries(layout: Path) -> tuple[dict, dict, Files]:
    """(manifest, config, the top layer's entries by path) of the only image in `layout`."""
    lay = Layout(layout)
    desc = lay.resolve(None)
    manifest = json.loads(lay.read_blob(desc.digest, desc.size))
    config = json.loads(lay.read_blob(manifest["config"]["digest"], manifest["config"]["size"]))
    top = manifest["layers"][-1]
    entries: Files = {}
    with open(lay.blob_path(top["digest"]), "rb") as f:
        for member, tar, info in iter_layer(f, top["digest"]):
            if member.kind == "file":
                data = tar.extractfile(info).read()
                entries[member.name] = Entry(member.name, "file", data, member.mode, member.uid, member.gid)
            elif member.kind == "dir":
                entries[member.name] = Entry(member.name, "dir", b"", member.mode, member.uid, member.gid)
            elif member.kind == "whiteout":
                head, _, tail = member.name.rpartition("/")
                name = f"{head}/.wh.{tail}" if head else f".wh.{tail}"
                entries[name] = Entry(name, "whiteout")
    return manifest, config, entries


def tampered(layout: Path, dest: Path, edit: Callable[[Files], None]) -> Path:
    """`layout` with its top layer's entries passed through `edit` (in place), as a new layout at `dest`."""
    manifest, config, entries = top_entries(layout)
    edit(entries)
    dirs = {"/".join(p.split("/")[:i]) for p in entries for i in range(1, p.count("/") + 1)}
    for d in dirs - set(entries):
        entries[d] = Entry(d, "dir", b"", 0o755)
    layer = build_layer(entries.values(), epoch=0)
    config["rootfs"]["diff_ids"][-1] = layer.diff_id
    config_bytes = canonical_json(config)
    manifest["config"] = {**manifest["config"], "digest": sha256_digest(config_bytes), "size": len(config_bytes)}
    manifest["layers"][-1] = {**manifest["layers"][-1], "digest": layer.digest, "size": len(layer.blob)}
    manifest_bytes = canonical_json(manifest)
    lay = Layout(layout)
    blobs: dict[str, bytes | LocalBlob] = {d["digest"]: LocalBlob(lay.blob_path(d["digest"]), d["size"])
                                           for d in manifest["layers"][:-1]}
    blobs[layer.digest] = layer.blob
    blobs[sha256_digest(config_bytes)] = config_bytes
    blobs[sha256_digest(manifest_bytes)] = manifest_bytes
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{"mediaType": OCI_MANIFEST, "digest": sha256_digest(manifest_bytes),
                                                 "size": len(manifest_bytes), "platform": {"architecture": "arm64", "os": "linux"}}]}
    write_layout(dest, index, blobs)
    return dest


def move_file(old: str, new: str) -> Callable[[Files], None]:
    """The patched file `old` written at `new` instead (the base's file at `old` left as it was)."""
    def edit(entries: Files) -> None:
        entry = entries.pop(old)
        entries[new] = Entry(new, "file", entry.data, entry.mode)
    return edit


def bytecode_stub(source_path: str, stock_source: bytes, python: str) -> Callable[[Files], None]:
    """An unchecked hash-based .pyc of the stock source in the patched module's __pycache__, compiled and
    marshalled by `python`, an interpreter of the image's own minor version (a code object marshalled by
    another minor is no stub the image's Python runs: 3.11's crashed 3.13's loader under qemu): the
    interpreter runs it and never reads the patched .py beside it."""
    def edit(entries: Files) -> None:
        head, _, tail = source_path.rpartition("/")
        script = ("import importlib.util, marshal, sys; src = sys.stdin.buffer.read(); "
                  "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + (1).to_bytes(4, 'little') + "
                  f"importlib.util.source_hash(src) + marshal.dumps(compile(src, {'/' + source_path!r}, 'exec', "
                  "dont_inherit=True)))")
        tag = subprocess.run([python, "-c", "import sys; print(sys.implementation.cache_tag)"], capture_output=True,
                             text=True, check=True).stdout.strip()
        data = subprocess.run([python, "-c", script], input=stock_source, capture_output=True, check=True).stdout
        pyc = f"{head}/__pycache__/{tail[:-3]}.{tag}.pyc"
        entries.pop(f"{head}/__pycache__/.wh.{tail[:-3]}.{tag}.pyc", None)
        entries[pyc] = Entry(pyc, "file", data, 0o644)
    return edit


def wheel_files(wheel: Path, site: str) -> Files:
    """A wheel's members unpacked under `site` (no scripts or data in the wheels used here)."""
    out: Files = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if not info.is_dir():
                path = f"{site}/{info.filename}"
                mode = (info.external_attr >> 16) & 0o777 or 0o644
                out[path] = Entry(path, "file", z.read(info), mode)
    return out


def swap_wheel(project_dir: str, dist_info: str, site: str, wheel: Path) -> Callable[[Files], None]:
    """The extra wheel's files replaced by those of another build of it (another Python's)."""
    def edit(entries: Files) -> None:
        for path in [p for p in entries if p.startswith((f"{site}/{project_dir}/", f"{site}/{dist_info}/"))]:
            del entries[path]
        entries.update(wheel_files(wheel, site))
    return edit


def delete_in_base(path: str) -> Callable[[Files], None]:
    """A whiteout over `path` of the base (a dependency the image no longer has)."""
    def edit(entries: Files) -> None:
        head, _, tail = path.rpartition("/")
        name = f"{head}/.wh.{tail}"
        entries[name] = Entry(name, "whiteout")
    return edit



