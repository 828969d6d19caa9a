"""Extra wheels into an image layer: the wheels an image definition pins (`[wheels.NAME]`), installed
into the image's site-packages exactly as pip installs them, as files of the one new layer.

1. fetch: the index's file the definition names for the image's platform, through the same verified
   cache as every other download (sources.index + sources.cache: sha256 checked while streaming, entered
   by rename, bounded by the `archive` limit). The index must list that very file with the pinned sha256,
   and the bytes opened are hashed again against the pin (`WheelPinMismatch`, exit 2: nothing is built).
2. verify: the whole wheel as the patched-wheel path verifies a release wheel (sources.verified_wheel: safe
   names, one dist-info of its own project and version, every member against its RECORD, bounded
   inflation); every byte installed is read back through that check.
3. install: pypa/installer, the reference implementation of the wheel spec pip follows, into the
   image's scheme: site-packages is the directory of the `packages.vllm` path (where the base's pip put
   vLLM), scripts, data and headers the same prefix's as pip's posix scheme puts them, console scripts
   with the image's interpreter in their shebang. installer writes RECORD (every file with its sha256
   and size, scripts as `../../../bin/NAME`), INSTALLER (`patchkit`) and REQUESTED (the definition asked
   for the project by name, as `pip install NAME` does); no direct_url.json, which pip writes only for a
   URL or path install. Nothing runs inside the image, and the image's Python compiles the bytecode on
   first import: no `.pyc` is written, the policy of every patched file (images.build), so this is
   `pip install --no-compile`. Modes are pip's under the default umask 022 (0644, 0755 for an executable
   member and a script; directories 0755), owner root, whatever the build machine's umask.

The layer gets the files and the directories the wheel creates below site-packages (the project's
package and dist-info folders); the scheme roots themselves (site-packages, bin) are the base's.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import io
import posixpath
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from installer import install as installer_install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.records import Hash, RecordEntry
from installer.scripts import Script
from installer.sources import WheelSource

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.images.definitions import Image, WheelPin
from patchkit.oci.layer import Entry
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.index import download, project_files
from patchkit.sources.release import ArchiveVanished
from patchkit.sources.verified_wheel import BadWheel, VerifiedWheel, open_wheel
from patchkit.untrusted import open_regular

INSTALLER = b"patchkit\n"
FILE_MODE, EXECUTABLE_MODE, DIR_MODE = 0o644, 0o755, 0o755   # pip's, under umask 022
# <prefix>/lib/pythonX.Y/{site,dist}-packages: a prefix scheme (a venv, /usr/local) or Debian's system
# Python installing into /usr/local (dist-packages), the only layouts whose scripts and interpreter follow.
_SITE = re.compile(r"^(?P<prefix>/.+)/lib/python(?P<version>3\.\d+)/(?P<kind>site|dist)-packages$")


# vLLM --load-format values whose loader imports a package a base need not have (weight_utils'
# instanttensor_weights_iterator: `import instanttensor`, else ImportError at weight load, minutes into a boot).
LOAD_FORMAT_PACKAGES = {"instanttensor": "instanttensor"}


class LoaderNotCarried(PatchkitError):
    """`--load-format` `load_format` imports the `package` that `image` does not pin among its wheels (its
    pinned wheels: `carried`) (exit 2): the boot would fail at weight load, minutes in."""

    def __init__(self, load_format: str, package: str, image: str, carried: tuple[str, ...]):
        self.load_format, self.package, self.image, self.carried = load_format, package, image, carried
        super().__init__(f"--load-format {load_format} imports the {package} package, which image {image} does not "
                         f"carry (its pinned wheels: {', '.join(carried) or 'none'}): serve a variant whose image "
                         f"pins [wheels.{package}], add it to images/{image}/image.toml, or leave the loader at its "
                         "default")


class UnknownInstallScheme(PatchkitError):
    """The `image`'s vLLM lies in `site`, which is no `<prefix>/lib/pythonX.Y/site-packages` or
    dist-packages, so where pip would install its pinned wheels cannot be told (exit 2)."""

    def __init__(self, image: str, site: str):
        self.image, self.site = image, site
        super().__init__(f"image {image}: cannot tell where pip installs from its site-packages {site} "
                         "(expected <prefix>/lib/pythonX.Y/site-packages or dist-packages)")


class InstalledTwice(PatchkitError):
    """Two wheels `image` pins, `first` and `second`, both install the file `path` (exit 2)."""

    def __init__(self, image: str, path: str, first: str, second: str):
        self.image, self.path, self.first, self.second = image, path, first, second
        super().__init__(f"image {image}: {path} is installed by both {first} and {second}")


def check_load_format(image: Image, load_format: str | None) -> None:
    """Refuse a loader whose package the image does not carry among its pinned wheels (exit 2)."""
    package = LOAD_FORMAT_PACKAGES.get(load_format or "")
    if load_format and package is not None and package not in image.wheels:
        raise LoaderNotCarried(load_format, package, image.name, tuple(sorted(image.wheels)))


class WheelPinMismatch(PatchkitError):
    """The index or the bytes on disk are not the file the image definition pins (exit 2): `where` (the
    index page, or the file on disk), the pinned `filename` and `pinned` sha256, the sha256 `found` there
    (None when the index lists no such file) and the files the index does `listed` for that version."""

    def __init__(self, where: str, filename: str, pinned: str, found: str | None, listed: tuple[str, ...] = ()):
        self.where, self.filename, self.pinned, self.found, self.listed = where, filename, pinned, found, listed
        if found is None:
            message = f"{where} lists no {filename} (its files of that version: {', '.join(listed) or 'none'})"
        elif listed:
            message = (f"{where} lists {filename} with sha256 {found}, the image definition pins {pinned}: refused, "
                       "nothing built (fix the pin from the index, or the index)")
        else:
            message = (f"{where}: its bytes hash to sha256 {found}, the image definition pins {pinned}: refused, "
                       "nothing built")
        super().__init__(message)


@dataclass(frozen=True)
class Scheme:
    """Where pip on the image's Python installs: the sysconfig scheme of its site-packages."""

    site: str
    scripts: str
    data: str
    include: str
    interpreter: str

    @classmethod
    def of(cls, image: Image) -> Scheme:
        site = posixpath.dirname(image.packages["vllm"].path)
        found = _SITE.match(site)
        if found is None:
            raise UnknownInstallScheme(image.name, site)
        prefix, version = found["prefix"], found["version"]
        # Debian's python3.X (dist-packages) is /usr/bin's; a prefix's own Python is in its bin/.
        interpreter = f"/usr/bin/python{version}" if found["kind"] == "dist" else f"{prefix}/bin/python{version}"
        return cls(site, f"{prefix}/bin", prefix, f"{prefix}/include/python{version}", interpreter)

    def paths(self, name: str) -> dict[str, str]:
        """installer's scheme names -> directories (headers as pip's: include/pythonX.Y/<project>)."""
        return {"purelib": self.site, "platlib": self.site, "scripts": self.scripts, "data": self.data,
                "headers": f"{self.include}/{name}"}


@dataclass(frozen=True)
class ExtraFile:
    path: str      # absolute image path
    data: bytes
    mode: int


@dataclass(frozen=True)
class InstalledWheel:
    name: str
    version: str
    filename: str
    sha256: str
    files: tuple[ExtraFile, ...]
    dirs: tuple[str, ...]          # absolute image paths of the directories it creates


@dataclass(frozen=True)
class ExtraLayer:
    """What the image's pinned wheels add to its layer; empty for an image without `[wheels]`."""

    wheels: tuple[InstalledWheel, ...] = ()

    @property
    def files(self) -> list[ExtraFile]:
        return [f for w in self.wheels for f in w.files]

    def entries(self) -> list[Entry]:
        """Their part of the build's one layer (images.new_layer): the wheels' directories, then their
        files (root-owned)."""
        return [*(Entry(d, "dir", mode=DIR_MODE) for w in self.wheels for d in w.dirs),
                *(Entry(f.path, "file", f.data, f.mode) for f in self.files)]

    def describe(self) -> list[str]:
        return [f"  W {w.name} {w.version} ({w.filename}, sha256 {w.sha256[:12]}): {len(w.files)} files"
                for w in self.wheels]


NO_EXTRAS = ExtraLayer()


def extra_layer(image: Image) -> ExtraLayer:
    """Every wheel the image pins, fetched, verified and installed; files installed twice are refused."""
    if not image.wheels:
        return NO_EXTRAS
    scheme = Scheme.of(image)
    installed = tuple(install(fetch(pin, image.platform), pin, image.platform, scheme)
                      for _, pin in sorted(image.wheels.items()))
    seen: dict[str, str] = {}
    for wheel in installed:
        for f in wheel.files:
            if f.path in seen:
                raise InstalledTwice(image.name, f.path, seen[f.path], wheel.name)
            seen[f.path] = wheel.name
    return ExtraLayer(installed)


def fetch(pin: WheelPin, platform: str) -> Path:
    """The pinned file in the user cache (downloaded once from the index); its bytes hash as pinned."""
    filename, sha256 = pin.files[platform]
    cache = ArchiveCache(default_cache_root() / "extras" / platform.replace("/", "-"))
    cached = cache.lookup(pin.name, pin.version)
    if cached is not None and (cached.path.name, cached.sha256) != (filename, sha256):
        cached = None  # another pin of this version (the definition changed): the index decides again
    if cached is None:
        page, files = project_files(pin.name)
        listed = next((f for f in files if f.filename == filename), None)
        if listed is None:
            names = tuple(sorted(f.filename for f in files if str(f.version) == pin.version))
            raise WheelPinMismatch(page, filename, sha256, None, names)
        if listed.sha256 != sha256:
            raise WheelPinMismatch(page, filename, sha256, listed.sha256 or "none", (filename,))
        cached = cache.adopt(pin.name, pin.version, filename, listed.url, sha256)
        if cached is None:
            with cache.new_archive(pin.name, pin.version, filename, listed.url, sha256) as out:
                download(listed, out, progress=False)
            cached = cache.lookup(pin.name, pin.version)
        if cached is None:
            raise ArchiveVanished(filename, cache.downloads)
    return cached.path


def install(path: Path, pin: WheelPin, platform: str, scheme: Scheme) -> InstalledWheel:
    """`path` verified whole and installed by pypa/installer into `scheme`, in memory."""
    filename, sha256 = pin.files[platform]
    _check_pin(path, _sha256(path), sha256)  # before any of it is inflated
    with open_wheel(path) as wheel:
        _check_pin(path, wheel.sha256, sha256)  # the bytes open_wheel verified and installs from
        destination = _LayerDestination(scheme.paths(pin.name), scheme.interpreter)
        try:
            installer_install(_VerifiedSource(wheel), destination, {"INSTALLER": INSTALLER, "REQUESTED": b""})
        # installer asserts on a malformed entry_points.txt; its other refusals are its own errors
        except (InstallerError, ValueError, AssertionError, configparser.Error, FileExistsError) as exc:
            raise BadWheel(path, "install", f"pypa/installer refuses it ({type(exc).__name__}: {exc})") from None
    files = tuple(ExtraFile(p, data, mode) for p, (data, mode) in sorted(destination.written.items()))
    return InstalledWheel(pin.name, pin.version, filename, sha256, files, _created_dirs(files, scheme.site))


def _sha256(path: Path) -> str:
    with open_regular(path, "archive") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_pin(path: Path, found: str, pinned: str) -> None:
    if found != pinned:
        raise WheelPinMismatch(str(path), path.name, pinned, found)


def _created_dirs(files: tuple[ExtraFile, ...], site: str) -> tuple[str, ...]:
    dirs = set()
    for f in files:
        parent = posixpath.dirname(f.path)
        while parent.startswith(site + "/"):
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    return tuple(sorted(dirs))


class _LayerDestination(SchemeDictionaryDestination):
    """installer's own scheme destination (its path checks, scripts and RECORD), with the file system step
    kept in memory: image path -> (bytes, mode)."""

    def __init__(self, scheme: dict[str, str], interpreter: str):
        super().__init__(scheme_dict=scheme, interpreter=interpreter, script_kind="posix", hash_algorithm="sha256",
                         bytecode_optimization_levels=())
        self.written: dict[str, tuple[bytes, int]] = {}

    def write_to_fs(self, scheme, path, stream, is_executable) -> RecordEntry:
        target = str(self._path_with_destdir(scheme, path))  # refuses a path outside the scheme's folder
        if target in self.written:
            raise FileExistsError(f"{target} written twice")
        data = stream.read()
        self.written[target] = (data, EXECUTABLE_MODE if is_executable else FILE_MODE)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
        return RecordEntry(path, Hash("sha256", digest), len(data))

    def write_script(self, name, module, attr, section) -> RecordEntry:
        # installer's own, less its stat and chmod of the written file (the mode is set above)
        script_name, data = Script(name, module, attr, section).generate(self.interpreter, self.script_kind)
        return self.write_to_fs("scripts", script_name, io.BytesIO(data), is_executable=True)


class _VerifiedSource(WheelSource):
    """installer's WheelSource over a VerifiedWheel: every member read back through its check, in the
    order installer's own WheelFile gives them, executable as pip judges it (the zip's mode bits)."""

    def __init__(self, wheel: VerifiedWheel):
        self.wheel = wheel
        project, version = wheel.dist_info.removesuffix(".dist-info").rsplit("-", 1)
        super().__init__(project, version)

    @property
    def dist_info_dir(self) -> str:
        return self.wheel.dist_info

    @property
    def data_dir(self) -> str:
        return self.wheel.dist_info.removesuffix(".dist-info") + ".data"

    @property
    def dist_info_filenames(self) -> list[str]:
        return [n[len(self.dist_info_dir) + 1:] for n in self.wheel.members if n.startswith(self.dist_info_dir + "/")]

    def read_dist_info(self, filename: str) -> str:
        name = f"{self.dist_info_dir}/{filename}"
        try:
            return self.wheel.read(name, "metadata").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadWheel(self.wheel.path, "metadata", f"not UTF-8 ({exc})", name) from None

    def validate_record(self, *, validate_contents: bool = True) -> None:
        """Done already: open_wheel verified every member against RECORD."""

    def get_contents(self) -> Iterator:
        record_name = f"{self.dist_info_dir}/RECORD"
        for name, member in self.wheel.members.items():
            mode = member.info.external_attr >> 16
            executable = bool(mode and stat.S_ISREG(mode) and mode & 0o111)
            row = (name, "", "") if name == record_name else (name, member.row.hash, member.row.size)
            yield row, io.BytesIO(self.wheel.read(name, "member")), executable
