"""Every filesystem operation of the write path: relative to directory descriptors, never through a symlink.

A path inside the target is walked one component at a time with O_NOFOLLOW, so a symlinked directory or
file anywhere below the target stops the run before it writes (the target itself is what the user named
and may be reached through a link). Every mutating step and every fsync goes through `_step`, the one
seam the tests use to count the steps of apply, revert and recovery and to inject a crash or an I/O
error at the k-th (tests/test_transactions_faults.py). OSErrors leave this module as `FilesystemError`
naming the path, and a file or directory of the wrong kind as `WrongFileKind`: both exit 2.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from patchkit.errors import PatchkitError

# Tests only: called as HOOK(op, path) before each counted step; may raise OSError or end the process.
HOOK: Callable[[str, str], None] | None = None

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted where a file should be must not hang; fstat then refuses it.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFREG: "a file"}


class FilesystemError(PatchkitError):
    """An operation on the target failed (permissions, full or read-only disk) (exit 2): `operation` what
    patchkit could not do ("read", "create", "replace", "lock"...), `path` on what, `reason` why (the
    system's words), `errno` the system's error number (None when patchkit itself refused)."""

    def __init__(self, operation: str, path: str, reason: str, errno: int | None = None):
        self.operation, self.path, self.reason, self.errno = operation, path, reason, errno
        super().__init__(f"cannot {operation} {path}: {reason}")


class WrongFileKind(PatchkitError):
    """A path in the target that is not the kind of file patchkit reads or writes there (exit 2): `path`,
    `found` what it is ("a symbolic link", "a FIFO", "missing"...), `expected` what it must be ("a
    directory", "a regular file"), `why` what patchkit does about it ("" when the two say enough)."""

    def __init__(self, path: str, found: str, expected: str, why: str = ""):
        self.path, self.found, self.expected, self.why = path, found, expected, why
        super().__init__(f"{path} is {found}, not {expected}" + (f": {why}" if why else ""))


def kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _step(op: str, where: str) -> None:
    if HOOK is not None:
        HOOK(op, where)


def _fail(what: str, where: str, error: OSError) -> FilesystemError:
    reason = error.strerror or str(error)
    if error.errno == errno.ELOOP:
        reason = "it is a symbolic link (or a loop of them); patchkit never writes through one"
    return FilesystemError(what, where, reason, error.errno)


class Dir:
    """An open directory and the path shown for it in messages."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    def at(self, name: str) -> str:
        return f"{self.path}/{name}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_root(path: Path) -> Dir:
    try:
        return Dir(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), str(path))
    except OSError as e:
        raise _fail("open the target directory", str(path), e) from None


def open_dir(parent: Dir, name: str) -> Dir:
    where = parent.at(name)
    try:
        return Dir(os.open(name, _DIR_FLAGS, dir_fd=parent.fd), where)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            found = lstat(parent, name)
            raise WrongFileKind(where, kind(found.st_mode) if found else "missing", "a directory",
                                "patchkit never follows a symbolic link inside the target") from None
        raise _fail("open", where, e) from None


def walk(root: Dir, relative: str) -> tuple[Dir, str]:
    """The directory holding `relative` (opened component by component, no symlinks) and the file name."""
    parts = PurePosixPath(relative).parts
    current = Dir(os.dup(root.fd), root.path)
    try:
        for part in parts[:-1]:
            nxt = open_dir(current, part)
            current.close()
            current = nxt
    except BaseException:
        current.close()
        raise
    return current, parts[-1]


def lstat(d: Dir, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _fail("inspect", d.at(name), e) from None


def read_file(d: Dir, name: str, *, limit: int | None = None) -> tuple[bytes, int]:
    """(bytes, permission bits) of a regular file, not through a symlink."""
    where = d.at(name)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=d.fd)
    except OSError as e:
        raise _fail("read", where, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WrongFileKind(where, kind(st.st_mode), "a regular file")
        if limit is not None and st.st_size > limit:
            raise FilesystemError("read", where, f"it is {st.st_size} bytes, more than patchkit ever writes there ({limit})")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), stat.S_IMODE(st.st_mode)
    except OSError as e:
        raise _fail("read", where, e) from None
    finally:
        os.close(fd)


def create(d: Dir, name: str, data: bytes, mode: int = 0o644) -> None:
    """A new file (never an existing one) holding `data`, durable before this returns."""
    where = d.at(name)
    try:
        _step("create", where)
        fd = os.open(name, _CREATE_FLAGS, mode & 0o777, dir_fd=d.fd)
    except OSError as e:
        raise _fail("create", where, e) from None
    try:
        view = memoryview(data)
        _step("write", where)
        while view:
            view = view[os.write(fd, view):]
        _step("chmod", where)
        os.fchmod(fd, mode)  # the umask must not change a patched file's mode
        _step("fsync", where)
        os.fsync(fd)
    except OSError as e:
        raise _fail("write", where, e) from None
    finally:
        os.close(fd)


def rename(d: Dir, src: str, dst: str) -> None:
    """Atomically replace `dst` by `src`, both in directory `d` (a rename never follows a link)."""
    try:
        _step("rename", d.at(dst))
        os.replace(src, dst, src_dir_fd=d.fd, dst_dir_fd=d.fd)
    except OSError as e:
        raise _fail("replace", d.at(dst), e) from None


def unlink(d: Dir, name: str, *, missing_ok: bool = False) -> None:
    try:
        _step("unlink", d.at(name))
        os.unlink(name, dir_fd=d.fd)
    except FileNotFoundError:
        if not missing_ok:
            raise _fail("remove", d.at(name), FileNotFoundError(errno.ENOENT, "no such file")) from None
    except OSError as e:
        raise _fail("remove", d.at(name), e) from None


def mkdir(d: Dir, name: str) -> None:
    try:
        _step("mkdir", d.at(name))
        os.mkdir(name, 0o700, dir_fd=d.fd)
    except OSError as e:
        raise _fail("create directory", d.at(name), e) from None


def rmdir(d: Dir, name: str) -> None:
    try:
        _step("rmdir", d.at(name))
        os.rmdir(name, dir_fd=d.fd)
    except OSError as e:
        raise _fail("remove directory", d.at(name), e) from None


def fsync_dir(d: Dir) -> None:
    try:
        _step("fsync", d.path)
        os.fsync(d.fd)
    except OSError as e:
        raise _fail("flush", d.path, e) from None


def listdir(d: Dir) -> list[str]:
    try:
        return os.listdir(d.fd)
    except OSError as e:
        raise _fail("list", d.path, e) from None
