"""One lock per target: every command that reads or writes a tree holds it, status included (it recovers).

The lock is `flock` on the target directory itself rather than on a lock file: nothing is created in the
tree (a read-only tree can still be inspected, and no file is left behind), and there is no unlink race
between a lock file's removal and a waiting run. The kernel drops it when the process dies, however it
dies. The holder's pid is read from /proc/locks (Linux), which lists every flock with its inode.
"""

from __future__ import annotations

import fcntl
import os
import time

from patchkit.errors import PatchkitError
from patchkit.patching.fsops import Dir, FilesystemError

DEFAULT_WAIT = 60.0  # seconds: a full-series apply on a slow disk takes a few
POLL = 0.05


class Locked(PatchkitError):
    """Another run holds the target for longer than this run would wait (exit 2): `path` the target,
    `holder` the pid holding the lock (None when this system does not show it), `waited` seconds."""

    def __init__(self, path: str, holder: int | None, waited: float):
        self.path, self.holder, self.waited = path, holder, waited
        who = f"pid {holder}" if holder else "a process whose pid this system does not show"
        super().__init__(f"{path} is locked by another patchkit run ({who}); waited {waited:g} s. "
                         "Try again when it has finished (or give --wait SECONDS)")


def acquire(root: Dir, wait: float = DEFAULT_WAIT) -> None:
    deadline = time.monotonic() + max(wait, 0.0)
    while True:
        try:
            fcntl.flock(root.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Locked(root.path, holder_pid(root), wait) from None
            time.sleep(POLL)
        except OSError as e:
            raise FilesystemError("lock", root.path, e.strerror or str(e), e.errno) from None


def holder_pid(root: Dir) -> int | None:
    st = os.fstat(root.fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:260072 0 EOF" (a waiter's line starts "1: ->")
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
                    return int(fields[4])
    except (OSError, ValueError):
        return None
    return None
