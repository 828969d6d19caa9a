"""The schema of `patches/<id>/patch.toml` and `patches/series.toml` (docs/DESIGN.md has the format).

Types, required keys and unknown keys are checked here while decoding (patchkit.tomlschema); the rules
between fields (a range parses, a path stays in its package, a text changes something) are in
patchset.py, which turns these raw tables into the Patch and Edit the planner trusts.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]
Paths = Annotated[list[NonEmpty], msgspec.Meta(min_length=1)]


class _Table(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class EditTable(_Table):
    """One `[[edit]]`: an anchored change (or an assert) in one file of one package."""

    action: Literal["replace", "insert_before", "insert_after", "assert"]
    anchor: NonEmpty
    package: str = "vllm"
    file: NonEmpty | None = None
    files: Paths | None = None          # candidates: exactly one must exist
    count: Annotated[int, msgspec.Meta(ge=1)] = 1
    text: str | None = None
    text_file: NonEmpty | None = None   # beside patch.toml, instead of text
    versions: NonEmpty | None = None    # releases of its package this edit is for


class OriginTable(_Table):
    author: NonEmpty
    url: NonEmpty
    license: NonEmpty                   # SPDX


class TrackedTable(_Table):
    """One `[[upstream.tracked]]`: an upstream pull request or issue whose resolution would make the patch
    unnecessary; `patchkit upstream` reads its state from GitHub's REST API."""

    repo: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")]  # owner/name
    number: Annotated[int, msgspec.Meta(ge=1)]
    kind: Literal["pr", "issue"]
    fixes: NonEmpty                     # what it would fix, in this patch's terms


class UpstreamTable(_Table):
    state: Annotated[str, msgspec.Meta(pattern=r"^(none|open|merged-in-\d+(\.\d+)*([a-z0-9.+-]*)?)$")]
    url: str = ""
    tracked: list[TrackedTable] = []    # the PRs and issues that would retire it


class UpstreamedProbeTable(_Table):
    """Text whose presence in the unpatched file means upstream now carries the fix."""

    contains: NonEmpty
    package: str = "vllm"
    file: NonEmpty | None = None
    files: Paths | None = None


class PatchFile(_Table):
    """patches/<id>/patch.toml"""

    id: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    title: NonEmpty
    why: NonEmpty                       # what breaks without it
    vllm: NonEmpty                      # PEP 440 range of vLLM releases it applies to
    origin: OriginTable
    upstream: UpstreamTable
    edit: list[EditTable]
    evidence: NonEmpty | None = None    # how it was derived: sources, measurements, public records
    test: NonEmpty | None = None        # which tests prove it, and what they show
    drop_when: NonEmpty | None = None   # when upstream makes it unnecessary
    packages: dict[str, NonEmpty] = {}  # other packages it patches, each with its range
    upstreamed: UpstreamedProbeTable | None = None


class SeriesFile(_Table):
    """patches/series.toml: the full set in application order."""

    series: Annotated[list[NonEmpty], msgspec.Meta(min_length=1)]
