"""The schema of `images/<name>/image.toml` (definitions.py documents the format and owns the rules
between fields: inheritance, digest pinning, the GB10 environment, the series against the patch set)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from patchkit.tomlschema import InvalidDefinition

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]


class InvalidImageFile(InvalidDefinition):
    """An image.toml that reads as its schema but breaks a rule between fields or images (exit 2). As for
    any definition: `path` the image.toml, `at` the table and key ("[base], key 'ref'", "[wheels.x]"),
    `detail` what was expected and what was found; `problem` one of "folder-name", "image-name",
    "parent" (names itself or an image with no file), "cycle", "missing-table" ([base], [packages.vllm],
    [env] in a root image), "base-ref" (not pinned by digest), "platform", "unknown-package",
    "package-path", "version" (not PEP 440, or missing), "layout" (not a release), "series" (patches/add
    as root or child image must, empty, again, unknown or out of order), "env-name", "arch-env" (a GB10
    arch variable not the target's), "wheel-python", "wheel-name", "wheel-file" (not the project, version,
    platform or Python the pin says)."""


class _Table(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class BaseTable(_Table):
    ref: NonEmpty        # NAME[:TAG]@sha256:<64 hex>: the tag is for people, the digest is what is built
    platform: NonEmpty
    source: NonEmpty     # where the digest comes from
    why: NonEmpty


class PackageTable(_Table):
    path: NonEmpty                # the package directory inside the image
    why: NonEmpty
    version: NonEmpty | None = None   # what the base carries
    layout: NonEmpty | None = None    # the release whose file layout a development snapshot matches


class SeriesTable(_Table):
    why: NonEmpty
    patches: list[NonEmpty] | None = None   # a root image: its series in application order
    add: list[NonEmpty] | None = None       # a child image: added to its parent's


class EnvTable(_Table):
    why: NonEmpty
    vars: dict[str, str] = {}


class WheelFileTable(_Table):
    filename: NonEmpty   # the file on the index pip would pick for that platform
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]   # of the whole file, as the index lists it


class WheelTable(_Table):
    version: NonEmpty
    why: NonEmpty
    files: dict[str, WheelFileTable]   # image platform ("linux/arm64") -> its wheel


class ImageFile(_Table):
    """images/<name>/image.toml"""

    schema: Literal[1]
    name: NonEmpty
    title: NonEmpty
    why: NonEmpty
    series: SeriesTable
    parent: NonEmpty | None = None
    base: BaseTable | None = None
    packages: dict[str, PackageTable] | None = None
    env: EnvTable | None = None
    labels: dict[str, str] = {}
    wheels: dict[str, WheelTable] = {}   # extra wheels installed into the layer (images.extras), by project name
