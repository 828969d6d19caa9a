"""Writing a plan to a directory: all or nothing, even across a crash.

Each file is replaced atomically (temporary file beside it, fsync, rename, same mode). Between two
replacements the tree is briefly half-patched, so before the first write a journal is made durable in
`<target>/.patchkit-journal/`: every file's old and new sha256 and a copy of its old bytes. An error
during the writes rolls the finished files back at once; a process killed mid-way leaves the journal,
and the next patchkit run on that target rolls back before doing anything else. Nothing off the shelf
does journaled multi-file replacement, hence this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.patching.planner import FileChange, Plan

JOURNAL_DIR = ".patchkit-journal"


@dataclass(frozen=True)
class Recovery:
    rolled_back: list[str]

    def describe(self) -> str:
        return f"an interrupted run was found and rolled back ({len(self.rolled_back)} file(s) restored)"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_plan(target: Path, source, plan: Plan) -> None:
    """Write a plan's changes into the tree `source` (a DirectorySource) reads, journaled in `target`."""
    write_changes(target, [(source.package_root(c.package) / c.path, c) for c in plan.changes])


def write_changes(target: Path, files: list[tuple[Path, FileChange]]) -> None:
    """Replace each file's bytes with change.new; on any error every file is as it was."""
    for path, change in files:
        current = _read(path)
        if current != change.old:
            raise PatchkitError(f"{path} changed since it was read; nothing written, run again")
    journal = target / JOURNAL_DIR
    if journal.exists():
        raise PatchkitError(f"{journal} exists: an earlier run was interrupted; run any patchkit command to recover")
    _write_journal(journal, files)
    done: list[tuple[Path, FileChange]] = []
    try:
        for path, change in files:
            replace_file(path, change.new)
            done.append((path, change))
            _drop_stale_bytecode(path)
    except BaseException:
        for path, change in reversed(done):
            replace_file(path, change.old)
        _remove_journal(journal)
        raise
    _remove_journal(journal)


def recover(target: Path) -> Recovery | None:
    """Finish what a killed run left: roll every journaled file back to its old bytes."""
    journal = target / JOURNAL_DIR
    index = journal / "journal.json"
    if not journal.exists():
        return None
    if not index.exists():  # killed while writing the journal itself: no target file was touched yet
        _remove_journal(journal)
        return Recovery([])
    try:
        entries = json.loads(index.read_text())["files"]
    except (ValueError, KeyError) as e:
        raise PatchkitError(f"{index} is unreadable ({e}); inspect the files it names by hand") from None
    restored = []
    for i, entry in enumerate(entries):
        path = Path(entry["path"])
        current = sha256(_read(path))
        if current == entry["old"]:
            continue
        if current != entry["new"]:
            raise PatchkitError(
                f"{path} is neither its pre-run nor its patched content (sha256 {current}); "
                f"the journal in {journal} is kept for manual recovery"
            )
        old = (journal / f"{i}.old").read_bytes()
        if sha256(old) != entry["old"]:
            raise PatchkitError(f"journal copy of {path} is corrupt; kept {journal} for manual recovery")
        replace_file(path, old)
        restored.append(str(path))
    _remove_journal(journal)
    return Recovery(restored)


def replace_file(path: Path, data: bytes) -> None:
    """Atomic replacement keeping the file's mode: temp file in the same directory, fsync, rename."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".patchkit-tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_journal(journal: Path, files: list[tuple[Path, FileChange]]) -> None:
    journal.mkdir()
    entries = []
    for i, (path, change) in enumerate(files):
        _write_durable(journal / f"{i}.old", change.old)
        entries.append({"path": str(path), "old": sha256(change.old), "new": sha256(change.new)})
    # journal.json is written last: its presence means every old copy is durable.
    _write_durable(journal / "journal.json.tmp", json.dumps({"files": entries}, indent=1).encode())
    os.replace(journal / "journal.json.tmp", journal / "journal.json")
    _fsync_dir(journal)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _remove_journal(journal: Path) -> None:
    for child in journal.iterdir():
        child.unlink()
    journal.rmdir()
    _fsync_dir(journal.parent)


def _drop_stale_bytecode(path: Path) -> None:
    """A .pyc whose recorded mtime and size happen to match must never shadow the patched source."""
    if path.suffix == ".py":
        for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PatchkitError(f"{path} disappeared; nothing written") from None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
