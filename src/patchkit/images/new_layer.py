"""The build's one new layer, described once, and what each route makes of it.

`new_layer(prepared)` lists the layer's entries in layer order (oci.layer.in_layer_order: each path once,
inside the image): the patched files' parent directories (the base's metadata), the patched files (mode
and owner as in the base), a whiteout over each of their stale bytecode files, and the pinned wheels'
directories and files (images.extras). Every route renders these entries and nothing else:

- daemonless (images.assemble): oci.layer.build_layer, the gzip blob and its diff_id;
- --load (images.local): `engine_tar()`, the layer.tar its Dockerfile ADDs;
- --engine (images.engine): `write_rootfs()`, the rootfs/ its Dockerfile COPYs.

A Dockerfile with no RUN cannot delete, so the engine routes put a 16-byte stub over each name the
daemonless layer whites out (only stale bytecode is whited out): its bad magic makes Python recompile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from patchkit.images.extras import DIR_MODE
from patchkit.images.prepare import Prepared
from patchkit.oci.layer import Entry, in_layer_order, layer_tar, normalize, whited_out, whiteout_path

# Bad magic (zeros): importlib raises ImportError in _classify_pyc, which SourceLoader.get_code catches
# and answers by compiling the source (and rewriting the pyc where it may).
BYTECODE_STUB = bytes(16)
STUB_MODE = 0o644


@dataclass(frozen=True)
class NewLayer:
    entries: tuple[Entry, ...]     # in layer order: a directory before what it holds

    def for_engine(self) -> list[Entry]:
        """The entries with a stub file, root-owned, in place of each whiteout."""
        return [Entry(whited_out(e.path), "file", BYTECODE_STUB, STUB_MODE) if e.kind == "whiteout" else e
                for e in self.entries]

    def engine_tar(self, epoch: int) -> bytes:
        """--load's layer.tar, uncompressed: no directories (the base's stay as they are; an entry for one
        would overwrite its metadata, and the engine makes a new one 0755, as the wheels' are)."""
        return layer_tar([e for e in self.for_engine() if e.kind != "dir"], epoch=epoch)

    def write_rootfs(self, rootfs: Path) -> None:
        """--engine's rootfs/: COPY takes a directory's mode from the context, so each directory entry's is
        set; a directory made only to hold a file gets 0755."""
        rootfs.mkdir(parents=True, exist_ok=True)
        for entry in self.for_engine():
            target = rootfs / normalize(entry.path)
            missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            for made in missing:
                os.chmod(made, DIR_MODE)
            if entry.kind == "dir":
                target.mkdir(exist_ok=True)
            else:
                target.write_bytes(entry.data)
            os.chmod(target, entry.mode & 0o7777)
        os.chmod(rootfs, 0o755)


def new_layer(prepared: Prepared) -> NewLayer:
    entries = [*prepared.dirs,
               *(Entry(f.path, "file", f.data, f.mode, f.uid, f.gid) for f in prepared.files),
               *(Entry(whiteout_path(p), "whiteout") for p in prepared.stale_bytecode),
               *prepared.extras.entries()]
    return NewLayer(tuple(in_layer_order(entries)))
