"""The write-ahead journal that makes a multi-file write all or nothing, across crashes and faults.

Protocol (redo logging, the decision is one file):
1. `<target>/.patchkit-journal/intent.json` names every file (path relative to the target), the sha256 of
   its old and new bytes and its mode. It is written to a temporary name, fsynced and renamed, so it
   is whole or absent.
2. Each file's new bytes go to `.<name>.patchkit-new` beside it (same directory: the rename is atomic),
   fsynced, and the directories fsynced. No target file has been touched yet.
3. The commit record `commit` (the sha256 of intent.json) appears by an atomic rename. Its presence
   alone decides: without it, recovery removes the new copies and the journal and touches no target
   file; with it, recovery rolls every file forward by renaming its new copy into place.
4. Each step of roll-forward checks the file first (new already: skip; old: rename; anything else:
   stop), so recovery itself can be killed at any point and finished by the next run.
5. Clean-up removes the commit record first, then the rest: a journal without a commit record never
   makes recovery touch a target file.
Recovery trusts nothing it reads: the journal must be a real directory holding only these names, every
path is relative, normalised and walked without following a symlink, each new copy must hash to the
recorded sha256, and the journal is refused (and nothing touched) when any of that does not hold.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
from dataclasses import dataclass
from pathlib import PurePosixPath

from patchkit.errors import PatchkitError
from patchkit.patching import fsops
from patchkit.patching.fsops import Dir

JOURNAL_DIR = ".patchkit-journal"
INTENT, COMMIT = "intent.json", "commit"
KNOWN = {INTENT, COMMIT, f"{INTENT}.tmp", f"{COMMIT}.tmp"}
NEW_SUFFIX = ".patchkit-new"
FORMAT = 1
MAX_INTENT = 1 << 20  # bytes: a journal names a few dozen files
_SHA = re.compile(r"[0-9a-f]{64}")


class JournalError(PatchkitError):
    """The journal cannot be trusted or finished; it is left exactly as found (exit 2). `where` the
    journal file, directory or target file concerned (None for a path the journal names), `problem` one
    of "invalid-path", "not-json", "format", "entry", "twice" (a file named twice), "appeared" (another
    program made a journal), "new-copy" (a new copy without the committed bytes), "changed" (a file
    neither old nor new), "not-directory", "strange" (names patchkit never writes), "not-file",
    "commit-mismatch", "leftover" (a new copy no journal names); `detail` what was expected and found."""

    def __init__(self, where: str | None, problem: str, detail: str):
        self.where, self.problem, self.detail = where, problem, detail
        super().__init__(f"{where}: {detail}" if where else detail)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the target, POSIX, normalised
    old: str
    new: str
    mode: int

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def new_copy(self) -> str:
        return new_copy_name(self.name)


def new_copy_name(name: str) -> str:
    return f".{name}{NEW_SUFFIX}"


@dataclass(frozen=True)
class Recovery:
    direction: str  # "forward" | "back"
    files: list[str]

    def describe(self) -> str:
        if self.direction == "forward":
            return (f"an interrupted run had committed its writes; finished them "
                    f"({len(self.files)} file(s) rolled forward)")
        return "an interrupted run had not committed; removed its unfinished copies (no file had been changed)"


def confined(path: object) -> str:
    """`path` if it is a plain relative path inside the target, else a JournalError."""
    if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path or "\\" in path:
        raise JournalError(None, "invalid-path", f"journal names an invalid path {path!r}")
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise JournalError(None, "invalid-path", f"journal names {path!r}, which is not a plain path inside the target")
    if parts[0] == JOURNAL_DIR:
        raise JournalError(None, "invalid-path", f"journal names {path!r}, inside the journal itself")
    return path


def encode_intent(entries: list[Entry]) -> bytes:
    files = [{"path": e.path, "old": e.old, "new": e.new, "mode": e.mode} for e in entries]
    return json.dumps({"format": FORMAT, "files": files}, indent=1).encode()


def decode_intent(data: bytes, where: str) -> list[Entry]:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise JournalError(where, "not-json", f"not valid JSON ({type(e).__name__})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("files"), list):
        raise JournalError(where, "format", f"not a patchkit journal of format {FORMAT}")
    entries = []
    for item in document["files"]:
        if not isinstance(item, dict) or set(item) != {"path", "old", "new", "mode"}:
            raise JournalError(where, "entry", f"malformed entry {str(item)[:200]!r}")
        old, new, mode = item["old"], item["new"], item["mode"]
        if not all(isinstance(h, str) and _SHA.fullmatch(h) for h in (old, new)):
            raise JournalError(where, "entry", f"entry for {item['path']!r} has no valid sha256 values")
        if type(mode) is not int or not 0 <= mode <= 0o7777:
            raise JournalError(where, "entry", f"entry for {item['path']!r} has an invalid mode")
        entries.append(Entry(confined(item["path"]), old, new, mode))
    if len({e.path for e in entries}) != len(entries):
        raise JournalError(where, "twice", "names a file twice")
    return entries


def begin(root: Dir, entries: list[Entry]) -> tuple[Dir, bytes]:
    """Steps 1: the journal directory and a durable intent. Returns the open journal and its intent."""
    if fsops.lstat(root, JOURNAL_DIR) is not None:
        raise JournalError(root.at(JOURNAL_DIR), "appeared", "appeared during this run: another program is writing here")
    intent = encode_intent(entries)
    fsops.mkdir(root, JOURNAL_DIR)
    journal = fsops.open_dir(root, JOURNAL_DIR)
    try:
        fsops.create(journal, f"{INTENT}.tmp", intent)
        fsops.rename(journal, f"{INTENT}.tmp", INTENT)
        fsops.fsync_dir(journal)
        fsops.fsync_dir(root)
    except BaseException:
        journal.close()
        raise
    return journal, intent


def commit(journal: Dir, intent: bytes) -> None:
    fsops.create(journal, f"{COMMIT}.tmp", sha256(intent).encode())
    fsops.rename(journal, f"{COMMIT}.tmp", COMMIT)
    fsops.fsync_dir(journal)


def roll_forward(root: Dir, entries: list[Entry]) -> list[str]:
    """Step 4: every file to its new bytes; idempotent, so a killed roll-forward is simply run again."""
    done = []
    for entry in entries:
        parent, name = fsops.walk(root, entry.path)
        with parent:
            current, _ = fsops.read_file(parent, name)
            digest = sha256(current)
            if digest == entry.new:
                fsops.unlink(parent, entry.new_copy, missing_ok=True)  # left only if new == old elsewhere
            elif digest == entry.old:
                data, _ = fsops.read_file(parent, entry.new_copy)
                if sha256(data) != entry.new:
                    raise JournalError(parent.at(entry.new_copy), "new-copy", "does not hold the bytes the "
                                       "journal committed; the journal is kept for inspection")
                fsops.rename(parent, entry.new_copy, name)
                done.append(entry.path)
            else:
                raise JournalError(
                    parent.at(name), "changed", f"neither its pre-run nor its committed content (sha256 {digest}): "
                    "someone else changed it; the journal is kept for inspection")
            drop_stale_bytecode(parent, name)
            fsops.fsync_dir(parent)
    return done


def discard_copies(root: Dir, entries: list[Entry]) -> None:
    """Without a commit record: remove the new copies; no target file is touched."""
    for entry in entries:
        parent, _ = fsops.walk(root, entry.path)
        with parent:
            if fsops.lstat(parent, entry.new_copy) is not None:
                fsops.unlink(parent, entry.new_copy, missing_ok=True)
                fsops.fsync_dir(parent)


def finish(root: Dir, journal: Dir) -> None:
    """Step 5: the commit record first, so an interrupted clean-up never touches a target file."""
    names = set(fsops.listdir(journal))
    if COMMIT in names:
        fsops.unlink(journal, COMMIT)
        fsops.fsync_dir(journal)
    for name in sorted(names & (KNOWN - {COMMIT})):
        fsops.unlink(journal, name, missing_ok=True)
    fsops.rmdir(root, JOURNAL_DIR)
    fsops.fsync_dir(root)


def recover(root: Dir) -> Recovery | None:
    """Finish or undo what an interrupted run left, refusing (and touching nothing) where it cannot trust it."""
    found = fsops.lstat(root, JOURNAL_DIR)
    if found is None:
        return None
    where = root.at(JOURNAL_DIR)
    if not stat.S_ISDIR(found.st_mode):
        raise JournalError(where, "not-directory", f"is {fsops.kind(found.st_mode)}, not the directory patchkit makes: "
                           "refusing to read or remove it (patchkit never follows a link); inspect it and remove it by hand")
    with fsops.open_dir(root, JOURNAL_DIR) as journal:
        names = set(fsops.listdir(journal))
        strange = sorted(names - KNOWN)
        if strange:
            raise JournalError(where, "strange", f"holds {', '.join(strange)}, which patchkit never writes: "
                               "inspect it and remove it by hand")
        for name in names:
            st = fsops.lstat(journal, name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise JournalError(journal.at(name), "not-file", f"is {fsops.kind(st.st_mode)}, not a journal file")
        entries: list[Entry] = []
        if INTENT in names:
            intent, _ = fsops.read_file(journal, INTENT, limit=MAX_INTENT)
            entries = decode_intent(intent, journal.at(INTENT))
        if COMMIT in names and INTENT in names:
            record, _ = fsops.read_file(journal, COMMIT, limit=64)
            if record.decode("ascii", "replace") != sha256(intent):
                raise JournalError(journal.at(COMMIT), "commit-mismatch", f"does not belong to {journal.at(INTENT)}; "
                                   "the journal is kept for inspection")
            rolled = roll_forward(root, entries)
            finish(root, journal)
            return Recovery("forward", rolled)
        discard_copies(root, entries)
        finish(root, journal)
        return Recovery("back", [])


def drop_stale_bytecode(parent: Dir, name: str) -> None:
    """A .pyc whose recorded mtime and size happen to match must never shadow the patched source."""
    if not name.endswith(".py"):
        return
    found = fsops.lstat(parent, "__pycache__")
    if found is None or not stat.S_ISDIR(found.st_mode):
        return  # a link or file named __pycache__ is not Python's cache: nothing of ours to drop there
    stem = name[:-3]
    with fsops.open_dir(parent, "__pycache__") as cache:
        for entry in fsops.listdir(cache):
            if entry.startswith(f"{stem}.") and entry.endswith(".pyc"):
                fsops.unlink(cache, entry, missing_ok=True)
