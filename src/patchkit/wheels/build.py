"""A patched vLLM wheel: a release's wheel, a series applied to its Python files, written as a new wheel.

The series goes through the planner exactly as for a tree or an image: every anchor asserted, and
nothing is written unless every patch is whole. The new wheel is the release's wheel with
- each patched file's new bytes (stored uncompressed: no zlib build decides the wheel's bytes), every
  other member's compressed bytes copied as they are (compiled extensions byte-identical, nothing
  recompressed);
- the version `<release>+glm53.<series hash>` (a PEP 440 local label; the hash is the image tag's,
  over the carried patches' ids and contents), in METADATA, the dist-info name and the file name;
- `patchkit.json` (manifest.py) and a RECORD with every file's sha256 and size;
- fixed timestamps and sorted entries, so the same release wheel and series give the same sha256.
The file appears by rename from a temporary file beside it: never half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packaging.version import Version

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.images.labels import series_hash
from patchkit.patching.patchset import Patch
from patchkit.patching.planner import FileChange, Plan, State, plan
from patchkit.sources.wheel import WheelSource
from patchkit.wheels.archive import ReproducibleZip, mode_of, read_raw
from patchkit.wheels.manifest import MANIFEST, CarriedPatch, WheelManifest
from patchkit.wheels.record import RecordRow, format_record, parse_record, row_for

LOCAL_PREFIX = "glm53"
CARRIED = (State.NOT_APPLIED, State.APPLIED)  # applied by the build, or assert-only and holding
LEFT_OUT = (State.UPSTREAMED, State.NOT_APPLICABLE)  # upstream has the fix; only FlashInfer (not in the wheel)
SIGNATURES = ("RECORD.jws", "RECORD.p7s")  # signed the release's RECORD: void for the new one, dropped


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
        }


def patched_version(release_version: str, digest: str) -> str:
    version = Version(release_version)
    if version.local is not None:
        raise PatchkitError(f"{release_version} already has a local label: patchkit patches released wheels only")
    return f"{version.public}+{LOCAL_PREFIX}.{digest}"


def build_wheel(release: Path, patches: list[Patch], series: str, output: Path) -> BuiltWheel:
    """Write the patched wheel of `release` into the folder `output`; PatchFailed (nothing written) if
    the series does not apply."""
    source = WheelSource(release)
    release_version = source.versions().get("vllm")
    if release_version is None:
        raise PatchkitError(f"{release} is not a vLLM wheel (it holds {', '.join(source.versions())})")
    result = plan(patches, source)
    result.raise_for_errors()
    carried, skipped = [], []
    for r in result.results:
        if r.state in CARRIED:
            carried.append(CarriedPatch(r.patch.id, r.patch.digest, str(r.state), r.detail))
        elif r.state in LEFT_OUT:
            skipped.append(CarriedPatch(r.patch.id, r.patch.digest, str(r.state), r.detail))
        else:
            raise PatchkitError(f"series {series}: patch {r.patch.id} is {r.state} on {release.name} ({r.detail})")
    if not result.changes:
        raise PatchkitError(f"series {series} changes nothing in {release.name}: no wheel to build")
    by_id = {p.id: p for p in patches}
    version = patched_version(release_version, series_hash([by_id[p.id] for p in carried]))
    manifest = WheelManifest(
        version=version, series=series, series_hash=version.rsplit(".", 1)[1],
        release={"filename": release.name, "sha256": _file_sha256(release), "version": release_version},
        patches=carried, skipped=skipped,
        files=[{"path": _member(c), "release_sha256": hashlib.sha256(c.old).hexdigest(),
                "patched_sha256": hashlib.sha256(c.new).hexdigest()} for c in result.changes],
    )
    output.mkdir(parents=True, exist_ok=True)
    target = output / wheel_filename(release.name, version)
    with _atomic(target) as out:
        _write(release, out, version, result.changes, manifest)
    return BuiltWheel(target, _file_sha256(target), manifest, result)


def wheel_filename(release_name: str, version: str) -> str:
    """The release's file name with the new version: `{name}-{version}(-{build})?-{py}-{abi}-{platform}.whl`."""
    name, _, rest = release_name.removesuffix(".whl").split("-", 2)
    return f"{name}-{version}-{rest}.whl"


def _member(change: FileChange) -> str:
    return f"{change.package}/{change.path}"  # a wheel keeps each package at its top level


def _write(release: Path, out: BinaryIO, version: str, changes: list[FileChange], manifest: WheelManifest) -> None:
    with zipfile.ZipFile(release) as archive, open(release, "rb") as raw_in:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise PatchkitError(f"{release} stores a member twice: refusing to guess which one pip would install")
        old_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        new_info = f"{old_info.split('-')[0]}-{version}.dist-info"
        record = parse_record(archive.read(f"{old_info}/RECORD"))
        listed = set(record) - {f"{old_info}/RECORD"}
        unlisted = set(names) - listed - {f"{old_info}/{s}" for s in (*SIGNATURES, "RECORD")}
        if unlisted or listed - set(names):
            raise PatchkitError(f"{release}: RECORD and archive disagree (unlisted: {sorted(unlisted)[:5]}, "
                                f"missing: {sorted(listed - set(names))[:5]})")
        changed = {_member(c): c for c in changes}
        missing = set(changed) - set(names)
        if missing:
            raise PatchkitError(f"{release} has no member {min(missing)} (the planner read it elsewhere)")
        body = sorted((i for i in infos if not i.filename.startswith(f"{old_info}/")), key=lambda i: i.filename)
        meta = sorted((i for i in infos if i.filename.startswith(f"{old_info}/")), key=lambda i: i.filename)
        rows: list[RecordRow] = []
        writer = ReproducibleZip(out)

        def copy(info: zipfile.ZipInfo, name: str) -> None:
            row = record[info.filename]
            if not row.hash.startswith("sha256="):  # another algorithm: hash the member ourselves
                row = row_for(name, archive.read(info))
            writer.copy_raw(info, read_raw(raw_in, info), name=name)
            rows.append(RecordRow(name, row.hash, row.size))

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            writer.write(name, data, mode)
            rows.append(row_for(name, data))

        for info in body:
            if info.filename in changed:
                add(info.filename, changed[info.filename].new, mode_of(info))
            else:
                copy(info, info.filename)
        extra = {f"{new_info}/{MANIFEST}": manifest.to_bytes()}
        entries = sorted([(i.filename.split("/", 1)[1], i) for i in meta] + [(MANIFEST, None)], key=lambda e: e[0])
        for relative, info in entries:
            name = f"{new_info}/{relative}"
            if relative in ("RECORD", *SIGNATURES):
                continue
            if info is None:
                add(name, extra[name])
            elif relative == "METADATA":
                add(name, _set_header(archive.read(info), "Version", version, info.filename), mode_of(info))
            elif relative == "WHEEL":
                add(name, _set_header(archive.read(info), "Generator", f"patchkit {__version__}", info.filename),
                    mode_of(info))
            else:
                copy(info, name)
        rows.append(RecordRow(f"{new_info}/RECORD", "", ""))
        writer.write(f"{new_info}/RECORD", format_record(rows))
        writer.close()


def _set_header(text: bytes, field: str, value: str, where: str) -> bytes:
    """`text` (RFC 822 headers, then an optional body) with its one `field:` header set to `value`."""
    head, sep, body = text.partition(b"\n\n")
    lines = head.split(b"\n")
    pattern = re.compile(rb"^" + field.encode() + rb"\s*:", re.IGNORECASE)
    found = [i for i, line in enumerate(lines) if pattern.match(line)]
    if len(found) != 1:
        raise PatchkitError(f"{where}: expected one {field} header, found {len(found)}")
    lines[found[0]] = f"{field}: {value}".encode()
    return b"\n".join(lines) + sep + body


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[BinaryIO]:
    """A temporary file beside `path`, renamed onto it only when the block ends without an exception."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    temporary = Path(name)
    try:
        with os.fdopen(fd, "w+b") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
