"""`ContainerSource`: the `patchkit.sources.base.ImageFiles` protocol over the local engine's copy of a base image.

Files are read out of created, never started, containers of the base (`GET /containers/{id}/archive`,
one request per file: kilobytes, not the image). Nothing runs in them: an arm64 base reads the same on
any host. Each request is slow in the engine (podman 4 re-executes itself into the container's root for
every one: ~0.2 s here; a 404 is ~0.04 s) and an engine serialises requests on one container, so the
reads spread over a few containers, one request each at a time.

What was read is kept in the on-disk member cache (`sources.cache.FileCache`, content-addressed and
checked on every read) under the base's image id. An image id is the digest of the image's config, which
names the digest of every layer, so the files at a path under one id never change: a rebuild on the same
base (another variant, a new series) asks the engine for nothing and creates no container. What is kept
is the engine's own archive of each file, so its mode and owner are as checked as its bytes; the key's
listing adds the paths found absent. A cache can only make a build faster, never make it fail: a plan
that fails on anything the cache answered is made again from the engine alone (images.local).
"""

from __future__ import annotations

import io
import posixpath
import queue
import re
import tarfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Literal

from packaging.utils import canonicalize_name

from patchkit.engine import (
    EngineError,
    clear_command,
    engine_error,
    engine_refusals,
    engine_step,
    explain,
    run_labels,
)
from patchkit.errors import PatchkitError
from patchkit.oci.base import LocalBase
from patchkit.oci.layer import Member, normalize
from patchkit.sources.base import NotARegularMember
from patchkit.sources.cache import FileCache
from patchkit.sources.image_files import PackagePaths, PackageRoot
from patchkit.sources.installed_version import VERSION_MODULES, held_version
from patchkit.sources.metadata import version_py

READERS = 4          # containers read at once: the engine serialises requests on each one
ABSENT, PRESENT = "absent", "present"
READ_ATTEMPTS = 3    # an engine error on a read is retried on a new container (_get_archive)
GO_MODE_SYMLINK = 1 << 27    # os.ModeSymlink in the engine's path-stat header (Go's FileMode bits)


class NotAnImageId(PatchkitError):
    """The engine named the base by `image_id`, which is not a sha256 image id (exit 2)."""

    def __init__(self, image_id: str):
        self.image_id = image_id
        super().__init__(f"the engine named the base image {image_id!r}, which is not a sha256 image id")


class BytecodeUnknown(PatchkitError):
    """The module at `path` in the base `spec` lies under no pythonX.Y, so which bytecode its interpreter
    would run instead of it cannot be told without listing its __pycache__ through the engine (exit 2)."""

    def __init__(self, spec: str, path: str):
        self.spec, self.path = spec, path
        super().__init__(f"{spec}: {path} names no pythonX.Y, so the bytecode its interpreter would run instead "
                         "of it cannot be told without listing its __pycache__ through the engine; build without "
                         "--load (daemonless, from the base's layers, which lists them)")


_GARBLED = {"empty": "an empty archive", "misnamed": "{found!r}", "unreadable": "no readable archive"}


class GarbledArchive(PatchkitError):
    """What the engine sent (or the member cache kept) as its archive of `path` is not one regular file of
    that name (exit 2): the `problem` ("empty": no entry; "misnamed": its entry is `found`; "unreadable": no
    tar, `found` the reader's words)."""

    def __init__(self, path: str, problem: str, found: str = ""):
        self.path, self.problem, self.found = path, problem, found
        why = f" ({found})" if problem == "unreadable" else ""
        super().__init__(f"the engine sent {_GARBLED[problem].format(found=found)} for {path}{why}")


class ContainerRemoved(PatchkitError):
    """The `container` (its short id) made to read the base `spec` was removed, by something else than
    patchkit, while `path` was being read (exit 2): nothing was built."""

    def __init__(self, container: str, spec: str, path: str):
        self.container, self.spec, self.path = container, spec, path
        super().__init__(f"container {container}, made to read {spec}, was removed while {path} was being read: "
                         "nothing was built; run the build again")


class VersionUnknown(PatchkitError):
    """The base `spec` tells no version of `package`: no version `module` stating __version__ (None where
    patchkit knows none for it) and no version in the image file (exit 2)."""

    def __init__(self, spec: str, package: str, module: str | None):
        self.spec, self.package, self.module = spec, package, module
        super().__init__(f"{spec}: the {package} version is unknown (no {module} stating __version__ and no "
                         "version in the image file)")


def cache_key(image_id: str, platform) -> str:
    """The member cache's key for an engine image: its id's hex digest (ids are `sha256:<hex>`) and the
    platform read (Docker's containerd image store names a multi-platform image by its index digest)."""
    digest = image_id.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise NotAnImageId(image_id)
    return f"engine-image-{digest}-{str(platform).replace('/', '-')}"


class ContainerSource(PackagePaths):
    """The base's files as the engine holds them: from the member cache, else from containers of it."""

    def __init__(self, client, base: LocalBase, packages: Iterable[PackageRoot], cache: FileCache, *,
                 trust_cache: bool = True):
        self.client, self.base, self.cache = client, base, cache
        self.packages = {p.name: p for p in packages}
        self.received = 0                                               # bytes read from the engine
        self.requests = 0                                               # archive requests sent to it
        self.containers = 0                                             # containers created to read from
        self.from_cache = 0                                             # answers the cache gave
        self.description = f"{base.name} ({base.image_id[:19]}) in the local engine"
        self._key = cache_key(base.image_id, base.platform)
        self._where = f"the engine's {base.spec}"
        self._trust = trust_cache                                       # False: read all, refresh the cache
        self._listing = (cache.listing(self._key) or {}) if trust_cache else {}   # path -> ABSENT | PRESENT
        self._files: dict[str, tuple[Member, bytes] | None] = {}        # image path -> (entry, bytes)
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue = queue.SimpleQueue()             # created containers not reading now
        self._created: list = []
        self._making = 0

    # -- the ImageFiles protocol ------------------------------------------------------------------------
    def read(self, package: str, path: str) -> bytes | None:
        name = self._path(package, path)
        found = self._fetch("/" + name) if name else None
        return found[1] if found else None

    def prefetch(self, files: Iterable[tuple[str, str]]) -> None:
        """Everything the series may name, each version module and each declared version's METADATA, READERS
        at once: from the cache, else from the engine (a container is made only for a file the cache lacks)."""
        names = {"/" + n for package, path in files if (n := self._path(package, path))}
        names |= {"/" + normalize(f"{p.root}/{m}") for p in self.packages.values()
                  if (m := VERSION_MODULES.get(p.name))}
        names |= {self._metadata_path(p, p.declared) for p in self.packages.values() if p.declared}
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            list(pool.map(self._fetch, sorted(names)))

    def meta(self, image_path: str) -> Member | None:
        found = self._fetch(image_path)
        return found[0] if found else None

    def bytecode(self, package: str, path: str) -> list[str]:
        """The names the image's interpreter would load (`sources.image_files.bytecode_names`), the only bytecode
        that can run instead of the module, so `__pycache__` is not listed (through the engine that moves
        every pyc in it). A path that names no interpreter (no `pythonX.Y`) is refused: which names to
        stub cannot be told without that listing, and a stale pyc left to run is a wrong image."""
        names = super().bytecode(package, path)
        if path.endswith(".py") and not names:
            raise BytecodeUnknown(self.base.spec, self.image_path(package, path))
        return names

    def close(self) -> None:
        """Remove the containers made (also when the build failed), then keep what was learnt."""
        import docker

        try:
            for container in self._created:
                with self._step(f"removing container {container.id[:12]} (made to read {self.base.spec})",
                                refused=[f"`{clear_command()}` removes every container this run made (the next "
                                         "patchkit build does)"]):
                    try:
                        container.remove(force=True)
                    except docker.errors.NotFound:
                        pass
        finally:
            self._created.clear()
            self._remember()

    # -- reading ------------------------------------------------------------------------------------------
    def _fetch(self, name: str) -> tuple[Member, bytes] | None:
        with self._lock:
            if name in self._files:
                return self._files[name]
        found = self._cached(name)
        if found is None:
            found = self._from_engine(name)
        with self._lock:
            self._files[name] = found or None
        return found or None

    def _cached(self, name: str) -> tuple[Member, bytes] | Literal[False] | None:
        """(Member, bytes), False for a path known absent, None when the cache does not know it (or its
        entry is damaged: then it is read again)."""
        if not self._trust:
            return None
        found: tuple[Member, bytes] | Literal[False] | None
        if self._listing.get(name) == ABSENT:
            found = False
        else:
            raw = self.cache.get(self._key, name)
            try:
                found = self._entry(name, raw) if raw is not None else None
            except (GarbledArchive, NotARegularMember):
                found = None
        with self._lock:
            self.from_cache += found is not None
        return found

    def _entry(self, name: str, raw: bytes) -> tuple[Member, bytes]:
        """The one regular file in an archive the engine sent for `name`."""
        try:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
                info = tar.next()
                if info is None:
                    raise GarbledArchive(name, "empty")
                if not info.isreg():
                    raise NotARegularMember(name, f"a {_kind(info)}", self._where)
                if posixpath.basename(info.name.rstrip("/")) != posixpath.basename(name):
                    raise GarbledArchive(name, "misnamed", info.name)
                body = tar.extractfile(info)
                assert body is not None  # a regular file (checked above)
                data = body.read()
        except tarfile.TarError as exc:
            raise GarbledArchive(name, "unreadable", str(exc)) from None
        return Member(normalize(name), "file", info.mode, info.uid, info.gid, info.size), data

    def _from_engine(self, name: str) -> tuple[Member, bytes] | None:
        import docker

        using = [self._container()]               # the container reading (a retry takes a new one)
        raw: bytes | None
        try:
            with self._step(f"reading {name} from {self.base.spec}"):
                try:
                    chunks, stat = self._get_archive(using, name)
                    raw = b"".join(chunks)
                except docker.errors.NotFound:
                    self._still_there(using[0], name)         # a 404 also answers for a container that is gone
                    raw, stat = None, {}
        finally:
            self._idle.put(using[0])
        with self._lock:
            self.requests += 1
            self.received += len(raw or b"")
        if raw is None:
            with self._lock:
                self._listing[name] = ABSENT
            return None
        # The engine follows a final symlink when it archives a path; its path-stat header tells: Docker
        # names the link's target (else ""), podman the resolved path (the path itself for a plain file).
        target = (stat or {}).get("linkTarget") or ""
        if int((stat or {}).get("mode") or 0) & GO_MODE_SYMLINK or target not in ("", name):
            raise NotARegularMember(name, "a symbolic link", self._where, target)
        try:
            found = self._entry(name, raw)
        except (GarbledArchive, NotARegularMember):
            self._still_there(using[0], name)         # podman answers a removed container with an empty 200 too
            raise
        self.cache.put(self._key, name, raw)
        with self._lock:
            self._listing[name] = PRESENT
        return found

    def _get_archive(self, using: list, name: str):
        """The engine's archive of `name`; an engine error is retried on a new container. podman 4.3, with
        two builds reading one image at once, now and then cannot mount a container's storage again
        (`lstat .../merged: no such file or directory`); a new container of the image mounts."""
        import docker

        for attempt in range(READ_ATTEMPTS):
            try:
                return using[0].get_archive(name)
            except docker.errors.NotFound:
                raise
            except docker.errors.APIError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
            self._discard(using[0])
            using[0] = self._container()
        raise AssertionError("unreachable")

    def _discard(self, container) -> None:
        import docker

        with self._lock:
            self._created.remove(container)
        try:
            container.remove(force=True)
        except docker.errors.APIError:
            pass  # a container the engine cannot remove now carries this run's label: the next build removes it

    def _still_there(self, container, name: str) -> None:
        import docker

        with self._step(f"reading {name} from {self.base.spec}", refused=None):   # any other answer: it stopped
            try:
                self.client.api.inspect_container(container.id)
            except docker.errors.NotFound:
                raise ContainerRemoved(container.id[:12], self.base.spec, name) from None

    @contextmanager
    def _step(self, step: str, *, refused: Sequence[str] | None = ()) -> Iterator[None]:
        """One step of the reads under patchkit.engine's one fault policy. The engine refusing it (an
        engine_refusals() answer its caller did not handle, told apart before the rest) is an EngineError in
        the engine's own words naming the commands `refused` (None: taken for the engine stopping); any
        other engine fault is the engine stopping, named with the containers it may keep (_left)."""
        with engine_step(step, self._left, _gone):
            try:
                yield
            except engine_refusals() as exc:
                if refused is None:
                    raise
                raise engine_error(step, exc, refused) from None

    def _left(self) -> list[str]:
        """The containers the engine may keep of this run's reads, with the command removing them."""
        made = self.containers + self._making
        learnt = " ".join(c.id[:12] for c in self._created)
        return [] if not made else [
            f"the engine may keep the never-started containers this run made to read from ({made} created"
            f"{', ' + learnt if learnt else ''}; one whose create went unanswered too): `{clear_command()}` "
            "removes them (the next patchkit build does)"]

    def _container(self):
        """An idle container of the base; a new one while fewer than READERS were made (prefetch runs at
        most READERS readers, so a reader that finds none idle and none to make always gets one back)."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            make = len(self._created) + self._making < READERS
            self._making += make
        if not make:
            return self._idle.get()
        try:
            with self._step(f"creating a container of {self.base.spec} to read its files"):
                container = self.client.containers.create(
                    self.base.image_id, command=["/patchkit-never-runs"], entrypoint=[], network_disabled=True,
                    labels=run_labels(), platform=str(self.base.platform))
        finally:
            with self._lock:
                self._making -= 1
        with self._lock:
            self._created.append(container)
            self.containers += 1
        return container

    def _remember(self) -> None:
        """Write what this build learnt to the cache's listing (merged with what other builds wrote)."""
        with self._lock:
            known = dict(self._listing)
        on_disk = self.cache.listing(self._key) or {}
        if not known.items() <= on_disk.items():
            self.cache.put_listing(self._key, {**on_disk, **known})

    # -- versions -----------------------------------------------------------------------------------------
    def _metadata_path(self, pkg: PackageRoot, version: str) -> str:
        site = posixpath.dirname("/" + normalize(pkg.root))
        return f"{site}/{canonicalize_name(pkg.distribution).replace('-', '_')}-{version}.dist-info/METADATA"

    def _version(self, pkg) -> str | None:
        """The one rule (sources.installed_version) over the package's version module and the
        `<dist>-<version>.dist-info/METADATA` beside it, at the version declared, else the one the module
        states, else that plus the `cu<CUDA>` suffix vLLM's setup.py appends for the image's CUDA_VERSION:
        listing site-packages through the engine would move all of it."""
        module = VERSION_MODULES.get(pkg.name)
        found = self._fetch("/" + normalize(f"{pkg.root}/{module}")) if module else None
        stated = version_py(found[1]) if found else None
        if not pkg.declared and stated is None:
            if self._fetch("/" + normalize(f"{pkg.root}/__init__.py")) is None and not pkg.required:
                return None
            raise VersionUnknown(self.base.spec, pkg.name, module)
        if pkg.declared:
            candidates = [pkg.declared]
        else:
            assert stated is not None  # refused just above when neither is known
            candidates = [stated, *self._suffixed(stated)]
        metadata = None
        for version in candidates:
            if (metadata := self._fetch(self._metadata_path(pkg, version))) is not None:
                break
        return held_version(self.base.spec, pkg.distribution, declared=pkg.declared,
                            metadata_path=self._metadata_path(pkg, version), metadata=metadata and metadata[1],
                            module_name=module, module=found and found[1])

    def _suffixed(self, version: str) -> list[str]:
        """`version` with the CUDA suffix vLLM's setup.py appends (`cu` + the CUDA_VERSION the nvidia/cuda
        base images set, major and minor: 13.0.1 -> cu130), the one suffix the engine's config can tell."""
        with self._step(f"inspecting {self.base.spec}"):
            env = self.client.api.inspect_image(self.base.image_id).get("Config", {}).get("Env") or []
        cuda = next((e.split("=", 1)[1] for e in env if isinstance(e, str) and e.startswith("CUDA_VERSION=")), "")
        digits = "".join(cuda.split(".")[:2])
        sep = "." if "+" in version else "+"
        return [f"{version}{sep}cu{digits[:3]}"] if digits.isdigit() else []


def _gone(step: str, exc: BaseException, clean: Sequence[str]) -> EngineError:
    """A read's step the engine stopped answering (its transport's fault: patchkit.engine.engine_faults)."""
    return EngineError(step, exc.__class__.__name__,
                       f"the engine stopped answering ({explain(exc, 300)}); no image was built", clean)


def _kind(info: tarfile.TarInfo) -> str:
    return "directory" if info.isdir() else "link" if info.issym() or info.islnk() else "special file"
