"""An image's extra wheels (`[wheels.NAME]` of image.toml, installed by images/extras.py): each file named
exactly as the index lists it and pinned by the sha256 of the whole file, checked here against its
project, version, platform and the image's Python, so a pin no pip in the image would install fails when
the definition is read, not in the build."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchkit.images.schema import ImageFile, InvalidImageFile

# Where a pinned wheel may be recorded for: the image platforms and the architecture of their wheel tags.
WHEEL_PLATFORMS = {"linux/arm64": "aarch64", "linux/amd64": "x86_64"}


@dataclass(frozen=True)
class WheelPin:
    """An extra wheel an image carries: the index's file for each platform, pinned by its sha256."""

    name: str                              # canonical project name
    version: str
    files: dict[str, tuple[str, str]]      # platform -> (file name, sha256)
    why: str

    @property
    def requirement(self) -> str:
        """The line pip installs the same files from (`pip install --require-hashes -r FILE`)."""
        hashes = " ".join(f"--hash=sha256:{sha}" for _, sha in sorted(set(self.files.values())))
        return f"{self.name}=={self.version} {hashes}"


def pinned_wheels(doc: ImageFile, platform: str, vllm_path: str, where: Path) -> dict[str, WheelPin]:
    """The definition's own pinned wheels, each file checked against its name, version and platform and the
    image's Python (from the vllm package path), so a pin no pip there would install fails here."""
    out: dict[str, WheelPin] = {}
    if not doc.wheels:
        return out
    found = re.search(r"/python(\d)\.(\d+)/", vllm_path)
    if found is None:
        raise InvalidImageFile(where, "[wheels]", "wheel-python", "[wheels] needs the image's Python, read from "
                               f"[packages.vllm] path {vllm_path!r}, which names no pythonX.Y folder")
    python = (found[1], found[2])
    for name, table in doc.wheels.items():
        at = f"[wheels.{name}]"
        if canonicalize_name(name) != name:
            raise InvalidImageFile(where, at, "wheel-name",
                                   f"write the project name as the index does: {canonicalize_name(name)!r}")
        try:
            version = Version(table.version)
        except InvalidVersion:
            raise InvalidImageFile(where, f"{at}, key 'version'", "version",
                                   f"{table.version!r} is not a PEP 440 version") from None
        if platform not in table.files:
            raise InvalidImageFile(where, f"{at}, key 'files'", "platform", f"no file for the image's platform "
                                   f"{platform} (files for: {', '.join(sorted(table.files)) or 'none'})")
        files = {}
        for plat, pinned in sorted(table.files.items()):
            if plat not in WHEEL_PLATFORMS:
                raise InvalidImageFile(where, f"{at}, key 'files'", "platform",
                                       f"platform {plat!r} is not one of {', '.join(WHEEL_PLATFORMS)}")
            _check_wheel_file(pinned.filename, name, version, WHEEL_PLATFORMS[plat], python,
                              where, f"[wheels.{name}.files], key {plat!r}")
            files[plat] = (pinned.filename, pinned.sha256)
        out[name] = WheelPin(name, str(version), files, table.why)
    return out


def _check_wheel_file(filename: str, name: str, version: Version, arch: str, python: tuple[str, str], where: Path,
                      at: str) -> None:
    try:
        project, found, _, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise InvalidImageFile(where, at, "wheel-file", f"{filename!r} is not a wheel's file name ({exc})") from None
    if project != name or found != version:
        raise InvalidImageFile(where, at, "wheel-file", f"{filename} is {project} {found}'s, not {name} {version}'s")
    platforms = [t.platform for t in tags]
    if not all(p == "any" or (p.startswith(("manylinux", "musllinux", "linux_")) and p.endswith(f"_{arch}"))
               for p in platforms):
        raise InvalidImageFile(where, at, "wheel-file",
                               f"{filename} is for {', '.join(sorted(set(platforms)))}, not linux {arch}")
    # What pip on that Python accepts: CPython's own tags, then the py3/abi3/none ones (packaging.tags).
    version_info = (int(python[0]), int(python[1]))
    accepted = {*cpython_tags(version_info, platforms=platforms), *compatible_tags(version_info, platforms=platforms)}
    if not accepted & set(tags):
        raise InvalidImageFile(where, at, "wheel-file", f"{filename} does not install on the image's Python "
                               f"{'.'.join(python)} (tags {', '.join(sorted(str(t) for t in tags))})")
