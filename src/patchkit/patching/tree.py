"""Writing a plan into a directory tree: locked, journaled, all or nothing across any crash or fault.

`open_target` is how every command reaches a tree: it locks the target (lock.py), finishes or undoes
whatever an interrupted run left (journal.py), and yields a `Target` whose `write` applies a plan's
changes through the journal. Nothing off the shelf does journaled multi-file replacement confined to a
directory without following links, hence these modules.
"""

from __future__ import annotations

import contextlib
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.patching import fsops, journal, lock
from patchkit.patching.journal import JOURNAL_DIR, Entry, JournalError, Recovery, sha256
from patchkit.patching.planner import FileChange, Plan

__all__ = ["JOURNAL_DIR", "ChangedSinceRead", "OutsideTarget", "Recovery", "Target", "UnfinishedRun", "open_target", "read_locked", "recover", "write_changes", "write_plan"]


class OutsideTarget(PatchkitError):
    """A file to write that lies outside the target (exit 2): `path` the file, `target` the target."""

    def __init__(self, path: Path, target: Path):
        self.path, self.target = path, target
        super().__init__(f"{path} is outside the target {target}: patchkit writes only inside the target (was "
                         "the package reached through a symbolic link? name the real directory)")


class UnfinishedRun(PatchkitError):
    """A tree to read holding an interrupted run's journal (exit 2): `journal` the journal directory,
    `target` the tree, which a command that may write (status) finishes."""

    def __init__(self, journal: str, target: Path):
        self.journal, self.target = journal, target
        super().__init__(f"{journal}: an interrupted patchkit run left this tree unfinished; "
                         f"`patchkit status --target {target}` finishes it, then read it again")


class ChangedSinceRead(PatchkitError):
    """A file that no longer holds what the plan was made from (exit 2): `path`; nothing is written."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"{path} changed since it was read; nothing written, run again")


@dataclass
class Target:
    path: Path  # resolved
    root: fsops.Dir
    recovery: Recovery | None

    def write_plan(self, source, plan: Plan) -> None:
        """Write a plan's changes into the tree `source` (a DirectorySource over this target) reads."""
        self.write([(source.package_root(c.package) / c.path, c) for c in plan.changes])

    def write(self, files: list[tuple[Path, FileChange]]) -> None:
        """Replace each file's bytes with change.new; after any fault every file is old or all are new."""
        if files:
            _transact(self.root, [(self.relative(path), change) for path, change in files])

    def relative(self, path: Path) -> str:
        """`path` relative to the target, as written (the package roots are resolved, so this has no link)."""
        absolute = Path(path).absolute()
        if not absolute.is_relative_to(self.path):
            raise OutsideTarget(path, self.path)
        return journal.confined(absolute.relative_to(self.path).as_posix())


@contextlib.contextmanager
def open_target(target: Path, *, wait: float = lock.DEFAULT_WAIT) -> Iterator[Target]:
    """The target locked for this run, with any interrupted run's journal finished first."""
    path = Path(target).resolve()
    root = fsops.open_root(path)
    try:
        lock.acquire(root, wait)
        yield Target(path, root, journal.recover(root))
    finally:
        root.close()  # closing the only descriptor drops the lock


@contextlib.contextmanager
def read_locked(directory: Path, *, wait: float = lock.DEFAULT_WAIT) -> Iterator[None]:
    """A tree read without writing (check, diff): under its lock, and refused while a journal is in it,
    since only a command that may write (status, apply, revert) finishes an interrupted run."""
    path = Path(directory).resolve()
    with contextlib.closing(fsops.open_root(path)) as root:
        lock.acquire(root, wait)
        if fsops.lstat(root, JOURNAL_DIR) is not None:
            raise UnfinishedRun(root.at(JOURNAL_DIR), path)
        yield


def write_plan(target: Path, source, plan: Plan) -> None:
    """Lock `target`, recover it if needed, and write the plan (for callers that planned beforehand)."""
    with open_target(target) as t:
        t.write_plan(source, plan)


def write_changes(target: Path, files: list[tuple[Path, FileChange]]) -> None:
    with open_target(target) as t:
        t.write(files)


def recover(target: Path) -> Recovery | None:
    with open_target(target) as t:
        return t.recovery


def _transact(root: fsops.Dir, files: list[tuple[str, FileChange]]) -> None:
    entries = [_checked(root, relative, change) for relative, change in files]
    committed = False
    try:
        log, intent = journal.begin(root, entries)
        with log:
            for entry, (_, change) in zip(entries, files, strict=True):
                parent, _ = fsops.walk(root, entry.path)
                with parent:
                    fsops.create(parent, entry.new_copy, change.new, entry.mode)
                    fsops.fsync_dir(parent)
            journal.commit(log, intent)
            committed = True
            journal.roll_forward(root, entries)
            journal.finish(root, log)
    except PatchkitError as error:
        error.args = (f"{error}\n{_settle(root, committed)}",)
        raise


def _settle(root: fsops.Dir, committed: bool) -> str:
    """After a fault: what recovery makes of it at once (the fault may have been transient), else what
    the next run will do. Either way the tree ends old or new, never in between."""
    try:
        recovery = journal.recover(root)
    except PatchkitError as again:
        return (f"Recovering at once failed too ({again}); {root.at(JOURNAL_DIR)} is kept and the next patchkit "
                "command on this target finishes the recovery: every file then holds its old bytes, or, "
                "if the write had been committed, its new bytes")
    if committed or (recovery is not None and recovery.direction == "forward"):
        return "The write had been committed and is now finished: every file is new."
    return "No file was changed."


def _checked(root: fsops.Dir, relative: str, change: FileChange) -> Entry:
    """The file is a regular file reached without links and still holds what was planned from."""
    parent, name = fsops.walk(root, relative)
    with parent:
        current, mode = fsops.read_file(parent, name)
        if current != change.old:
            raise ChangedSinceRead(parent.at(name))
        leftover = journal.new_copy_name(name)
        if fsops.lstat(parent, leftover) is not None:
            raise JournalError(parent.at(leftover), "leftover", "exists but no journal names it: it is not "
                               "patchkit's to remove; inspect it and remove it by hand")
        cache = fsops.lstat(parent, "__pycache__")
        if cache is not None and not stat.S_ISDIR(cache.st_mode):
            raise fsops.WrongFileKind(parent.at("__pycache__"), fsops.kind(cache.st_mode), "a directory",
                                      "refusing to patch beside it")
    return Entry(relative, sha256(change.old), sha256(change.new), mode)
