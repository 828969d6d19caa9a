"""Image definitions: `images/<name>/image.toml`, one per checkpoint variant, validated once.

An image is a base image pinned by digest plus a patch series, an environment and labels. A child
image names a `parent` and inherits everything from it, adding patches (`series.add`), environment
and labels; it may also replace the base or the package table. Every choice carries a `why`, because
the file is where a reader learns why the image is what it is.

```toml
schema = 1
name = "glm53-flash-nvfp4-4p67"           # must equal the folder name
title = "one line"
parent = "glm53-flash-nvfp4-lab"          # optional
why = "why this image exists (and why this parent)"

[base]                                    # required in a root image
ref = "vllm/vllm-openai:TAG@sha256:<64 hex>"   # the tag is for people; the digest is what is built
platform = "linux/arm64"
source = "where the digest comes from"
why = "..."

[packages.vllm]                           # required in a root image; also [packages.flashinfer]
path = "/usr/local/lib/python3.12/dist-packages/vllm"   # the package directory inside the image
version = "0.1.dev20051+g487ecf187"       # what the base carries (checked against its METADATA)
layout = "0.30.0"                         # optional: the release whose files it matches (see below)
why = "..."

[series]
patches = ["nope-mla-pad", ...]           # root image: the full list, in application order
add = ["packed-modules-4p67"]             # child image: added to the parent's (not both)
why = "..."

[env]
why = "..."
vars = { TORCH_CUDA_ARCH_LIST = "12.1a", ... }

[labels]
"org.opencontainers.image.title" = "..."

[wheels.instanttensor]                    # optional: extra wheels installed into the layer (images.extras)
version = "0.2.2"                         # a child image inherits its parent's, and may add or replace one
why = "..."
files."linux/arm64" = { filename = "instanttensor-0.2.2-cp312-...-manylinux_2_28_aarch64.whl", sha256 = "<64 hex>" }
```

`wheels` (checked in images/wheel_pins.py): each file is named exactly as the index lists it and pinned
by the sha256 of the whole file;
the build takes the one for the image's platform (its tags must suit that platform and the Python of the
`packages.vllm` path), so the definition says which bytes the image carries.

`layout`: a base built from a development snapshot reports a version such as `0.1.dev20051+g487ecf187`,
which sorts below every release, so no patch range (`>=0.30.0,<0.34`) would include it. `layout` names
the release whose file layout the snapshot matches; the engine evaluates ranges against it. It is a
claim about which patches are meant for the base, never a licence to skip checks: every anchor is
still asserted against the base's real files, so a wrong claim fails the build with the engine's
diagnostic. It applies only to the base named here: a different `--base` is judged by its own METADATA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from patchkit import tomlschema
from patchkit.errors import PatchkitError
from patchkit.images.schema import ImageFile, InvalidImageFile
from patchkit.images.wheel_pins import WheelPin, pinned_wheels
from patchkit.patching.patchset import InvalidSeries, Patch, PatchSet, UnknownPatch
from patchkit.patching.series import FULL_SERIES
from patchkit.sources.base import DISTRIBUTIONS
from patchkit.tomlschema import NoDefinitionFiles

IMAGE_FILE = "image.toml"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BASE_RE = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
PLATFORMS = ("linux/arm64",)

# The DGX Spark GB10 target (compute capability 12.1, sm_121a) for the kernels vLLM, FlashInfer and
# CuTe DSL compile at run time; every image carries them (field reference, 4p67 recipe).
ARCH_ENV = {
    "TORCH_CUDA_ARCH_LIST": "12.1a",
    "FLASHINFER_CUDA_ARCH_LIST": "12.1f",
    "CUTE_DSL_ARCH": "sm_121a",
    "CMAKE_CUDA_ARCHITECTURES": "121",
}


@dataclass(frozen=True)
class PackageSpec:
    name: str              # import package: vllm, flashinfer
    path: str              # absolute directory inside the image
    version: str | None    # what the base carries (None: read from the image's METADATA)
    layout: str | None     # release whose layout it matches, for patch ranges
    why: str

    @property
    def distribution(self) -> str:
        return DISTRIBUTIONS[self.name]


@dataclass(frozen=True)
class Image:
    name: str
    title: str
    folder: Path
    parent: str | None
    base: str                       # name:tag@sha256:... exactly as written
    base_source: str
    platform: str
    packages: dict[str, PackageSpec]
    series: tuple[str, ...]         # effective, in application order
    env: dict[str, str]
    labels: dict[str, str]
    why: dict[str, str] = field(default_factory=dict)   # "image", "base", "series", "env", "packages.vllm"
    wheels: dict[str, WheelPin] = field(default_factory=dict)   # extra wheels, by project name

    @property
    def base_digest(self) -> str:
        m = BASE_RE.match(self.base)
        if m is None:  # loading a definition checks it; an Image made otherwise may not hold one
            raise InvalidImageFile(self.folder / IMAGE_FILE, "[base], key 'ref'", "base-ref",
                                   f"base {self.base!r} is not name@sha256:<64 hex digits>")
        return m["digest"]

    def engine_versions(self) -> dict[str, str]:
        """The `versions=` the engine gets for this image's own base: each declared layout."""
        return {p.name: p.layout for p in self.packages.values() if p.layout}


def load_images(images_dir: Path | str, patchset: PatchSet) -> dict[str, Image]:
    """Every images/*/image.toml, resolved (inheritance) and validated against the patch set."""
    images_dir = Path(images_dir)
    raw = {p.parent.name: (p, _read(p)) for p in sorted(images_dir.glob(f"*/{IMAGE_FILE}"))}
    if not raw:
        raise NoDefinitionFiles(images_dir, IMAGE_FILE)
    resolved: dict[str, Image] = {}
    for name in raw:
        _resolve(name, raw, images_dir, patchset, resolved, ())
    return resolved


class UnknownImage(PatchkitError):
    """An image name no image.toml defines (exit 2): the `name` asked for, the `images_dir` looked in (None
    when the images were loaded elsewhere) and the `known` image names there."""

    def __init__(self, name: str, images_dir: Path | str | None, known: tuple[str, ...]):
        self.name, self.images_dir, self.known = name, images_dir, tuple(known)
        where = f"{images_dir} has" if images_dir is not None else "the images are"
        super().__init__(f"unknown image {name!r}; {where}: {', '.join(known)}")


class UnknownSeries(PatchkitError):
    """A series name that is neither the full series nor an image (exit 2): the `name` asked for, the
    `images_dir` looked in and the `known` image names there (each names its image's series)."""

    def __init__(self, name: str, images_dir: Path | str, known: tuple[str, ...]):
        self.name, self.images_dir, self.known = name, images_dir, tuple(known)
        super().__init__(f"unknown series {name!r}: use {FULL_SERIES!r} or an image name of {images_dir} "
                         f"({', '.join(known) or 'none'})")


class PatchEnvMismatch(PatchkitError):
    """An image whose environment disagrees with a patch's [image] env (exit 2): `where` (the image file),
    the `patch`, the variable `key` and the value the patch `wanted` there (None when the patch is not in
    the series, so the variable must go)."""

    def __init__(self, where: str, patch: str, key: str, wanted: str | None):
        self.where, self.patch, self.key, self.wanted = where, patch, key, wanted
        super().__init__(f"{where}: the series has {patch}, whose code reads {key}: set it to {wanted!r}"
                         if wanted is not None else
                         f"{where}: {key} switches {patch}, which is not in the series: remove it")


def load_image(images_dir: Path | str, name: str, patchset: PatchSet) -> Image:
    images = load_images(images_dir, patchset)
    if name not in images:
        raise UnknownImage(name, images_dir, tuple(sorted(images)))
    return images[name]


def _read(path: Path) -> ImageFile:
    doc = tomlschema.load(path, ImageFile)
    if doc.name != path.parent.name:
        raise InvalidImageFile(path, "key 'name'", "folder-name",
                               f"name {doc.name!r} must equal the folder name {path.parent.name!r}")
    if not NAME_RE.match(path.parent.name):
        raise InvalidImageFile(path, "key 'name'", "image-name", f"image name {path.parent.name!r} must be "
                               "lower-case letters, digits, '.', '_' or '-'")
    return doc


def _resolve(name: str, raw: dict[str, tuple[Path, ImageFile]], images_dir: Path, patchset: PatchSet, done: dict,
             chain: tuple) -> Image:
    if name in done:
        return done[name]
    if name in chain:
        raise InvalidImageFile(raw[chain[-1]][0], "key 'parent'", "cycle",
                               f"image inheritance cycle: {' -> '.join((*chain, name))}")
    if name not in raw:
        raise InvalidImageFile(raw[chain[-1]][0], "key 'parent'", "parent",
                               f"parent {name!r} has no {images_dir}/{name}/{IMAGE_FILE}")
    path, doc = raw[name]
    parent = None
    if doc.parent is not None:
        if doc.parent == name:
            raise InvalidImageFile(path, "key 'parent'", "parent", f"parent must name another image, not {name!r}")
        parent = _resolve(doc.parent, raw, images_dir, patchset, done, (*chain, name))

    why = {"image": doc.why}
    base_ref, base_source, platform = _base(doc, parent, path, why)
    packages = _packages(doc, parent, path, why)
    series = _series(doc, parent, patchset, path, why)
    env = _env(doc, parent, series, patchset, path, why)
    labels = {**(parent.labels if parent else {}), **doc.labels}
    wheels = {**(parent.wheels if parent else {}), **pinned_wheels(doc, platform, packages["vllm"].path, path)}
    image = Image(name=name, title=doc.title, folder=path.parent, parent=doc.parent, base=base_ref,
                  base_source=base_source, platform=platform, packages=packages, series=series, env=env,
                  labels=labels, why=why, wheels=wheels)
    done[name] = image
    return image


def _base(doc: ImageFile, parent: Image | None, where: Path, why: dict) -> tuple[str, str, str]:
    table = doc.base
    if table is None:
        if parent is None:
            raise InvalidImageFile(where, "[base]", "missing-table", "[base] is required (or name a parent image)")
        why["base"] = parent.why.get("base", "")
        return parent.base, parent.base_source, parent.platform
    if not BASE_RE.match(table.ref):
        raise InvalidImageFile(where, "[base], key 'ref'", "base-ref", f"{table.ref!r} must be pinned by digest "
                               "(NAME[:TAG]@sha256:<64 hex>): a tag alone moves, and what is patched would change with it")
    if table.platform not in PLATFORMS:
        raise InvalidImageFile(where, "[base], key 'platform'", "platform",
                               f"platform {table.platform!r} is not one of {PLATFORMS}")
    why["base"] = table.why
    return table.ref, table.source, table.platform


def _packages(doc: ImageFile, parent: Image | None, where: Path, why: dict) -> dict[str, PackageSpec]:
    table = doc.packages
    if table is None:
        if parent is None:
            raise InvalidImageFile(where, "[packages.vllm]", "missing-table",
                                   "[packages.vllm] is required (or name a parent image)")
        why.update({k: v for k, v in parent.why.items() if k.startswith("packages.")})
        return dict(parent.packages)
    if "vllm" not in table:
        raise InvalidImageFile(where, "[packages.vllm]", "missing-table",
                               f"[packages.vllm] is required (found only {', '.join(sorted(table))})")
    out = {}
    for pkg, spec in table.items():
        at = f"[packages.{pkg}]"
        if pkg not in DISTRIBUTIONS:
            raise InvalidImageFile(where, at, "unknown-package", f"unknown package {pkg!r}; patchkit knows "
                                   f"{', '.join(DISTRIBUTIONS)}")
        pure = PurePosixPath(spec.path)
        if not pure.is_absolute() or ".." in pure.parts or pure.name != pkg:
            raise InvalidImageFile(where, f"{at}, key 'path'", "package-path",
                                   f"{spec.path!r} must be the absolute directory of the {pkg} package")
        if pkg == "vllm" and spec.version is None:
            raise InvalidImageFile(where, at, "version", "missing required key `version` (the vLLM version inside the base)")
        for key, value in (("version", spec.version), ("layout", spec.layout)):
            if value is not None:
                try:
                    Version(value)
                except InvalidVersion:
                    raise InvalidImageFile(where, f"{at}, key {key!r}", "version",
                                           f"{value!r} is not a PEP 440 version") from None
        if spec.layout is not None and Version(spec.layout).is_prerelease:
            raise InvalidImageFile(where, f"{at}, key 'layout'", "layout",
                                   f"{spec.layout!r} must name a release, not a pre- or dev release")
        why[f"packages.{pkg}"] = spec.why
        out[pkg] = PackageSpec(pkg, str(pure), spec.version, spec.layout, spec.why)
    return out


def _series(doc: ImageFile, parent: Image | None, patchset: PatchSet, where: Path, why: dict) -> tuple[str, ...]:
    table = doc.series
    why["series"] = table.why
    if parent is None:
        if table.add is not None or table.patches is None:
            raise InvalidImageFile(where, "[series]", "series",
                                   "a root image lists its series as patches = [...] (add = needs a parent)")
        if not table.patches:
            raise InvalidImageFile(where, "[series], key 'patches'", "series",
                                   "patches is empty: an image without patches is its base")
        return tuple(p.id for p in _checked(patchset, table.patches, where, "[series], key 'patches'"))
    if table.patches is not None or table.add is None:
        raise InvalidImageFile(where, "[series]", "series", "a child image extends its parent's series with add = [...]")
    again = sorted(set(table.add) & set(parent.series))
    if again:
        raise InvalidImageFile(where, "[series], key 'add'", "series", f"{again} already in the series of parent {parent.name}")
    for pid in table.add:
        _checked(patchset, [pid], where, "[series], key 'add'")
    order = {pid: i for i, pid in enumerate(patchset.order)}
    ids = sorted([*parent.series, *table.add], key=order.__getitem__)
    return tuple(p.id for p in _checked(patchset, ids, where, "[series], key 'add'"))


def _checked(patchset: PatchSet, ids: list[str], where: Path, at: str):
    """The patch set's own refusal (unknown ids, out of application order), placed in the image file."""
    try:
        return patchset.series(ids)
    except (UnknownPatch, InvalidSeries) as exc:
        raise InvalidImageFile(where, at, "series", str(exc)) from None


def _env(doc: ImageFile, parent: Image | None, series: tuple[str, ...], patchset: PatchSet, where: Path,
         why: dict) -> dict[str, str]:
    table = doc.env
    env = dict(parent.env) if parent else {}
    if table is None:
        if parent is None:
            raise InvalidImageFile(where, "[env]", "missing-table", "[env] is required (or name a parent image)")
        why["env"] = parent.why.get("env", "")
    else:
        why["env"] = table.why
        for key, value in table.vars.items():
            if not ENV_NAME_RE.match(key):
                raise InvalidImageFile(where, f"[env.vars], key {key!r}", "env-name",
                                       f"environment names are identifiers, not {key!r}")
            env[key] = value
    for key, value in ARCH_ENV.items():
        if env.get(key) != value:
            raise InvalidImageFile(where, f"[env.vars], key {key!r}", "arch-env",
                                   f"{key} must be {value!r} (the GB10 sm_121a target), found {env.get(key)!r}")
    # A patch's runtime switches (its patch.toml [image] env) are set exactly when the patch is in the
    # series: a switch without its code (or code without its switch) is an image that says one thing and
    # does another.
    for patch in patchset.series():
        for key, value in patch.image_env.items():
            if patch.id in series and env.get(key) != value:
                raise PatchEnvMismatch(f"{where}: [env]", patch.id, key, value)
            if patch.id not in series and key in env:
                raise PatchEnvMismatch(f"{where}: [env]", patch.id, key, None)
    return env


def series_named(name: str | None, images_dir: Path | str, patchset: PatchSet) -> list[Patch]:
    """A series by its name: FULL_SERIES (or None) is the whole patch set, any other name the series of that
    image of `images_dir` (parents included), each in application order. The patch set is the caller's
    (read once from its folder), so one command reads each file once."""
    if name in (None, FULL_SERIES):
        return patchset.series()
    images_dir = Path(images_dir)
    if not (images_dir / name / IMAGE_FILE).is_file():
        raise UnknownSeries(name, images_dir, tuple(sorted(p.parent.name for p in images_dir.glob(f"*/{IMAGE_FILE}"))))
    return patchset.series(load_images(images_dir, patchset)[name].series)


def every_series(images_dir: Path | str | None, patchset: PatchSet) -> dict[str, tuple[str, ...]]:
    """Each image's series by image name; the full series alone (FULL_SERIES) when there are no image
    definitions (a patch set checked on its own)."""
    if images_dir is None or not any(Path(images_dir).glob(f"*/{IMAGE_FILE}")):
        return {FULL_SERIES: patchset.order}
    return {name: image.series for name, image in sorted(load_images(images_dir, patchset).items())}


def mirrors(images: dict[str, Image], prefix: str, name: str | None = None) -> list[tuple[str, str]]:
    """(source, mirror) for each distinct base (or the one of image `name`): the source as pinned with
    the tag dropped (skopeo refuses tag+digest), the mirror the same digest under `prefix` (e.g.
    ghcr.io/owner), so a digest-preserving copy keeps what the image file pins. CI copies each base
    once into its own registry (`patchkit mirrors PREFIX [IMAGE]`), and every image build then mounts
    the base layers from there."""
    if name is not None and name not in images:
        raise UnknownImage(name, None, tuple(sorted(images)))
    chosen = [images[name]] if name is not None else list(images.values())
    out = []
    for base in sorted({i.base for i in chosen}):
        ref, digest = base.split("@")
        repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        out.append((f"{repo}@{digest}", f"{prefix}/{repo.rsplit('/', 1)[-1]}@{digest}"))
    return out

