"""The schema of `images/<name>/image.toml` (definitions.py documents the format and owns the rules
between fields: inheritance, digest pinning, the GB10 environment, the series against the patch set)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]


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
