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
```

`layout`: a base built from a development snapshot reports a version such as `0.1.dev20051+g487ecf187`,
which sorts below every release, so no patch range (`>=0.30.0,<0.34`) would include it. `layout` names
the release whose file layout the snapshot matches; the engine evaluates ranges against it. It is a
claim about which patches are meant for the base, never a licence to skip checks: every anchor is
still asserted against the base's real files, so a wrong claim fails the build with the engine's
diagnostic. It applies only to the base named here: a different `--base` is judged by its own METADATA.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from patchkit import CHECKOUT
from patchkit.errors import PatchkitError
from patchkit.patching.patchset import PatchSet
from patchkit.sources.base import DISTRIBUTIONS

IMAGE_FILE = "image.toml"
SCHEMA = 1
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
# Runtime switches a patch's code reads: set exactly when the patch is in the series, since a switch
# without its code (or code without its switch) is an image that says one thing and does another.
PATCH_ENV = {"nope-mla-pad": {"VLLM_MLA_NOPE_PAD_ROPE": "1"}}

_TOP_KEYS = {"schema", "name", "title", "parent", "why", "base", "packages", "series", "env", "labels"}


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

    @property
    def base_digest(self) -> str:
        return BASE_RE.match(self.base)["digest"]

    def engine_versions(self) -> dict[str, str]:
        """The `versions=` the engine gets for this image's own base: each declared layout."""
        return {p.name: p.layout for p in self.packages.values() if p.layout}


def default_images_dir() -> Path:
    return CHECKOUT / "images"


def load_images(images_dir: Path | str, patchset: PatchSet) -> dict[str, Image]:
    """Every images/*/image.toml, resolved (inheritance) and validated against the patch set."""
    images_dir = Path(images_dir)
    raw = {p.parent.name: _read(p) for p in sorted(images_dir.glob(f"*/{IMAGE_FILE}"))}
    if not raw:
        raise PatchkitError(f"no {IMAGE_FILE} under {images_dir}")
    resolved: dict[str, Image] = {}
    for name in raw:
        _resolve(name, raw, images_dir, patchset, resolved, ())
    return resolved


def load_image(images_dir: Path | str, name: str, patchset: PatchSet) -> Image:
    images = load_images(images_dir, patchset)
    if name not in images:
        raise PatchkitError(f"unknown image {name!r}; {images_dir} has: {', '.join(sorted(images))}")
    return images[name]


def _read(path: Path) -> dict:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PatchkitError(f"{path}: {exc}") from None
    where = str(path)
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise PatchkitError(f"{where}: unknown keys {unknown}")
    if doc.get("schema") != SCHEMA:
        raise PatchkitError(f"{where}: schema must be {SCHEMA}")
    if doc.get("name") != path.parent.name:
        raise PatchkitError(f"{where}: name {doc.get('name')!r} must equal the folder name {path.parent.name!r}")
    if not NAME_RE.match(path.parent.name):
        raise PatchkitError(f"{where}: image name must be lower-case letters, digits, '.', '_' or '-'")
    for key in ("title", "why"):
        _text(doc, key, where)
    doc["__path__"] = path
    return doc


def _resolve(name: str, raw: dict, images_dir: Path, patchset: PatchSet, done: dict, chain: tuple) -> Image:
    if name in done:
        return done[name]
    if name in chain:
        raise PatchkitError(f"image inheritance cycle: {' -> '.join((*chain, name))}")
    if name not in raw:
        raise PatchkitError(f"{raw[chain[-1]]['__path__']}: parent {name!r} has no {images_dir}/{name}/{IMAGE_FILE}")
    doc = raw[name]
    path: Path = doc["__path__"]
    where = str(path)
    parent_name = doc.get("parent")
    parent = None
    if parent_name is not None:
        if not isinstance(parent_name, str) or parent_name == name:
            raise PatchkitError(f"{where}: parent must name another image")
        parent = _resolve(parent_name, raw, images_dir, patchset, done, (*chain, name))

    why = {"image": doc["why"]}
    base_ref, base_source, platform = _base(doc, parent, where, why)
    packages = _packages(doc, parent, where, why)
    series = _series(doc, parent, patchset, where, why)
    env = _env(doc, parent, series, where, why)
    labels = dict(parent.labels) if parent else {}
    extra = doc.get("labels", {})
    if not isinstance(extra, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        raise PatchkitError(f"{where}: [labels] must map strings to strings")
    labels.update(extra)
    image = Image(name=name, title=doc["title"], folder=path.parent, parent=parent_name, base=base_ref,
                  base_source=base_source, platform=platform, packages=packages, series=series, env=env,
                  labels=labels, why=why)
    done[name] = image
    return image


def _base(doc: dict, parent: Image | None, where: str, why: dict) -> tuple[str, str, str]:
    table = doc.get("base")
    if table is None:
        if parent is None:
            raise PatchkitError(f"{where}: [base] is required (or name a parent image)")
        why["base"] = parent.why.get("base", "")
        return parent.base, parent.base_source, parent.platform
    _keys(table, {"ref", "platform", "source", "why"}, f"{where} [base]")
    ref = _text(table, "ref", f"{where} [base]")
    if not BASE_RE.match(ref):
        raise PatchkitError(f"{where} [base]: ref {ref!r} must be pinned by digest (NAME[:TAG]@sha256:<64 hex>): "
                            "a tag alone moves, and what is patched would change with it")
    platform = _text(table, "platform", f"{where} [base]")
    if platform not in PLATFORMS:
        raise PatchkitError(f"{where} [base]: platform {platform!r} is not one of {PLATFORMS}")
    why["base"] = _text(table, "why", f"{where} [base]")
    return ref, _text(table, "source", f"{where} [base]"), platform


def _packages(doc: dict, parent: Image | None, where: str, why: dict) -> dict[str, PackageSpec]:
    table = doc.get("packages")
    if table is None:
        if parent is None:
            raise PatchkitError(f"{where}: [packages.vllm] is required (or name a parent image)")
        why.update({k: v for k, v in parent.why.items() if k.startswith("packages.")})
        return dict(parent.packages)
    if not isinstance(table, dict) or "vllm" not in table:
        raise PatchkitError(f"{where}: [packages.vllm] is required")
    out = {}
    for pkg, spec in table.items():
        at = f"{where} [packages.{pkg}]"
        if pkg not in DISTRIBUTIONS:
            raise PatchkitError(f"{at}: unknown package; patchkit knows {', '.join(DISTRIBUTIONS)}")
        _keys(spec, {"path", "version", "layout", "why"}, at)
        path = _text(spec, "path", at)
        pure = PurePosixPath(path)
        if not pure.is_absolute() or ".." in pure.parts or pure.name != pkg:
            raise PatchkitError(f"{at}: path {path!r} must be the absolute directory of the {pkg} package")
        version = spec.get("version")
        if pkg == "vllm" and version is None:
            raise PatchkitError(f"{at}: version is required (the vLLM version inside the base)")
        layout = spec.get("layout")
        for key, value in (("version", version), ("layout", layout)):
            if value is not None:
                try:
                    Version(value)
                except (InvalidVersion, TypeError):
                    raise PatchkitError(f"{at}: {key} {value!r} is not a PEP 440 version") from None
        if layout is not None and Version(layout).is_prerelease:
            raise PatchkitError(f"{at}: layout {layout!r} must name a release")
        why[f"packages.{pkg}"] = _text(spec, "why", at)
        out[pkg] = PackageSpec(pkg, str(pure), version, layout, spec["why"])
    return out


def _series(doc: dict, parent: Image | None, patchset: PatchSet, where: str, why: dict) -> tuple[str, ...]:
    table = doc.get("series")
    at = f"{where} [series]"
    if not isinstance(table, dict):
        raise PatchkitError(f"{at} is required")
    _keys(table, {"patches", "add", "why"}, at)
    why["series"] = _text(table, "why", at)
    if parent is None:
        if "add" in table or "patches" not in table:
            raise PatchkitError(f"{at}: a root image lists its series as patches = [...] (add = needs a parent)")
        ids = _ids(table["patches"], at)
        if not ids:
            raise PatchkitError(f"{at}: patches is empty: an image without patches is its base")
        return tuple(p.id for p in _checked(patchset, ids, at))
    if "patches" in table or "add" not in table:
        raise PatchkitError(f"{at}: a child image extends its parent's series with add = [...]")
    added = _ids(table["add"], at)
    again = sorted(set(added) & set(parent.series))
    if again:
        raise PatchkitError(f"{at}: {again} already in the series of parent {parent.name}")
    for pid in added:
        _checked(patchset, [pid], at)
    order = {pid: i for i, pid in enumerate(patchset.order)}
    ids = sorted([*parent.series, *added], key=order.__getitem__)
    return tuple(p.id for p in _checked(patchset, ids, at))


def _checked(patchset: PatchSet, ids: list[str], at: str):
    try:
        return patchset.series(ids)
    except PatchkitError as exc:
        raise PatchkitError(f"{at}: {exc}") from None


def _env(doc: dict, parent: Image | None, series: tuple[str, ...], where: str, why: dict) -> dict[str, str]:
    table = doc.get("env")
    at = f"{where} [env]"
    env = dict(parent.env) if parent else {}
    if table is None:
        if parent is None:
            raise PatchkitError(f"{at} is required")
        why["env"] = parent.why.get("env", "")
    else:
        _keys(table, {"why", "vars"}, at)
        why["env"] = _text(table, "why", at)
        values = table.get("vars", {})
        if not isinstance(values, dict):
            raise PatchkitError(f"{at}: vars must be a table")
        for key, value in values.items():
            if not ENV_NAME_RE.match(key) or not isinstance(value, str):
                raise PatchkitError(f"{at}: {key} = {value!r}: names are identifiers, values strings")
            env[key] = value
    for key, value in ARCH_ENV.items():
        if env.get(key) != value:
            raise PatchkitError(f"{at}: {key} must be {value!r} (the GB10 sm_121a target), "
                                f"found {env.get(key)!r}")
    for pid, needed in PATCH_ENV.items():
        for key, value in needed.items():
            if pid in series and env.get(key) != value:
                raise PatchkitError(f"{at}: the series has {pid}, whose code reads {key}: set it to {value!r}")
            if pid not in series and key in env:
                raise PatchkitError(f"{at}: {key} switches {pid}, which is not in the series: remove it")
    return env


def _ids(value: object, at: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise PatchkitError(f"{at}: must be a list of patch ids")
    return value


def _keys(table: object, known: set[str], at: str) -> None:
    if not isinstance(table, dict):
        raise PatchkitError(f"{at} must be a table")
    unknown = sorted(set(table) - known)
    if unknown:
        raise PatchkitError(f"{at}: unknown keys {unknown}; known: {sorted(known)}")


def _text(table: dict, key: str, at: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PatchkitError(f"{at}: {key} is required (a non-empty string)")
    return value


def mirrors(images: dict[str, Image], prefix: str, name: str | None = None) -> list[tuple[str, str]]:
    """(source, mirror) for each distinct base (or the one of image `name`): the source as pinned with
    the tag dropped (skopeo refuses tag+digest), the mirror the same digest under `prefix` (e.g.
    ghcr.io/owner), so a digest-preserving copy keeps what the image file pins. CI copies each base
    once into its own registry, and every image build then mounts the base layers from there."""
    chosen = [images[name]] if name else list(images.values())
    out = []
    for base in sorted({i.base for i in chosen}):
        ref, digest = base.split("@")
        repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        out.append((f"{repo}@{digest}", f"{prefix}/{repo.rsplit('/', 1)[-1]}@{digest}"))
    return out


if __name__ == "__main__":  # python -m patchkit.images.definitions PREFIX [IMAGE]: "SOURCE MIRROR" lines, for CI
    import sys

    from patchkit.patching.patchset import load_patchset

    _images = load_images(Path("images"), load_patchset(Path("patches")))
    for _pair in mirrors(_images, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None):
        print(*_pair)
