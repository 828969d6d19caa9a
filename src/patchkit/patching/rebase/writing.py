"""Writing a rebase: each patch's proposals as patch.toml text (written as the hand-written patches are:
a file that only moved gets its new path as one more candidate; a changed anchor is an edit-level version
split, the old edit keeping the releases below the new one), and the write itself.

Per patch: a patch whose every check passed (checks.py) is written, atomically (its text files first,
then patch.toml, each through localfiles' adjacent temporary file: a crash leaves the old patch.toml in
force); a patch with an edit that needs a person, or a failed check, keeps its range and files as they
were. Nothing outside patches/<id>/ is written.
"""

from __future__ import annotations

import dataclasses
import textwrap
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

from patchkit.patching.patchset import folder_digest
from patchkit.patching.rebase.model import PatchRebase, ProposalKind, Rebase, RebaseRefused
from patchkit.patching.record import (
    LONG_TEXT_LINES,
    edit_block,
    split_edits,
    text_file_name,
    toml_string,
    write_patch_folder,
)
from patchkit.untrusted import read_file


def write(rebase_result: Rebase, patches_dir: Path) -> list[str]:
    """Every writable patch (`Rebase.writable`: its checks passed) written into patches_dir/<id>/ as it was
    checked; the others left as they are. The ids written."""
    for r in rebase_result.writable:
        if r.rendered is None:
            raise RebaseRefused(r.patch.id, "read-back", "a writable patch was never rendered and checked; "
                                "nothing written (a patchkit bug: please report it)")
        if folder_digest(patches_dir / r.patch.id) != r.patch.digest:
            raise RebaseRefused(r.patch.id, "changed", f"{patches_dir / r.patch.id} changed since the rebase read "
                                "it; nothing written (run the rebase again)")
    written = []
    for r in rebase_result.writable:
        assert r.rendered is not None
        toml_text, files = r.rendered
        write_patch_folder(patches_dir / r.patch.id, toml_text, files)
        r.written = True
        written.append(r.patch.id)
    return written


def put(folder: Path, rendered: tuple[str, dict[str, str]]) -> None:
    """A rendered patch into a scratch folder (a trial copy): text files, then patch.toml."""
    toml_text, files = rendered
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "patch.toml").write_text(toml_text, encoding="utf-8")


def render(result: PatchRebase) -> tuple[str, dict[str, str]]:
    """The rebased patch.toml and the text files beside it (only what changed is new), from the patch's
    own patch.toml: its other tables and comments kept as written."""
    patch = result.patch
    toml_path = patch.folder / "patch.toml"
    head, chunks = split_edits(read_file(toml_path, "definition").decode("utf-8"), str(toml_path), len(patch.edits))
    files: dict[str, str] = {}
    taken: set[str] = set()
    if result.new_range:
        package, old_spec, new_spec = result.new_range
        lines = head.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines)
              if line.startswith(f"{package} =") and _spec_line(line) == SpecifierSet(old_spec)]
        if len(at) != 1:
            raise RebaseRefused(patch.id, "range-line", f"{toml_path}: cannot find the one line "
                                f"'{package} = \"{old_spec}\"' to widen to the new release")
        lines[at[0]] = f"{package} = {toml_string(new_spec)}\n"
        head = "".join(lines)
    by_index = {p.edit.index: p for p in result.proposals}
    out = []
    for edit, chunk in zip(patch.edits, chunks, strict=True):
        proposal = by_index.get(edit.index)
        if proposal is None:
            out.append(chunk)
            continue
        body, tail = trailing_blank(chunk)
        new = proposal.new
        if proposal.kind == ProposalKind.MOVED and proposal.old_versions is None:
            out.append(set_files(body, new.candidates) + tail)  # the old edit, one candidate more
            continue
        if proposal.old_versions is not None:
            body = _set_versions(body, proposal.old_versions)
        if new.action != "assert" and new.text == edit.text and _text_file_of(body):
            new = dataclasses.replace(new, text_file=_text_file_of(body))  # the same text, one file
        elif new.action != "assert" and new.text.count("\n") > LONG_TEXT_LINES:
            name = text_file_name(patch, new.candidates[0], taken)
            files[name] = new.text
            new = dataclasses.replace(new, text_file=name)
        ev = proposal.evidence
        comment = (f"rebased by patchkit onto {new.package} {new.versions}: {ev.why} "
                   f"(anchor {ev.similarity:.0%} similar)")
        out.append(body + "\n" + edit_block(new, comment=_wrap(comment)) + tail)
    return head + "".join(out), files


def _spec_line(line: str) -> SpecifierSet | None:
    try:
        value = next(iter(tomllib.loads(line).values()))
        return SpecifierSet(value) if isinstance(value, str) else None
    except (tomllib.TOMLDecodeError, ValueError):
        return None


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width))


def trailing_blank(chunk: str) -> tuple[str, str]:
    body = chunk.rstrip("\n")
    return body + "\n", chunk[len(body) + 1:]


def _key_line(body: str, key: str) -> int | None:
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{key} =") or line.startswith(f"{key}="):
            return i
    return None


def _set_versions(body: str, versions: str) -> str:
    lines = body.splitlines(keepends=True)
    i = _key_line(body, "versions")
    if i is not None:
        lines[i] = f"versions = {toml_string(versions)}\n"
    else:
        h = next(n for n, line in enumerate(lines) if line.rstrip("\n") == "[[edit]]")
        lines.insert(h + 1, f"versions = {toml_string(versions)}\n")
    return "".join(lines)


def set_files(body: str, candidates: tuple[str, ...]) -> str:
    lines = body.splitlines(keepends=True)
    i = _key_line(body, "file")
    if i is None:
        i = _key_line(body, "files")
    if i is None or lines[i].rstrip().endswith("[") :
        raise RebaseRefused(None, "files-key", "cannot find a one-line file/files key to extend")
    lines[i] = "files = [" + ", ".join(toml_string(c) for c in candidates) + "]\n"
    return "".join(lines)


def _text_file_of(body: str) -> str | None:
    i = _key_line(body, "text_file")
    if i is None:
        return None
    return tomllib.loads(body.splitlines()[i])["text_file"]
