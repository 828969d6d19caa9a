"""OCI image-layout directories (image-spec `image-layout.md`), read and written.

Written atomically: everything goes to a temporary sibling directory, which is renamed into place
only once complete, so an interrupted build never leaves a half-written layout at the output path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.oci.media import (
    INDEX_TYPES,
    canonical_json,
    check_digest,
    load_json,
    sha256_digest,
)

LAYOUT_FILE = "oci-layout"
LAYOUT_VERSION = {"imageLayoutVersion": "1.0.0"}
REF_NAME = "org.opencontainers.image.ref.name"


def is_layout(path: Path) -> bool:
    return (path / LAYOUT_FILE).is_file() and (path / "index.json").is_file()


class Layout:
    """A layout directory being read (a base given as `--base DIR` or `--base DIR:REF`)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        if not is_layout(self.root):
            raise PatchkitError(f"{self.root} is not an OCI image layout (no oci-layout and index.json)")
        self.index = load_json((self.root / "index.json").read_bytes(), f"{self.root}/index.json")

    def blob_path(self, digest: str) -> Path:
        algo, _, hexdigest = check_digest(digest).partition(":")
        path = self.root / "blobs" / algo / hexdigest
        if not path.is_file():
            raise PatchkitError(f"OCI layout {self.root} lacks blob {digest}")
        return path

    def read_blob(self, digest: str) -> bytes:
        data = self.blob_path(digest).read_bytes()
        if sha256_digest(data) != digest:
            raise PatchkitError(f"OCI layout {self.root}: blob {digest} does not match its digest")
        return data

    def resolve(self, ref: str | None) -> dict:
        """The index.json entry tagged `ref`, or the only entry when no ref is given."""
        entries = self.index.get("manifests") or []
        if ref is not None:
            entries = [e for e in entries if (e.get("annotations") or {}).get(REF_NAME) == ref
                       or e.get("digest") == ref]
            if not entries:
                raise PatchkitError(f"OCI layout {self.root} has no image named {ref!r}")
        if len(entries) != 1:
            names = sorted((e.get("annotations") or {}).get(REF_NAME, e.get("digest", "?"))
                           for e in self.index.get("manifests") or [])
            raise PatchkitError(f"OCI layout {self.root} holds {len(names)} images ({', '.join(names)}): "
                                f"name one as {self.root}:NAME")
        return entries[0]


def write_layout(dest: Path, index: Mapping, blobs: Mapping[str, bytes | Path]) -> None:
    """Write a complete layout at `dest`: `blobs` maps digest -> bytes, or -> a file already verified
    against that digest (hard-linked when on the same file system, else copied).

    An existing `dest` is replaced only if it is itself an OCI layout or empty: patchkit never deletes
    a directory it did not write.
    """
    dest = Path(dest)
    if dest.exists() and not (dest.is_dir() and (is_layout(dest) or not any(dest.iterdir()))):
        raise PatchkitError(f"--output {dest} exists and is not an OCI image layout; choose another path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        sha_dir = tmp / "blobs" / "sha256"
        sha_dir.mkdir(parents=True)
        for digest, content in sorted(blobs.items()):
            target = sha_dir / check_digest(digest).split(":", 1)[1]
            if isinstance(content, bytes):
                if sha256_digest(content) != digest:
                    raise PatchkitError(f"internal error: blob content does not match {digest}")
                target.write_bytes(content)
            else:
                try:
                    os.link(content, target)
                except OSError:
                    shutil.copyfile(content, target)
        (tmp / LAYOUT_FILE).write_text(json.dumps(LAYOUT_VERSION))
        if index.get("mediaType") not in INDEX_TYPES:
            raise PatchkitError("internal error: layout index is not an image index")
        (tmp / "index.json").write_bytes(canonical_json(index))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a layout is meant to be read by others
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            dest.rename(old)
        tmp.rename(dest)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
