"""The shapes of the OCI documents patchkit reads (image-spec descriptor, index, manifest, and the subset of
the image config a build touches), as msgspec Structs checked at the boundary.

Every index, manifest or config that comes from a layout or a registry is decoded against one of these
before any code looks into it, so a wrong type (`"manifests": "abc"`, `"layers": [1, 2]`, `"Env": [1]`,
a size that is a string) is a MalformedJson error naming the document and the JSON path, never an
AttributeError deep in a build. Unknown fields are allowed, as the spec requires of readers; the build
keeps working on the parsed dict (so fields it does not know are carried over untouched), which is
only handed out once it has the shape declared here.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

from patchkit.jsondata import decode, load_json_object

T = TypeVar("T")

Digest = Annotated[str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}$",
                                     description="sha256: and 64 lower-case hex digits")]
Size = Annotated[int, msgspec.Meta(ge=0)]


class PlatformSpec(msgspec.Struct):
    architecture: str
    os: str
    variant: str | None = None


class Descriptor(msgspec.Struct):
    mediaType: str
    digest: Digest
    size: Size
    platform: PlatformSpec | None = None
    annotations: dict[str, str] | None = None


class Index(msgspec.Struct):
    schemaVersion: int
    manifests: list[Descriptor]
    mediaType: str | None = None


class Manifest(msgspec.Struct):
    schemaVersion: int
    config: Descriptor
    layers: list[Descriptor]
    mediaType: str | None = None
    annotations: dict[str, str] | None = None


class Typed(msgspec.Struct):
    """Only the media type a document says it is (an index or a manifest?)."""

    mediaType: str | None = None


class RootFS(msgspec.Struct):
    type: str
    diff_ids: list[Digest]


class Runtime(msgspec.Struct):
    Env: list[str] | None = None
    Labels: dict[str, str] | None = None


class ImageConfig(msgspec.Struct):
    architecture: str
    os: str
    rootfs: RootFS
    variant: str | None = None
    config: Runtime | None = None
    history: list[dict[str, Any]] | None = None


def parse(data: bytes, schema: type[T], what: str) -> tuple[T, dict]:
    """`data` checked against `schema`, and the same document as a plain dict for the code that edits it."""
    return decode(data, schema, what), load_json_object(data, what)
