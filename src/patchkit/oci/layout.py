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
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.oci.media import (
    INDEX_TYPES,
    canonical_json,
    check_digest,
)
from patchkit.oci.schema import Descriptor, Index, parse
from patchkit.oci.verified import CHUNK, VerifiedStream, check_bytes
from patchkit.untrusted import open_regular, read_file

LAYOUT_FILE = "oci-layout"
LAYOUT_VERSION = {"imageLayoutVersion": "1.0.0"}
REF_NAME = "org.opencontainers.image.ref.name"


class InvalidLayout(PatchkitError):
    """An OCI layout that does not hold what was asked of it (exit 2): `path` the layout directory,
    `problem` "not-a-layout" (no oci-layout and index.json), "missing-blob", "no-such-image" or "ambiguous"
    (several images and none named), `name` the blob digest or image name asked for ("" for none),
    `images` the images it holds (for "ambiguous")."""

    def __init__(self, path: Path, problem: str, name: str = "", images: tuple[str, ...] = ()):
        self.path, self.problem, self.name, self.images = path, problem, name, images
        super().__init__({
            "not-a-layout": f"{path} is not an OCI image layout (no oci-layout and index.json)",
            "missing-blob": f"OCI layout {path} lacks blob {name}",
            "no-such-image": f"OCI layout {path} has no image named {name!r}",
            "ambiguous": f"OCI layout {path} holds {len(images)} images ({', '.join(images)}): name one as {path}:NAME",
        }[problem])


class OutputTaken(PatchkitError):
    """An output path that holds something other than an OCI layout, which patchkit never replaces
    (exit 2): `path`."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(f"--output {path} exists and is not an OCI image layout; choose another path")


def is_layout(path: Path) -> bool:
    return (path / LAYOUT_FILE).is_file() and (path / "index.json").is_file()


@dataclass(frozen=True)
class LocalBlob:
    """A blob on disk (a base layout's, the cache's) to go into an output, with its descriptor's size:
    it is hashed on the way in and refused unless it matches."""

    path: Path
    size: int
    cached: bool = False  # a file of patchkit's own cache: removed if it does not match


class Layout:
    """A layout directory being read (a base given as `--base DIR` or `--base DIR:REF`). Every file in it
    is outside input: index.json and the blobs are read within their limits and checked before use."""

    def __init__(self, root: Path):
        self.root = Path(root)
        if not is_layout(self.root):
            raise InvalidLayout(self.root, "not-a-layout")
        what = f"{self.root}/index.json"
        self.index_doc, self.index = parse(read_file(self.root / "index.json", "manifest", what), Index, what)

    def blob_path(self, digest: str) -> Path:
        algo, _, hexdigest = check_digest(digest).partition(":")
        path = self.root / "blobs" / algo / hexdigest
        if not path.is_file():
            raise InvalidLayout(self.root, "missing-blob", digest)
        return path

    def read_blob(self, digest: str, size: int | None = None, kind: str = "manifest") -> bytes:
        """A small blob (an index, manifest or config) whole, within `kind`'s limit, of the size its
        descriptor gives and matching its digest."""
        what = f"OCI layout {self.root}"
        return check_bytes(read_file(self.blob_path(digest), kind, f"{what}: blob {digest}"), digest, size, what)

    def resolve(self, ref: str | None) -> Descriptor:
        """The index.json entry tagged `ref`, or the only entry when no ref is given."""
        def name(e: Descriptor) -> str | None:
            return (e.annotations or {}).get(REF_NAME)

        entries = self.index_doc.manifests
        if ref is not None:
            entries = [e for e in entries if name(e) == ref or e.digest == ref]
            if not entries:
                raise InvalidLayout(self.root, "no-such-image", ref)
        if len(entries) != 1:
            raise InvalidLayout(self.root, "ambiguous", images=tuple(sorted(name(e) or e.digest for e in entries)))
        return entries[0]


def _put_file(blob: LocalBlob, digest: str, target: Path) -> None:
    """`blob` into the output as a regular file of its own name, verified: hashed through the file
    descriptor it was opened by, then hard-linked only if the link is that very inode (else, and across
    file systems, copied from that descriptor while hashed again). A symbolic link in a base layout is
    followed to what it names and never copied as a link."""
    what = f"{blob.path}"
    with open_regular(blob.path, "layer", what) as f:
        VerifiedStream(f, digest, blob.size, what, discard=blob.path if blob.cached else None).finish()
        hashed = os.fstat(f.fileno())
        try:
            os.link(blob.path, target)  # follows a link in the base to the file it names
            linked = os.lstat(target)
            if (linked.st_dev, linked.st_ino) == (hashed.st_dev, hashed.st_ino):
                return
            target.unlink()  # the path was swapped after the hash: copy the inode that was hashed
        except OSError:
            pass  # another file system, or hard links refused: copy
        f.seek(0)
        stream = VerifiedStream(f, digest, blob.size, what)
        with open(target, "wb") as out:
            while chunk := stream.read(CHUNK):
                out.write(chunk)
            stream.finish()


def write_layout(dest: Path, index: Mapping, blobs: Mapping[str, bytes | LocalBlob]) -> None:
    """Write a complete layout at `dest`: `blobs` maps digest -> bytes, or -> a file on disk, which goes in
    only once it hashed to that digest (`_put_file`).

    An existing `dest` is replaced only if it is itself an OCI layout or empty: patchkit never deletes
    a directory it did not write.
    """
    dest = Path(dest)
    if dest.exists() and not (dest.is_dir() and (is_layout(dest) or not any(dest.iterdir()))):
        raise OutputTaken(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        sha_dir = tmp / "blobs" / "sha256"
        sha_dir.mkdir(parents=True)
        for digest, content in sorted(blobs.items()):
            target = sha_dir / check_digest(digest).split(":", 1)[1]
            if isinstance(content, bytes):
                target.write_bytes(check_bytes(content, digest, len(content), f"{dest}"))
            else:
                _put_file(content, digest, target)
        (tmp / LAYOUT_FILE).write_text(json.dumps(LAYOUT_VERSION))
        if index.get("mediaType") not in INDEX_TYPES:  # the caller's bug, not bad input: exit 3
            raise ValueError(f"a layout's index.json must be an image index, not {index.get('mediaType')!r}")
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
