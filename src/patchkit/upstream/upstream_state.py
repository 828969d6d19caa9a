"""The state of each patch's tracked upstream pull requests and issues (`[[upstream.tracked]]`), read from
GitHub's REST API answers: open, closed (and why, for an issue), merged, and the release a merge shipped in
where that is known.

The answers come from `gh api repos/OWNER/NAME/pulls/N` (or `.../issues/N`), run here with the caller's
token (the daily workflow's), or from a folder of recorded answers laid out as the API paths
(`DIR/repos/OWNER/NAME/pulls/N.json`), which `--record DIR` writes from live ones. Either way an answer is
untrusted: read bounded (the `github-answer` limit), decoded into the few fields used (msgspec, the
documented schema's types), and checked to be the object that was asked for; anything else is exit 2.

Schemas: https://docs.github.com/en/rest/pulls/pulls#get-a-pull-request and
https://docs.github.com/en/rest/issues/issues#get-an-issue (an issue answer for a pull request carries
`pull_request`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from patchkit.bounded_process import run_bounded
from patchkit.errors import PatchkitError
from patchkit.jsondata import decode
from patchkit.localfiles import atomic_write
from patchkit.patching.patchset import Patch
from patchkit.patching.schema import TrackedTable
from patchkit.untrusted import read_file
from patchkit.upstream.upstream_md import tracked_url

GH_TIMEOUT_S = 60.0
_RELEASE = re.compile(r"v?(\d+(?:\.\d+)+(?:[a-z0-9.+-]*)?)")


class NotAnAnswersFolder(PatchkitError):
    """`--answers` `folder` is not a directory of recorded GitHub API answers (exit 2)."""

    def __init__(self, folder: Path):
        super().__init__(f"--answers {folder}: not a directory of recorded GitHub API answers")
        self.folder = folder


class NoRecordedAnswer(PatchkitError):
    """The recorded answers `folder` holds no answer for `api_path` (no `DIR/<api_path>.json`) (exit 2); the
    message says how to record it."""

    def __init__(self, folder: Path, api_path: str):
        path = folder / f"{api_path}.json"
        super().__init__(f"{path}: no recorded answer for {api_path}; record it with "
                         f"`gh api {api_path} > {path}` (or `patchkit upstream --record {folder}`)")
        self.folder, self.api_path = folder, api_path


class GitHubCliMissing(PatchkitError):
    """GitHub's CLI `gh` cannot be run to read `api_path`: `reason` (the operating system's) (exit 2)."""

    def __init__(self, gh: str, api_path: str, reason: str):
        super().__init__(f"`{gh} api {api_path}`: cannot run GitHub's CLI ({reason}); install gh, or read "
                         "recorded answers with --answers DIR")
        self.gh, self.api_path, self.reason = gh, api_path, reason


class GitHubCliFailed(PatchkitError):
    """`gh` api `api_path` (GitHub's CLI, `gh` the command run) failed: `detail` is the end of its standard
    error, else how it ended (exit 2)."""

    def __init__(self, gh: str, api_path: str, detail: str):
        super().__init__(f"`{gh} api {api_path}` failed: {detail}")
        self.gh, self.api_path, self.detail = gh, api_path, detail


class TrackedKindMismatch(PatchkitError):
    """`repo`#`number` is tracked as an issue in `patch_toml` but GitHub answers a pull request at `url`
    (exit 2): its kind should be "pr"."""

    def __init__(self, patch_toml: Path, repo: str, number: int, url: str):
        super().__init__(f"{patch_toml}: {repo}#{number} is tracked as an issue but GitHub answers a pull "
                         f"request ({url}): set kind = \"pr\"")
        self.patch_toml, self.repo, self.number, self.url = patch_toml, repo, number, url


class TrackedItemMismatch(PatchkitError):
    """GitHub's answer `source` is #`answered` at `answered_url`, not the `kind` (pr or issue) tracked in
    `patch_toml` at `expected_url` (exit 2): moved, renamed, or a mixed-up answer."""

    def __init__(self, source: str, answered: int, answered_url: str, kind: str, expected_url: str,
                 patch_toml: Path):
        super().__init__(f"{source}: GitHub's answer is #{answered} at {answered_url}, not the {kind} asked for "
                         f"({expected_url}); moved or renamed? update {patch_toml}")
        self.source, self.answered, self.answered_url = source, answered, answered_url
        self.kind, self.expected_url, self.patch_toml = kind, expected_url, patch_toml


class UpstreamState(StrEnum):
    """A tracked pull request's or issue's state: GitHub's open or closed, a merged pull request its own."""

    OPEN = "open"
    MERGED = "merged"
    CLOSED = "closed"


class CloseReason(StrEnum):
    """GitHub's `state_reason` of an issue: why it closed, or that it was reopened."""

    COMPLETED = "completed"
    NOT_PLANNED = "not_planned"
    REOPENED = "reopened"
    DUPLICATE = "duplicate"


def close_reason(text: str | None) -> CloseReason | str | None:
    """GitHub's `state_reason` as its member; a reason GitHub added since is kept as its text, not refused."""
    if not text:
        return None
    try:
        return CloseReason(text)
    except ValueError:
        return text


def state_words(state: UpstreamState, reason: CloseReason | str | None) -> str:
    """The state as the table, the bump body and people read it: "open", "merged", "closed (not planned)"."""
    if state == UpstreamState.CLOSED and reason:
        return f"closed ({reason.replace('_', ' ')})"
    return str(state)


class Milestone(msgspec.Struct):
    title: str


class PullAnswer(msgspec.Struct):
    """The fields of GitHub's pull request object this reads (the rest of the answer is ignored)."""

    number: int
    state: Literal["open", "closed"]
    title: str
    html_url: str
    merged: bool
    merged_at: str | None
    closed_at: str | None
    updated_at: str | None = None  # always sent by GitHub; a hand-written answer may not know it
    milestone: Milestone | None = None


class IssueAnswer(msgspec.Struct):
    """The fields of GitHub's issue object this reads."""

    number: int
    state: Literal["open", "closed"]
    title: str
    html_url: str
    closed_at: str | None
    updated_at: str | None = None
    state_reason: str | None = None  # CloseReason's values, one GitHub added since, or null: close_reason
    milestone: Milestone | None = None
    pull_request: dict | None = None  # present when the "issue" is a pull request


class Answers(Protocol):
    """Where answers come from: `read(api_path)` -> (the answer's bytes, where they came from)."""

    def read(self, api_path: str) -> tuple[bytes, str]: ...


class RecordedAnswers:
    """A folder of recorded answers, one file per API path: `DIR/<api_path>.json`."""

    def __init__(self, folder: Path):
        if not folder.is_dir():
            raise NotAnAnswersFolder(folder)
        self.folder = folder

    def read(self, api_path: str) -> tuple[bytes, str]:
        path = self.folder / f"{api_path}.json"
        if not path.exists():
            raise NoRecordedAnswer(self.folder, api_path)
        return read_file(path, "github-answer"), str(path)


class GhAnswers:
    """Live answers from `gh api` (GitHub's CLI, authenticated by GH_TOKEN / GITHUB_TOKEN or its login).

    Run by hand rather than through doctor's host commands: only standard output is the answer (gh's
    notes on standard error must not be read as JSON), bounded while it is read, killed at a timeout."""

    def __init__(self, gh: str = "gh", record_to: Path | None = None):
        self.gh, self.record_to = gh, record_to

    def read(self, api_path: str) -> tuple[bytes, str]:
        what = f"`{self.gh} api {api_path}`"
        try:
            finished = run_bounded([self.gh, "api", api_path], timeout=GH_TIMEOUT_S, kind="github-answer", what=what,
                                   stderr_apart=True)
        except OSError as exc:
            raise GitHubCliMissing(self.gh, api_path, str(exc.strerror or exc)) from None
        if finished.code != 0:
            detail = finished.errors.decode("utf-8", "replace").strip()[-500:] or (
                f"killed after {GH_TIMEOUT_S:.0f} s" if finished.code < 0 else f"exit status {finished.code}")
            raise GitHubCliFailed(self.gh, api_path, detail)
        if self.record_to is not None:  # replayable later with --answers
            atomic_write(self.record_to / f"{api_path}.json", finished.output)
        return finished.output, what


@dataclass(frozen=True)
class TrackedState:
    """One tracked PR or issue of one patch, as GitHub answered."""

    patch_id: str
    tracked: TrackedTable
    state: UpstreamState
    reason: CloseReason | str | None  # an issue's state_reason (close_reason); None for a pull request
    title: str
    url: str
    updated_at: str | None
    closed_at: str | None  # merged_at for a merge
    released_in: str | None  # the release a merge shipped in, where known
    released_from: str  # how that is known: "milestone" | "patch.toml" | ""
    source: str  # the answer's file or command

    @property
    def words(self) -> str:
        return state_words(self.state, self.reason)

    def record(self) -> TrackedRecord:
        t = self.tracked
        return TrackedRecord(patch=self.patch_id, repo=t.repo, number=t.number, kind=t.kind, fixes=t.fixes,
                             state=self.state, reason=None if self.reason is None else str(self.reason),
                             title=self.title, url=self.url, updated_at=self.updated_at, closed_at=self.closed_at,
                             released_in=self.released_in, released_from=self.released_from, source=self.source)

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self.record())


# `patchkit upstream --json`, declared once: written through these, and read back through them by the bump
# pull request's body (upstream/bump_records.py), so a renamed field is renamed for both.
class TrackedRecord(msgspec.Struct, kw_only=True):
    patch: str
    repo: str
    number: int
    kind: Literal["pr", "issue"]  # TrackedTable.kind
    fixes: str
    state: UpstreamState
    reason: str | None  # GitHub's state_reason as answered: a CloseReason's value, or one GitHub added since
    title: str
    url: str
    updated_at: str | None
    closed_at: str | None
    released_in: str | None
    released_from: str
    source: str

    @property
    def close_reason(self) -> CloseReason | str | None:
        return close_reason(self.reason)

    @property
    def words(self) -> str:
        return state_words(self.state, self.close_reason)


class UpstreamRecord(msgspec.Struct, kw_only=True):
    tracked: list[TrackedRecord]

    @classmethod
    def of(cls, states: list[TrackedState]) -> UpstreamRecord:
        return cls(tracked=[s.record() for s in states])

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)


def api_path(tracked: TrackedTable) -> str:
    return f"repos/{tracked.repo}/{'pulls' if tracked.kind == 'pr' else 'issues'}/{tracked.number}"


def read_state(patch: Patch, tracked: TrackedTable, answers: Answers) -> TrackedState:
    """The state of one tracked entry; an answer of the wrong shape or for another object is exit 2."""
    path = api_path(tracked)
    data, source = answers.read(path)
    what = f"GitHub's answer for {path} ({source})"
    answer = decode(data, PullAnswer, what) if tracked.kind == "pr" else decode(data, IssueAnswer, what)
    expected = tracked_url(tracked)
    if answer.number != tracked.number or answer.html_url.lower() != expected.lower():
        if isinstance(answer, IssueAnswer) and answer.pull_request is not None:
            raise TrackedKindMismatch(patch.folder / "patch.toml", tracked.repo, tracked.number, answer.html_url)
        raise TrackedItemMismatch(source, answer.number, answer.html_url, tracked.kind, expected,
                                  patch.folder / "patch.toml")
    state = UpstreamState.MERGED if isinstance(answer, PullAnswer) and answer.merged else UpstreamState(answer.state)
    reason = close_reason(answer.state_reason) if isinstance(answer, IssueAnswer) else None
    closed = answer.merged_at if isinstance(answer, PullAnswer) and answer.merged else answer.closed_at
    released, released_from = None, ""
    if state == UpstreamState.MERGED or (state == UpstreamState.CLOSED and reason == CloseReason.COMPLETED):
        released, released_from = _release_of(patch, tracked, answer.milestone)
    return TrackedState(patch.id, tracked, state, reason, answer.title, answer.html_url, answer.updated_at, closed,
                        released, released_from, source)


def _release_of(patch: Patch, tracked: TrackedTable, milestone: Milestone | None) -> tuple[str | None, str]:
    """The release a merge shipped in: the API's milestone when it names a version, else the patch's own
    record (`upstream.state = "merged-in-X"` with `upstream.url` naming this entry), which its
    [upstreamed] probe checks against the released sources. GitHub's answer says nothing more."""
    if milestone is not None and (m := _RELEASE.fullmatch(milestone.title.strip())):
        return m.group(1), "milestone"
    state, url = patch.upstream.get("state", ""), patch.upstream.get("url", "")
    if state.startswith("merged-in-") and url.rstrip("/").lower() == tracked_url(tracked).lower():
        return state.removeprefix("merged-in-"), "patch.toml"
    return None, ""


def tracked_states(patches: list[Patch], answers: Answers) -> list[TrackedState]:
    """Every tracked entry of every patch, in series order."""
    return [read_state(p, t, answers) for p in patches for t in p.tracked]
