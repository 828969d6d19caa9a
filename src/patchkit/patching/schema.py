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
# A finding's name as its table names it: a boot-log cause (bootlog/causes.py) or a serving finding
# (smoke/serving.py); tests/test_fixes.py checks each name against those tables.
FindingName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]*$")]


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
    """What in the unpatched source means upstream now carries the fix: text in one of its files
    (`contains`, with file or files), or the source's own release in a range (`release`, exact)."""

    contains: NonEmpty | None = None
    release: NonEmpty | None = None     # PEP 440 range of the source's own release (no file)
    package: str = "vllm"
    file: NonEmpty | None = None
    files: Paths | None = None


EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="an environment variable name")]
ConfigValue = int | float | bool | str


class QuantizedTable(_Table):
    """Modules a checkpoint's quant config quantizes that stock vLLM builds unquantized and this patch
    builds with their entry (checkpoint.needs judges them module by module)."""

    quant_algo: NonEmpty                # the checkpoint's declared ModelOpt quant_algo, e.g. MIXED_PRECISION
    kinds: list[NonEmpty] = []          # module kinds (patchkit.checkpoint.inventory); none given: every kind
    part: Literal["main", "mtp"] | None = None   # the target model or the MTP predictor; none given: both


class NeededWhenTable(_Table):
    """`[needed_when]`: when a checkpoint served as a variant needs the patch. Preflight refuses an image
    whose series lacks it. Every condition given must hold, and at least one is given."""

    why: NonEmpty                       # what breaks without it, for such a checkpoint
    config: dict[NonEmpty, ConfigValue] = {}   # text-config keys with these values (vLLM's defaults for absent keys)
    config_set: list[NonEmpty] = []     # text-config keys that are set (not null)
    serve: dict[NonEmpty, ConfigValue] = {}    # the variant's [serve] fields with these values
    quantized: QuantizedTable | None = None
    spelling: Literal["nested"] | None = None  # the index names tensors in transformers' nested spelling


class ImageTable(_Table):
    """`[image]`: what every image carrying the patch sets, and an image without it must not."""

    env: dict[EnvName, str]             # runtime switches the patch's code reads


class SmokeTable(_Table):
    """`[smoke]`: what the hardware smoke sets on an image carrying the patch, and what it then requires."""

    env: dict[EnvName, str]             # switches that turn the patch's output on for the smoke
    markers: list[NonEmpty] = []        # boot-log markers (patchkit.bootlog.markers) the patch prints then


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
    fixes: list[FindingName] = []       # the findings it fixes: their fix text names this patch (patching/fixed_by.py)
    packages: dict[str, NonEmpty] = {}  # other packages it patches, each with its range
    upstreamed: UpstreamedProbeTable | None = None
    needed_when: NeededWhenTable | None = None
    image: ImageTable | None = None
    smoke: SmokeTable | None = None


class SeriesFile(_Table):
    """patches/series.toml: the full set in application order."""

    series: Annotated[list[NonEmpty], msgspec.Meta(min_length=1)]
