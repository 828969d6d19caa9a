"""`ImageLayersSource`: the `patchkit.sources.base.ImageFiles` protocol over a base image's layers.

The planner asks for files one at a time (`read(package, path)`); this answers from the merged view of
the layers without unpacking the image: layers are streamed top-most first and a lookup stops at the
first layer that holds the path (or hides it with a whiteout, an opaque directory, or a non-directory
parent), so layers below the one holding the files are never fetched. A path that is absent stops at
the layer that installed its package when that install's dist-info RECORD does not list it (below).
Each layer read keeps a small listing of the paths that matter (the package trees, their ancestors and
the `*.dist-info/METADATA` and `RECORD` beside them) and the contents of the files asked for, so a layer is
streamed once when the build announces its files with `prefetch()` first (`read_many` announces its own).

Only regular files are read: a target that is a symlink or hard link in the base is refused (a patch
written through a link would change a file the anchors were never checked against).
"""

from __future__ import annotations

import csv
import io
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from patchkit.oci.base import BaseImage
from patchkit.oci.layer import Member, UnreadableLayer, iter_layer, normalize
from patchkit.oci.media import READABLE_LAYERS
from patchkit.sources.base import NotADistribution, NotARegularMember
from patchkit.sources.image_files import PackagePaths, PackageRoot
from patchkit.sources.installed_version import VERSION_MODULES, held_version
from patchkit.untrusted import InputTooLarge, limit_of, read_stream

_METADATA_RE = re.compile(r"^(?P<name>[^/]+)-(?P<version>[^/-]+)\.dist-info/METADATA$")
_RECORD_RE = re.compile(r"^(?P<name>[^/]+)-(?P<version>[^/-]+)\.dist-info/RECORD$")


@dataclass
class _Listing:
    entries: dict[str, Member] = field(default_factory=dict)
    whiteouts: set[str] = field(default_factory=set)
    opaque: set[str] = field(default_factory=set)
    content: dict[str, bytes] = field(default_factory=dict)


def _ancestors(name: str) -> Iterable[str]:
    while "/" in name:
        name = name.rsplit("/", 1)[0]
        yield name


class ImageLayersSource(PackagePaths):
    """A registry or layout base's files, read from its layers top-most first."""

    def __init__(self, base: BaseImage, packages: Iterable[PackageRoot]):
        self.base = base
        self.packages = {p.name: PackageRoot(p.name, normalize(p.root), p.distribution, p.declared, p.required)
                         for p in packages}
        self._roots = {p.root for p in self.packages.values()}
        self._sites = {posixpath.dirname(r) for r in self._roots}
        self._root_ancestors = {a for r in self._roots for a in _ancestors(r)}
        self._listings: dict[int, _Listing] = {}
        self._records: dict[str, set[str]] = {}
        self._wanted: set[str] = set()
        self._versions: dict[str, str] | None = None
        self.description = f"{base.name}@{base.digest} ({base.platform}) layers"

    # -- the ImageFiles protocol --------------------------------------------------------------------
    def read(self, package: str, path: str) -> bytes | None:
        name = self._path(package, path)
        if name is None:
            return None
        found = self._visible(name)
        if found is None:
            return None
        index, member = found
        if member.kind != "file":
            raise NotARegularMember(f"/{name}", f"a {member.kind}", f"layer {self._digest(index)} of {self.base.spec}")
        listing = self._listings[index]
        if name not in listing.content:
            self._wanted.add(name)
            self._scan(index)
            listing = self._listings[index]
        return listing.content[name]

    def prefetch(self, files: Iterable[tuple[str, str]]) -> None:
        """Announce the files the build will read, so each layer is streamed only once."""
        names = [n for package, path in files if (n := self._path(package, path))]
        self._wanted.update(names)
        for name in names:
            self._visible(name)

    def meta(self, image_path: str) -> Member | None:
        """The visible entry (mode, owner) at an image path inside or above the package trees."""
        found = self._visible(normalize(image_path))
        return found[1] if found else None

    def bytecode(self, package: str, path: str) -> list[str]:
        """The names the image's interpreter would load, and every bytecode file of the module the layers
        read so far (down to the module's own) show: `__pycache__/<stem>.*.pyc` and a legacy `<stem>.pyc`
        beside it. The layers are listed anyway, so this costs nothing, and it covers a path that names no
        interpreter."""
        name = self._path(package, path)
        if name is None or not name.endswith(".py"):
            return []
        folder, stem = posixpath.split(name[:-3])
        cache_dir = posixpath.join(folder, "__pycache__")
        candidates = {n for listing in self._listings.values() for n in listing.entries
                      if (posixpath.dirname(n) == cache_dir and posixpath.basename(n).startswith(stem + ".")
                          and n.endswith(".pyc")) or n == posixpath.join(folder, stem + ".pyc")}
        seen = {"/" + n for n in candidates if self._visible(n) is not None}
        return sorted(seen | set(super().bytecode(package, path)))

    # -- for the dry run ------------------------------------------------------------------------

    @property
    def layers_read(self) -> list[str]:
        """Digests of the layers streamed so far, top-most first."""
        return [self._digest(i) for i in sorted(self._listings, reverse=True)]

    # -- internals ------------------------------------------------------------------------------
    def _digest(self, index: int) -> str:
        return self.base.layers[index]["digest"]

    def _tracked(self, name: str) -> bool:
        if name in self._root_ancestors or name in self._roots:
            return True
        if any(name.startswith(root + "/") for root in self._roots):
            return True
        parent = posixpath.dirname(name)
        if parent in self._sites and name.endswith(".dist-info"):
            return True
        return posixpath.dirname(parent) in self._sites and name.endswith((".dist-info/METADATA", ".dist-info/RECORD"))

    def _visible(self, name: str) -> tuple[int, Member] | None:
        for index in reversed(range(len(self.base.layers))):
            listing = self._listings.get(index) or self._scan(index)
            member = listing.entries.get(name)
            if member is not None:
                return index, member
            if name in listing.whiteouts:
                return None
            if self._hidden_in(listing, name) or self._not_installed_below(name, index):
                return None
        return None

    @staticmethod
    def _hidden_in(listing: _Listing, name: str) -> bool:
        for parent in _ancestors(name):
            entry = listing.entries.get(parent)
            if parent in listing.whiteouts or parent in listing.opaque or (entry and entry.kind != "dir"):
                return True
        return False

    def _not_installed_below(self, name: str, index: int) -> bool:
        """True when package file `name` is absent from layer `index` and below: that layer installed the
        package (it holds the visible dist-info RECORD pip wrote for it), and RECORD does not list `name`.

        pip writes every file of an install into RECORD, and an upgrade uninstalls the old files first
        (whiteouts in the upgrading layer), so a package file missing from the install layer and from
        RECORD exists in no lower layer either: those layers, the CUDA, torch and OS gigabytes of a real
        base, need not be fetched to prove a path absent. A base without RECORD is read all the way down.
        """
        pkg = next((p for p in self.packages.values() if name.startswith(p.root + "/")), None)
        if pkg is None:
            return False
        site = posixpath.dirname(pkg.root)
        want = canonicalize_name(pkg.distribution)
        listing = self._listings[index]
        for entry in listing.content:
            m = _RECORD_RE.match(entry[len(site) + 1:]) if entry.startswith(site + "/") else None
            if not m or canonicalize_name(m.group("name")) != want:
                continue
            if any(entry in self._listings[i].whiteouts or self._hidden_in(self._listings[i], entry)
                   for i in range(index + 1, len(self.base.layers))):
                continue  # an upper layer removed this install's dist-info: RECORD speaks for nothing
            return name[len(site) + 1:] not in self._record(entry, listing)
        return False

    def _record(self, name: str, listing: _Listing) -> set[str]:
        if name not in self._records:
            rows = csv.reader(io.StringIO(listing.content[name].decode("utf-8", "replace")))
            try:
                self._records[name] = {posixpath.normpath(row[0]) for row in rows if row}
            except csv.Error as exc:  # a field past csv's own limit, a NUL
                raise NotADistribution(f"{self.base.spec}: /{name}", "not a RECORD csv", "a RECORD csv",
                                       str(exc)) from None
        return self._records[name]

    def _scan(self, index: int) -> _Listing:
        desc = self.base.layers[index]
        digest, media_type = desc["digest"], desc.get("mediaType", "")
        if media_type not in READABLE_LAYERS:
            raise UnreadableLayer(f"{digest} of {self.base.spec}",
                                  f"its media type is {media_type}; patchkit reads gzip or plain tar layers only")
        listing = _Listing()
        with self.base.open_blob(digest, desc["size"]) as stream:
            for member, tar, info in iter_layer(stream, f"{digest} of {self.base.spec}"):
                name = member.name
                if not self._tracked(name):
                    continue
                if member.kind == "whiteout":
                    listing.whiteouts.add(name)
                elif member.kind == "opaque":
                    listing.opaque.add(name)
                else:
                    listing.entries[name] = member
                    wanted, record = name in self._wanted, name.endswith(("/METADATA", "/RECORD"))
                    if member.kind == "file" and (wanted or record):
                        kind = "member" if wanted else "metadata"
                        what = f"{self.base.spec}: /{name} in layer {digest}"
                        if member.size > limit_of(kind):
                            raise InputTooLarge(what, kind, limit_of(kind), member.size)
                        body = tar.extractfile(info)
                        assert body is not None  # a regular file's member always has one
                        listing.content[name] = read_stream(body, kind, what)
            stream.finish()
        self._listings[index] = listing
        return listing

    def _version(self, pkg: PackageRoot) -> str | None:
        site = posixpath.dirname(pkg.root)
        want = canonicalize_name(pkg.distribution)
        self._visible(pkg.root)  # reads down to the layer that installed the package
        if pkg.declared:
            self._visible(f"{site}/{want.replace('-', '_')}-{pkg.declared}.dist-info/METADATA")
        found = self._dist_infos(site, want)
        if not found:  # not beside the package: only reading every layer can tell where it is
            for index in range(len(self.base.layers)):
                if index not in self._listings:
                    self._scan(index)
            found = self._dist_infos(site, want)
        if len(found) > 1:
            raise NotADistribution(f"{self.base.spec}: /{site}", f"several {pkg.distribution} installs", "one",
                                   ", ".join(sorted(found)))
        if not found and pkg.declared is None and not pkg.required:
            return None
        [where] = found or [f"{site}/{want.replace('-', '_')}-{pkg.declared or '<version>'}.dist-info/METADATA"]
        visible = self._visible(where) if found else None
        layer = visible[0] if visible is not None else None
        module = VERSION_MODULES.get(pkg.name)
        return held_version(self.base.spec, pkg.distribution, declared=pkg.declared, metadata_path="/" + where,
                            metadata=self._listings[layer].content[where] if layer is not None else None,
                            module_name=module, module=self._install_file(pkg, module, layer))

    def _install_file(self, pkg: PackageRoot, path: str | None, floor: int | None) -> bytes | None:
        """A file of the install whose METADATA is in layer `floor`, looked for there and above only (the
        layers already read): the install wrote it beside its dist-info, so no lower layer is fetched."""
        if not path or floor is None:
            return None
        name = self._path(pkg.name, path)
        if name is None or not any(name in self._listings[i].entries for i in range(floor, len(self.base.layers))):
            return None
        return self.read(pkg.name, path)

    def _dist_infos(self, site: str, want: str) -> dict[str, str]:
        """Visible `<site>/<dist>-<version>.dist-info/METADATA` of distribution `want` -> its Version."""
        found = {}
        for listing in list(self._listings.values()):
            for name in listing.entries:
                m = _METADATA_RE.match(name[len(site) + 1:]) if name.startswith(site + "/") else None
                if m and canonicalize_name(m.group("name")) == want and (visible := self._visible(name)):
                    found[name] = self._metadata_version(name, visible[0])
        return found

    def _metadata_version(self, name: str, index: int) -> str:
        """The Version of METADATA `name`, read from layer `index` (where it is visible)."""
        text = self._listings[index].content[name].decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
            if not line.strip():
                break
        raise NotADistribution(f"{self.base.spec}: /{name}", "no Version field", "a Version field", "none")
