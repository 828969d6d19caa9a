"""A patched vLLM wheel: a release's wheel, a series applied to its Python files, written as a new wheel.

The series goes through the planner exactly as for a tree or an image: every anchor asserted, and
nothing is written unless every patch is whole. The new wheel is the release's wheel with
- each patched file's new bytes (stored uncompressed: no zlib build decides the wheel's bytes), every
  other member's compressed bytes copied as they are (compiled extensions byte-identical, nothing
  recompressed);
- the version `<release>+glm53.<series hash>` (a PEP 440 local label; the hash is the image tag's,
  over the carried patches' ids and contents), in METADATA, the dist-info name and the file name;
- `patchkit.json` (manifest.py) and a RECORD with every file's sha256 and size;
- when given a substitution (requires.py: the companion policy's stand-in for a pin the index never
  published), METADATA's `Requires-Dist` of that pin stating the substitute instead, recorded in
  `patchkit.json`; without one, METADATA changes in its Version alone;
- fixed timestamps and sorted entries, so the same release wheel and series give the same sha256.
The release wheel is verified whole first (sources/verified_wheel.py: every member against its RECORD, names pip
would install, its own project and version), and every byte copied or read from it after is held
against what was verified. The file appears by rename from a temporary file beside it: never
half-written; on any failure the temporary file is gone and no central directory is written to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from packaging.version import Version

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.localfiles import adjacent_tmp_file, file_sha256
from patchkit.patching.carry import carry
from patchkit.patching.patchset import Patch
from patchkit.patching.planner import FileChange, PatchResult, Plan, plan
from patchkit.patching.series import series_hash
from patchkit.sources.verified_wheel import SIGNATURES, VerifiedWheel, open_wheel
from patchkit.sources.wheel import WheelSource
from patchkit.sources.wheel_record import RecordRow, format_record, row_for
from patchkit.wheels.archive import ReproducibleZip, mode_of
from patchkit.wheels.manifest import MANIFEST, CarriedPatch, SubstitutedRequirement, WheelManifest
from patchkit.wheels.requires import Substitution, substitute_requirement

LOCAL_PREFIX = "glm53"


class HasLocalLabel(PatchkitError):
    """The release wheel's `version` has a PEP 440 local label already (`+...`): not a released wheel, and a
    patched one's label would be a second (exit 2)."""

    def __init__(self, version: str):
        super().__init__(f"{version} already has a local label: patchkit patches released wheels only")
        self.version = version


class NotAVllmWheel(PatchkitError):
    """The wheel `release` is `name` `version`'s, not vLLM's (exit 2)."""

    def __init__(self, release: Path, name: str, version: str):
        super().__init__(f"{release} is not a vLLM wheel (it is {name} {version}'s)")
        self.release, self.name, self.version = release, name, version


class WheelNotWritten(PatchkitError):
    """The patched wheel `target` cannot be written into `output`: `reason` (a full or read-only disk, a file
    where the folder should be) (exit 2); nothing of it is left there."""

    def __init__(self, target: Path, output: Path, reason: str):
        super().__init__(f"{target} cannot be written ({reason}); nothing of it is left in {output}")
        self.target, self.output, self.reason = target, output, reason


class NotOneHeader(PatchkitError):
    """`where` (a wheel's METADATA or WHEEL) has `found` `field` headers where the patched wheel sets exactly
    one (exit 2)."""

    def __init__(self, where: str, field: str, found: int):
        super().__init__(f"{where}: expected one {field} header, found {found}")
        self.where, self.field, self.found = where, field, found


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str
    manifest: WheelManifest
    plan: Plan

    def summary(self) -> dict:
        return {
            "wheel": str(self.path),
            "sha256": self.sha256,
            "version": self.manifest.version,
            "series": self.manifest.series,
            "series_hash": self.manifest.series_hash,
            "release": self.manifest.release,
            "patches": [p.id for p in self.manifest.patches],
            "left_out": {p.id: p.note for p in self.manifest.skipped},
            "files": [f["path"] for f in self.manifest.files],
            "substituted": [asdict(s) for s in self.manifest.substituted],
        }


def patched_version(release_version: str, digest: str) -> str:
    version = Version(release_version)
    if version.local is not None:
        raise HasLocalLabel(release_version)
    return f"{version.public}+{LOCAL_PREFIX}.{digest}"


def build_wheel(release: Path, patches: list[Patch], series: str, output: Path, *,
                substitution: Substitution | None = None) -> BuiltWheel:
    """Write the patched wheel of `release` into the folder `output`; PatchFailed (nothing written) if
    the series does not apply, BadWheel (nothing written) if the release is not a wheel pip would install.
    `substitution`: the requirement METADATA states in place of the release's unpublished pin."""
    with open_wheel(release) as wheel:
        if wheel.name != "vllm":
            raise NotAVllmWheel(release, wheel.name, wheel.version)
        result = plan(patches, WheelSource(wheel))
        kept = carry(result, f"series {series}", release.name)  # the one rule images follow too
        carried = [_recorded(r) for r in kept.carried]
        skipped = [_recorded(r) for r in kept.left_out]
        version = patched_version(wheel.version, series_hash(kept.patches))
        metadata_name = f"{wheel.dist_info}/METADATA"
        metadata = _set_header(wheel.read(metadata_name, "metadata"), "Version", version, metadata_name)
        substituted: list[SubstitutedRequirement] = []
        if substitution is not None:
            metadata, substituted = substitute_requirement(metadata, substitution, f"{release}, member {metadata_name}")
        manifest = WheelManifest(
            version=version, series=series, series_hash=version.rsplit(".", 1)[1],
            release={"filename": release.name, "sha256": wheel.sha256, "version": wheel.version},
            patches=carried, skipped=skipped,
            files=[{"path": _member(c), "release_sha256": hashlib.sha256(c.old).hexdigest(),
                    "patched_sha256": hashlib.sha256(c.new).hexdigest()} for c in result.changes],
            substituted=substituted,
        )
        target = output / wheel_filename(release.name, version)
        created = not output.exists()
        try:
            output.mkdir(parents=True, exist_ok=True)
            with adjacent_tmp_file(target) as out:
                _write(wheel, out, version, result.changes, manifest, metadata)
        except OSError as error:  # the output's: a full or read-only disk, a folder in the way
            raise WheelNotWritten(target, output, str(error.strerror or error)) from None
        finally:
            if created and not target.exists():
                with contextlib.suppress(OSError):
                    output.rmdir()  # only if empty: the folder this build made, for nothing
    return BuiltWheel(target, file_sha256(target), manifest, result)


def _recorded(result: PatchResult) -> CarriedPatch:
    return CarriedPatch(result.patch.id, result.patch.digest, str(result.state), result.detail)


def wheel_filename(release_name: str, version: str) -> str:
    """The release's file name with the new version: `{name}-{version}(-{build})?-{py}-{abi}-{platform}.whl`."""
    name, _, rest = release_name.removesuffix(".whl").split("-", 2)
    return f"{name}-{version}-{rest}.whl"


def _member(change: FileChange) -> str:
    return f"{change.package}/{change.path}"  # a wheel keeps each package at its top level


def _write(wheel: VerifiedWheel, out: BinaryIO, version: str, changes: list[FileChange],
           manifest: WheelManifest, metadata: bytes) -> None:
    old_info = wheel.dist_info
    new_info = f"{old_info.split('-')[0]}-{version}.dist-info"
    changed = {_member(c): c for c in changes}
    missing = set(changed) - set(wheel.members)
    if missing:
        raise PatchkitError(f"{wheel.path} has no member {min(missing)} (the planner read it elsewhere: a patchkit "
                            "bug, please report it)")
    body = sorted(n for n in wheel.members if not n.startswith(f"{old_info}/"))
    meta = sorted(n.split("/", 1)[1] for n in wheel.members if n.startswith(f"{old_info}/"))
    rows: list[RecordRow] = []
    writer = ReproducibleZip(out)

    def add(name: str, data: bytes, mode: int = 0o644) -> None:
        writer.write(name, data, mode)
        rows.append(row_for(name, data))

    try:
        for name in body:
            if name in changed:
                add(name, changed[name].new, mode_of(wheel.members[name].info))
            else:
                rows.append(wheel.copy(writer, name, name))
        for relative in sorted([*meta, MANIFEST]):
            name, old = f"{new_info}/{relative}", f"{old_info}/{relative}"
            if relative in ("RECORD", *SIGNATURES):  # signed the release's RECORD: void for the new one, dropped
                continue
            if relative == MANIFEST:
                add(name, manifest.to_bytes())
            elif relative == "METADATA":
                add(name, metadata, mode_of(wheel.members[old].info))
            elif relative == "WHEEL":
                add(name, _set_header(wheel.read(old, "metadata"), "Generator", f"patchkit {__version__}", old),
                    mode_of(wheel.members[old].info))
            else:
                rows.append(wheel.copy(writer, old, name))
        rows.append(RecordRow(f"{new_info}/RECORD", "", ""))
        writer.write(f"{new_info}/RECORD", format_record(rows))
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _set_header(text: bytes, field: str, value: str, where: str) -> bytes:
    """`text` (RFC 822 headers, then an optional body) with its one `field:` header set to `value`."""
    head, sep, body = text.partition(b"\n\n")
    lines = head.split(b"\n")
    pattern = re.compile(rb"^" + field.encode() + rb"\s*:", re.IGNORECASE)
    found = [i for i, line in enumerate(lines) if pattern.match(line)]
    if len(found) != 1:
        raise NotOneHeader(where, field, len(found))
    lines[found[0]] = f"{field}: {value}".encode()
    return b"\n".join(lines) + sep + body

