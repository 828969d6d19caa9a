"""`patchkit record`: a hand-edited vLLM tree's difference from its original, written as a patch's edits.

Why line hunks grown to the shortest unique anchor: an edit is only as trustworthy as its anchor, and the
planner asserts each anchor's exact count against the text as the earlier edits left it. So each hunk of
a line diff becomes one edit whose anchor is the fewest whole lines around it that occur exactly once in
that text (an insertion anchors on the lines before it, a deletion or change replaces its own lines plus
what makes them unique), growing only into unchanged lines between hunks, so no edit rewrites another's
text. The result is proven, not trusted: the recorded patch is planned onto ORIGINAL and must give
EDITED byte for byte, or nothing is written. New or removed files cannot be anchored and are refused.

The TOML writers here (`toml_string`, `edit_block`) are also rebase's: one way edits become text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import itertools
import json
import operator
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from packaging.specifiers import SpecifierSet

from patchkit.errors import PatchFailed, PatchkitError
from patchkit.localfiles import atomic_write
from patchkit.patching.fsops import WrongFileKind, kind
from patchkit.patching.patchset import Action, Edit, InvalidPatchFile, Patch, applied_form, load_patch
from patchkit.sources.base import PACKAGES
from patchkit.sources.directory import DirectorySource
from patchkit.untrusted import read_file

LONG_TEXT_LINES = 20  # a text longer than this goes to a file beside patch.toml, as the hand-written patches do
EDIT_HEADER = "[[edit]]"
MAX_CONTEXT = 40  # lines of context an anchor may grow by before its hunk is merged with the next


class Unrecordable(PatchFailed):
    """A difference anchored edits cannot say (exit 1): `path` the edited tree or the file ("vllm/x.py"),
    `problem` "nothing" (no difference), "files" (files added or removed), "encoding" (not UTF-8),
    "crlf", "no-anchor" (no unique anchor around a change), `detail` what was found."""

    def __init__(self, path: Path | str, problem: str, detail: str):
        self.path, self.problem, self.detail = str(path), problem, detail
        super().__init__(f"{path}: {detail}")


class RecordNotProven(PatchFailed):
    """A recorded patch that does not reproduce the edited tree, so nothing is written (exit 1): `original`
    and `edited` the trees, `problem` "does-not-apply", "differs" (a file not byte for byte) or
    "other-files", `detail` the planner's diagnostic or the file."""

    def __init__(self, original: Path, edited: Path, problem: str, detail: str):
        self.original, self.edited, self.problem, self.detail = original, edited, problem, detail
        super().__init__(f"the recorded patch {detail}")


class PackageInOneTree(PatchkitError):
    """A package only one of the two trees holds: they are not one release edited (exit 2). `package`,
    `original` and `edited` the trees."""

    def __init__(self, package: str, original: Path, edited: Path):
        self.package, self.original, self.edited = package, original, edited
        super().__init__(f"package {package} is in only one of {original} and {edited}")


@dataclass(frozen=True)
class RecordedEdit:
    """An edit as it is to be written into patch.toml (by `patchkit record` or the rebase): patchset.Edit's
    fields before the patch is loaded back, and where its text goes. A changed copy is `dataclasses.replace`d,
    never rebuilt field by field.

    Why not Edit itself: an Edit is what the loader made of written text, a RecordedEdit the text to write.
    It has no `index` yet (its place is known once patch.toml is read back), its `versions` is the range as
    it is to be written (an Edit's SpecifierSet prints its specifiers re-ordered, which would rewrite a
    hand-written range) and `text_file` says where a long text goes, which the loader reads and forgets.
    Every other field is Edit's, with Edit's type: tests/test_record.py fails when either gains, loses or
    renames one without the other."""

    package: str
    candidates: tuple[str, ...]
    action: Action
    anchor: str
    text: str
    count: int = 1
    versions: str | None = None
    text_file: str | None = None  # set when the text is written beside patch.toml

    @classmethod
    def placed(cls, edit: Edit, candidates: tuple[str, ...], anchor: str, text: str) -> RecordedEdit:
        """`edit` placed anew (its package, action and count) at `candidates`, its range left unset."""
        return cls(edit.package, candidates, edit.action, anchor, text, edit.count)

    @property
    def applied_form(self) -> str:
        return applied_form(self.action, self.anchor, self.text)

    def reads_back_as(self, loaded: Edit) -> bool:
        """Whether `loaded`, an Edit the loader made of patch.toml, is this edit as it was written: every
        field the two share compared (READ_BACK), the rebase's read-back check."""
        return all(same(getattr(self, name), getattr(loaded, name)) for name, same in READ_BACK.items())


# How each field RecordedEdit shares with Edit reads back, field by field; the fields only one of them has are
# NOT_READ_BACK. tests/test_record.py fails when either model gains a field neither names.
READ_BACK: dict[str, Callable[[Any, Any], bool]] = {
    "package": operator.eq,
    "action": operator.eq,
    "anchor": operator.eq,
    "text": operator.eq,
    "count": operator.eq,
    "candidates": lambda written, loaded: set(written) <= set(loaded),  # each written file among the loaded
    # unset: the edit keeps the range its table had (a moved edit's own, or none: the patch's)
    "versions": lambda written, loaded: not written or SpecifierSet(written) == loaded,
}
NOT_READ_BACK = {"index": "known once patch.toml is read back", "text_file": "where a text is written; read and forgotten"}


class RecordedEditRecord(msgspec.Struct, kw_only=True):
    """One recorded edit in `patchkit record --json`: where and what, its texts as line counts."""

    package: str
    file: str | list[str]  # the one candidate, or every candidate
    action: Action
    count: int
    anchor_lines: int
    text_lines: int
    text_file: str | None  # the file beside patch.toml its text is written to


class RecordingRecord(msgspec.Struct, kw_only=True):
    """`patchkit record --json`, declared once: the command writes it and words its text output from it."""

    patch: str
    edits: list[RecordedEditRecord]
    written: bool  # --write: patch.toml and its text files were rewritten
    proven: bool  # always true: a recording that does not reproduce the edited tree is an error, not a record

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


@dataclass
class Recording:
    patch_id: str
    edits: list[RecordedEdit]
    files: dict[str, str] = field(default_factory=dict)  # text file name -> text
    toml: str = ""

    def record(self, *, written: bool) -> RecordingRecord:
        return RecordingRecord(patch=self.patch_id, written=written, proven=True, edits=[
            RecordedEditRecord(package=e.package, file=e.candidates[0] if len(e.candidates) == 1 else list(e.candidates),
                               action=e.action, count=e.count, anchor_lines=e.anchor.count("\n"),
                               text_lines=e.text.count("\n"), text_file=e.text_file) for e in self.edits])


# ---------------------------------------------------------------------------------------------- TOML text

def toml_string(value: str) -> str:
    """A TOML string that reads back as exactly `value`: a multi-line literal where it can be, else basic."""
    if "\n" in value and "'''" not in value and not value.startswith("\n") and not value.endswith("'") \
            and all(c in "\n\t" or (ord(c) >= 0x20 and c != "\x7f") for c in value):
        return "'''" + value + "'''"
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def edit_block(edit: RecordedEdit, *, comment: str = "") -> str:
    """One [[edit]] table, in the key order of the hand-written patches."""
    lines = [f"# {line}".rstrip() for line in comment.splitlines()] + [EDIT_HEADER]
    if edit.package != "vllm":
        lines.append(f"package = {toml_string(edit.package)}")
    if edit.versions:
        lines.append(f"versions = {toml_string(edit.versions)}")
    if len(edit.candidates) == 1:
        lines.append(f"file = {toml_string(edit.candidates[0])}")
    else:
        lines.append("files = [" + ", ".join(toml_string(c) for c in edit.candidates) + "]")
    lines.append(f"action = {toml_string(edit.action)}")
    lines.append(f"anchor = {toml_string(edit.anchor)}")
    if edit.count != 1:
        lines.append(f"count = {edit.count}")
    if edit.action != Action.ASSERT:
        if edit.text_file:
            lines.append(f"text_file = {toml_string(edit.text_file)}")
        else:
            lines.append(f"text = {toml_string(edit.text)}")
    return "\n".join(lines) + "\n"


def split_edits(toml_text: str, where: str, edits: int) -> tuple[str, list[str]]:
    """patch.toml as its head (everything before the first [[edit]] and that edit's comments) and one
    chunk per [[edit]] table (its leading comments, its keys, the blank lines after it). `edits` is how
    many tables the file parsed to: a header written otherwise (`[[ edit ]]`, a comment after it) would
    merge two tables' chunks, and the edits would be paired with the wrong text."""
    lines = toml_text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.rstrip("\n") == EDIT_HEADER]
    if not headers:
        raise InvalidPatchFile(where, None, "no-edit", "no [[edit]] table found")
    if len(headers) != edits:
        raise InvalidPatchFile(where, None, "edit-header", f"{edits} [[edit]] tables, {len(headers)} of them "
                               f"headed by a line that is exactly {EDIT_HEADER}: patchkit rewrites only such tables")
    starts = []
    for h in headers:  # a table's own comment lines directly above it travel with it
        s = h
        while s > 0 and lines[s - 1].startswith("#"):
            s -= 1
        starts.append(s)
    head = "".join(lines[: starts[0]])
    chunks = ["".join(lines[s:e]) for s, e in itertools.pairwise([*starts, len(lines)])]
    return head, chunks


def text_file_name(patch: Patch, path: str, taken: set[str]) -> str:
    """A fresh name for a long text beside patch.toml: `<file>.txt`, numbered when taken."""
    base = Path(path).name
    name, n = f"{base}.txt", 1
    while name in taken or (patch.folder / name).exists():
        n += 1
        name = f"{base}.{n}.txt"
    taken.add(name)
    return name


@contextlib.contextmanager
def trial_patch(folder: Path, toml_text: str, files: dict[str, str]):
    """The patch as it would be after a write, loaded from a scratch copy of its folder: checked before
    anything in the real folder changes."""
    with tempfile.TemporaryDirectory(prefix="patchkit-trial-") as tmp:
        trial = Path(tmp) / folder.name
        shutil.copytree(folder, trial)
        for name, text in files.items():
            (trial / name).write_text(text, encoding="utf-8")
        (trial / "patch.toml").write_text(toml_text, encoding="utf-8")
        yield load_patch(trial / "patch.toml")


def write_patch_folder(folder: Path, toml_text: str, files: dict[str, str]) -> None:
    """Text files first, patch.toml last, each atomically: a crash leaves the old patch.toml in force."""
    for name, text in files.items():
        atomic_write(folder / name, text.encode("utf-8"))
    atomic_write(folder / "patch.toml", toml_text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------- recording

def _tree_files(root: Path) -> dict[str, Path]:
    """Regular files below a package root, relative POSIX paths (bytecode left out). A link, FIFO, socket
    or device is refused by name: what it stands for is not a file an anchored edit can describe."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            if (Path(dirpath) / d).is_symlink():
                raise WrongFileKind(str(Path(dirpath) / d), "a symbolic link", "a directory",
                                    "record reads real directories only")
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith((".pyc", ".pyo")):
                continue
            mode = path.lstat().st_mode
            if not stat.S_ISREG(mode):
                raise WrongFileKind(str(path), kind(mode), "a regular file", "record reads regular files only")
            out[path.relative_to(root).as_posix()] = path
    return out


def changed_files(original: Path, edited: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(package, path) -> (original text, edited text) for every file that differs; refuses what an anchored
    edit cannot say (a file added or removed, a file that is not UTF-8 text)."""
    old_src, new_src = DirectorySource(original), DirectorySource(edited)
    out = {}
    for package in PACKAGES:
        if package not in old_src.versions() and package not in new_src.versions():
            continue
        if package not in old_src.versions() or package not in new_src.versions():
            raise PackageInOneTree(package, original, edited)
        old_root, new_root = old_src.package_root(package), new_src.package_root(package)
        old_files, new_files = _tree_files(old_root), _tree_files(new_root)
        added = sorted(set(new_files) - set(old_files))
        removed = sorted(set(old_files) - set(new_files))
        if added or removed:
            raise Unrecordable(edited, "files", f"adds {[f'{package}/{p}' for p in added]} and removes "
                               f"{[f'{package}/{p}' for p in removed]} against {original}: a patch edits existing "
                               "files by anchor; add or remove files another way")
        for path in sorted(old_files):
            old = read_file(old_files[path], "member")
            new = read_file(new_files[path], "member")
            if old == new:
                continue
            try:
                out[(package, path)] = (old.decode("utf-8"), new.decode("utf-8"))
            except UnicodeDecodeError:
                raise Unrecordable(f"{package}/{path}", "encoding",
                                   "differs and is not UTF-8 text: it cannot be recorded as edits") from None
            if "\r\n" in out[(package, path)][0]:
                raise Unrecordable(f"{package}/{path}", "crlf", "has CRLF line endings; anchors are LF")
    return out


def _hunks(old: list[str], new: list[str]) -> list[tuple[int, int, int, int]]:
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in
            difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if tag != "equal"]


def record_file(package: str, candidates: tuple[str, ...], old_text: str, new_text: str) -> list[RecordedEdit]:
    """The edits that turn old_text into new_text, each with the shortest unique whole-line anchor."""
    old, new = old_text.splitlines(keepends=True), new_text.splitlines(keepends=True)
    hunks = _hunks(old, new)
    edits: list[RecordedEdit] = []
    done: list[tuple[int, int, int, int]] = []  # the applied hunks, context included
    k = 0
    while k < len(hunks):
        low = done[-1][1] if done else 0  # unchanged lines this hunk may grow into, up to the last edit's end
        high = hunks[k + 1][0] if k + 1 < len(hunks) else len(old)
        working = "".join(_apply_prefix(old, new, done) + old[low:])
        grown = _grow(package, candidates, old, new, hunks[k], low, high, working)
        if grown is None:
            if k + 1 >= len(hunks):
                raise Unrecordable(f"{package}/{candidates[0]}", "no-anchor", f"no unique anchor around line {hunks[k][0] + 1}")
            i1, _, j1, _ = hunks[k]
            _, i2, _, j2 = hunks[k + 1]  # merge with the next hunk and try again: one larger edit
            hunks[k : k + 2] = [(i1, i2, j1, j2)]
            continue
        edit, span = grown
        edits.append(edit)
        done.append(span)
        k += 1
    return edits


def _apply_prefix(old, new, done) -> list[str]:
    """The lines of the file after the `done` hunks are applied, up to the end of the last of them."""
    out, at = [], 0
    for i1, i2, j1, j2 in done:
        out += old[at:i1] + new[j1:j2]
        at = i2
    return out


def _grow(package, candidates, old, new, hunk, low, high, working):
    """The smallest context (before, after) that makes the hunk's edit unique in `working`, with the span of
    old/new lines it covers; None when growing to the neighbours is not enough."""
    i1, i2, j1, j2 = hunk
    changed_old, changed_new = "".join(old[i1:i2]), "".join(new[j1:j2])
    for total in range(min((i1 - low) + (high - i2), MAX_CONTEXT) + 1):
        for before in range(min(total, i1 - low), -1, -1):
            after = total - before
            if after > high - i2:
                continue
            pre, post = "".join(old[i1 - before : i1]), "".join(old[i2 : i2 + after])
            if i1 == i2 and pre and not post:
                action, anchor, text = Action.INSERT_AFTER, pre, changed_new
            elif i1 == i2 and post and not pre:
                action, anchor, text = Action.INSERT_BEFORE, post, changed_new
            elif i1 != i2 or (pre and post):
                action, anchor, text = Action.REPLACE, pre + changed_old + post, pre + changed_new + post
            else:
                continue
            if not anchor or not text or anchor == text or (action != Action.REPLACE and anchor in text):
                continue
            applied = applied_form(action, anchor, text)
            if working.count(anchor) != 1 or working.count(applied) != 0:
                continue
            result = working.replace(anchor, applied)
            if result.count(applied) != 1 or (action != Action.REPLACE and result.count(anchor) != 1):
                continue
            span = (i1 - before, i2 + after, j1 - before, j2 + after)
            return RecordedEdit(package, candidates, action, anchor, text), span
    return None


def record(patch: Patch, original: Path, edited: Path, *, versions: dict[str, str] | None = None) -> Recording:
    """The patch's edits for ORIGINAL's release recorded from EDITED, proven to reproduce it (`versions`:
    the release a dev-build tree is to be taken for, as --assume-version)."""
    changes = changed_files(original, edited)
    if not changes:
        raise Unrecordable(edited, "nothing", f"does not differ from {original}: nothing to record")
    source = DirectorySource(original)
    versions = {**source.versions(), **(versions or {})}
    # Other releases' and packages' edits, and the asserts (invariants, which no diff shows), stay as written.
    keep = [e for e in patch.edits if e.action == Action.ASSERT or not e.for_release(versions)]  # a package the tree lacks: not this recording's
    known = {c: e.candidates for e in patch.edits for c in e.candidates}
    edits: list[RecordedEdit] = []
    files: dict[str, str] = {}
    taken: set[str] = set()
    for (package, path), (old_text, new_text) in changes.items():
        candidates = known.get(path, (path,))
        for e in record_file(package, candidates if path in candidates else (path,), old_text, new_text):
            if e.text.count("\n") > LONG_TEXT_LINES:
                name = text_file_name(patch, path, taken)
                files[name] = e.text
                e = dataclasses.replace(e, text_file=name)
            edits.append(e)
    toml_text = _rewrite_edits(patch, edits, keep)
    with trial_patch(patch.folder, toml_text, files) as candidate:
        _prove(candidate, source, original, edited, set(changes), versions)
    return Recording(patch.id, edits, files, toml_text)


def _prove(candidate: Patch, source: DirectorySource, original: Path, edited: Path, changed: set,
           versions: dict[str, str]) -> None:
    """Planned onto ORIGINAL, the recorded patch gives EDITED byte for byte, and touches nothing else."""
    from patchkit.patching import planner  # the proof uses the one planner that applies patches

    result = planner.plan([candidate], source, versions=versions)
    if not result.ok:
        raise RecordNotProven(original, edited, "does-not-apply",
                              f"does not apply to {original}:\n" + result.result(candidate.id).describe())
    edited_source = DirectorySource(edited)
    for change in result.changes:
        if change.new != read_file(edited_source.package_root(change.package) / change.path, "member"):
            raise RecordNotProven(original, edited, "differs", f"applied to {original} does not give {edited}'s "
                                  f"{change.package}/{change.path} byte for byte")
    if {(c.package, c.path) for c in result.changes} != changed:
        raise RecordNotProven(original, edited, "other-files", f"changes other files than {edited} does")


def write_recording(patch: Patch, recording: Recording) -> None:
    write_patch_folder(patch.folder, recording.toml, recording.files)


def _rewrite_edits(patch: Patch, edits: list[RecordedEdit], keep: list[Edit]) -> str:
    """patch.toml with the in-range edits replaced by the recorded ones; other releases' edits kept as written."""
    toml_path = patch.folder / "patch.toml"
    head, chunks = split_edits(read_file(toml_path, "definition").decode("utf-8"), str(toml_path), len(patch.edits))
    kept = [chunks[e.index - 1] for e in keep]
    body = "\n".join(edit_block(e, comment="recorded by patchkit record") for e in edits)
    return head + body + ("\n" + "".join(kept) if kept else "")
