"""`patchkit rebase`: propose the new form of every edit a new release broke, with its evidence, check it,
and write each patch whose checks passed.

How a new site is found, and why this way (search.py):
1. The file: the edit's own candidates first; when none exists on the new release, a moved-file search
   over the new release's files of the same name, ranked by how many of the old file's lines they
   share (a file moved between layouts keeps most of its lines; a namesake elsewhere does not). Two
   candidates as good as each other are a person's call.
2. The anchor, exactly: found `count` times in the new file, where a line begins (patching.anchors) ->
   only the file moved.
3. Else a three-way merge: the old file (where the edit held), the new file, and the edit itself. A
   line diff of old -> new file maps the anchor's lines to the lines that replaced them (what a merge
   tool does with a hunk's context); the mapped region is the new anchor only if it is at least
   MIN_SIMILARITY similar to the old one and occurs exactly `count` times. A replace edit's text is
   merged the same way (base: old anchor; ours: the edit's text; theirs: the new anchor); changes that
   overlap are a conflict, left to a person. The nearest-match diagnostics (diagnostics.py) alone would
   pick the most similar window anywhere in the file, which on a file with repeated shapes is another
   site; the alignment keeps the site and uses the similarity only as a bar.
Never looser: counts are kept, a region that does not occur exactly `count` times is refused, an assert
whose text changed is a person's call (an invariant's code changing is what the assert exists to flag).

The modules, each importing only those listed after it (.importlinter):
- measuring: the rebase measured on real history (stripped edits re-derived, compared with a person's);
- checks: a placed patch read back, planned on the new release with the series, its behaviour tests;
- writing: the proposals as patch.toml text, and the per-patch atomic write;
- report: the result as text and as its JSON record;
- records: that JSON record's types, which the bump body (upstream/bump_records.py) reads back;
- propose: the series' rebase, patch by patch (ranges, the probe, which edits need a new form);
- search: one edit's new site (file and anchor) with its evidence, or why it needs a person;
- model: the states (RebaseState, ProposalKind), proposals, edits left to a person, the exit status.

A patch is "rebased" only when its behaviour tests passed on the new release; placed but untested it is
"re-anchored, untested" (written with --no-tests), and "re-anchored, tests failed" or "re-anchored, does
not apply" when a check failed (never written). A patch with an edit that needs a person keeps its old
range and files, whatever the others do.
"""

from patchkit.patching.rebase.checks import check, run_behaviour_tests, run_tests, test_environment
from patchkit.patching.rebase.measuring import measure, without_later_edits
from patchkit.patching.rebase.model import (
    EXIT_FAILED,
    EXIT_NEEDS_PERSON,
    EXIT_WRITTEN,
    Evidence,
    NeedsPerson,
    PatchRebase,
    Proposal,
    ProposalKind,
    Rebase,
    RebaseRefused,
    RebaseState,
    TestRun,
)
from patchkit.patching.rebase.propose import rebase
from patchkit.patching.rebase.records import RebaseRecord
from patchkit.patching.rebase.report import lines, payload
from patchkit.patching.rebase.search import Reader, merge3, rebase_edit
from patchkit.patching.rebase.writing import render, write

__all__ = [
    "EXIT_FAILED", "EXIT_NEEDS_PERSON", "EXIT_WRITTEN", "Evidence", "NeedsPerson", "PatchRebase", "Proposal",
    "ProposalKind", "Reader", "Rebase", "RebaseRecord", "RebaseRefused", "RebaseState", "TestRun", "check", "lines", "measure", "merge3",
    "payload", "rebase", "rebase_edit", "render", "run_behaviour_tests", "run_tests", "test_environment",
    "without_later_edits", "write",
]
