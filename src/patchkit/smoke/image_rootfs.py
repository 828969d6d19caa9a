"""An image's root filesystem as a container runtime lays it out, and a process run inside it.

`assemble` applies the layers of an OCI layout's linux/arm64 image bottom to top, each layer read through
the verified blob reader (digest checked at its end) and the bounded layer reader: whiteouts delete what
the layers below put there, opaque markers empty their directory, a later entry replaces an earlier one.
Every path is resolved inside the root the way the kernel resolves it inside a container (an absolute
symbolic link names a path of the image, never of this machine), so no layer can write outside it.

The layers below the top one are assembled once per chain (OCI ChainID, cached under the patchkit cache)
and each image starts from a hard-linked copy of them: entries are replaced by unlink and create, never
written in place, so a copy never changes the cached tree it shares inodes with.

`run_inside` runs a command with the root as `/` (chroot; root only), through qemu-user-static on a
machine that is not arm64 (no binfmt registration needed: the emulator is the process chroot starts).
"""

from __future__ import annotations

import hashlib
import os
import platform
import posixpath
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from patchkit.bounded_process import run_captured
from patchkit.errors import PatchkitError
from patchkit.oci.base import BaseImage
from patchkit.oci.layer import iter_layer

ARM64 = ("aarch64", "arm64")
QEMU = "qemu-aarch64-static"
HELPER_DIR = ".patchkit-proof"   # where the proof puts its own files in the assembled root (not the image's)
MAX_LINK_HOPS = 40               # the kernel's own limit on symbolic links in one path


class RootfsError(PatchkitError):
    """The image cannot be assembled or run here (exit 2): `what` the step was at (an image path, the layer
    cache, the image, the runner), `why` it cannot go on."""

    def __init__(self, what: str, why: str):
        super().__init__(f"{what}: {why}")
        self.what, self.why = what, why


@dataclass
class Rootfs:
    root: Path
    image: BaseImage
    layers: list[str]           # the layer digests applied, bottom first
    reused: int                 # how many of them came from the cached chain


def chain_id(diff_ids: list[str]) -> str:
    """The OCI ChainID of a stack of layers (image-spec config.md)."""
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


def _inside(root: Path, name: str, follow_last: bool = False) -> Path:
    """`name` (an image path) as a path under `root`, every symbolic link on the way resolved inside the
    root; the last component itself is not followed unless `follow_last`."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        if (parts or follow_last) and here.is_symlink():
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise RootfsError(f"image path /{name}", f"more than {MAX_LINK_HOPS} symbolic links")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(part)
    return root.joinpath(*done)


def _remove(path: Path) -> None:
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def apply_layer(image: BaseImage, desc: dict, root: Path) -> None:
    """One layer onto `root`, as the overlay a runtime mounts would show it."""
    what = f"{image.spec} layer {desc['digest']}"
    stream = image.open_blob(desc["digest"], desc["size"])
    for member, tar, info in iter_layer(stream, what):
        if member.kind == "opaque":
            folder = _inside(root, member.name, follow_last=True)
            for child in folder.iterdir() if folder.is_dir() else []:
                _remove(child)
            continue
        head, tail = posixpath.split(member.name)
        target = _inside(root, head, follow_last=True) / tail
        if member.kind == "whiteout":
            _remove(target)
            continue
        if member.kind == "dir":
            if not target.is_dir() or target.is_symlink():
                _remove(target)
                target.mkdir(parents=True)
            os.chmod(target, member.mode & 0o7777)
            continue
        _remove(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.kind == "file":
            source = tar.extractfile(info)
            assert source is not None
            with open(target, "xb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.chmod(target, member.mode & 0o7777)
        elif member.kind == "symlink":
            os.symlink(member.linkname, target)
        elif member.kind == "hardlink":
            os.link(_inside(root, member.linkname), target)
        # devices and fifos: nothing a Python import reads; a runtime would create them, the proof need not
    stream.finish()


def _copy_tree(cached: Path, dest: Path) -> None:
    """A cached tree into `dest` as hard links (cp -al: metadata only), its completion mark left out."""
    proc = subprocess.run(["cp", "-al", f"{cached}/.", str(dest)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RootfsError(f"copying the cached layers {cached} into {dest}", proc.stderr.strip())
    (dest / ".complete").unlink()


def assemble(image: BaseImage, dest: Path, cache: Path) -> Rootfs:
    """`image`'s root filesystem at `dest` (which must not exist): the cached chain of all its layers but
    the top one, hard-linked, then the top layer applied."""
    layers = image.layers
    diff_ids = list(image.config.get("rootfs", {}).get("diff_ids") or [])
    if len(diff_ids) != len(layers) or not layers:
        raise RootfsError(image.spec, f"{len(layers)} layers but {len(diff_ids)} diff_ids in its config")
    below = len(layers) - 1
    reused = 0
    if below:
        chain = cache / chain_id(diff_ids[:below]).removeprefix("sha256:")
        if not (chain / ".complete").is_file():
            partial = chain.with_name(chain.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            # the longest shorter chain already cached (the base of a base, the stock image's lower
            # layers) is the start: only the layers above it are applied
            start = next((k for k in range(below - 1, 0, -1)
                          if (cache / chain_id(diff_ids[:k]).removeprefix("sha256:") / ".complete").is_file()), 0)
            if start:
                _copy_tree(cache / chain_id(diff_ids[:start]).removeprefix("sha256:"), partial)
            for desc in layers[start:below]:
                apply_layer(image, desc, partial)
            (partial / ".complete").touch()
            shutil.rmtree(chain, ignore_errors=True)
            partial.rename(chain)
        dest.mkdir(parents=True)
        _copy_tree(chain, dest)
        reused = below
    else:
        dest.mkdir(parents=True)
    apply_layer(image, layers[-1], dest)
    return Rootfs(dest, image, [d["digest"] for d in layers], reused)


def emulator() -> str | None:
    """The qemu-user binary that runs arm64 code here, None on an arm64 machine."""
    if platform.machine().lower() in ARM64:
        return None
    found = shutil.which(QEMU)
    if found is None:
        raise RootfsError(QEMU, f"not found: this machine is {platform.machine()}, and the image's arm64 code "
                          "runs here only under qemu-user (Debian: apt-get install qemu-user-static)")
    return found


def run_inside(root: Path, argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 1800,
               qemu: str | None = None) -> subprocess.CompletedProcess:
    """`argv` run with `root` as `/`, under `qemu` when given (copied into the root's helper folder)."""
    chroot = shutil.which("chroot") or shutil.which("chroot", path="/usr/sbin:/sbin")
    if os.geteuid() != 0 or chroot is None:
        raise RootfsError("running inside an assembled image", "needs chroot(8) and root (CI and these machines run as root)")
    prefix: list[str] = []
    if qemu:
        helper = root / HELPER_DIR
        helper.mkdir(exist_ok=True)
        inside = helper / "qemu-aarch64"
        if not inside.is_file():
            shutil.copy2(qemu, inside)
            inside.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        prefix = [f"/{HELPER_DIR}/qemu-aarch64"]
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root",
                "PYTHONDONTWRITEBYTECODE": "1"}  # the run leaves the image's files as they were
    # A container gets /dev and /proc from its runtime (torch reads /dev/urandom as it loads): here a
    # private mount namespace binds this machine's /dev and mounts a proc, gone when the process ends.
    for name in ("dev", "proc"):
        (root / name).mkdir(exist_ok=True)
    mounts = [f"mount --bind /dev {shlex.quote(str(root / 'dev'))}", f"mount -t proc proc {shlex.quote(str(root / 'proc'))}"]
    script = " && ".join([*mounts, 'exec "$@"'])
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", chroot, str(root), *prefix, *argv]
    # what it started dies with it at the timeout (its process group)
    finished = run_captured(command, timeout=timeout, env={**base_env, **(env or {})}, stderr_apart=True)
    if finished.timed_out:
        raise RootfsError(f"{' '.join(argv[:3])} inside {root}", f"ran past {timeout:.0f} s")
    return subprocess.CompletedProcess(command, finished.code, finished.output, finished.errors)

