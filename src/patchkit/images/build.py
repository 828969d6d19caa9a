"""Image builds: image definition + base image -> one appended layer of patched files.

Daemonless (the default), in order, and nothing is written or pushed before the last check passed:
1. open the base for linux/arm64 (registry reference or OCI layout; an index resolves to its arm64
   entry), read the target files from its layers (`ImageLayersSource`: top-most layer first, only
   the layers needed);
2. plan the series with the engine against those real files (every anchor asserted; a broken or
   partial patch raises `PatchFailed` with the engine's diagnostic);
3. write ONE layer: the patched files (mode and owner as in the base, their parent directories with
   the base's metadata) and whiteouts for their bytecode (see below);
4. config = base config + that layer's diff_id + a history entry + labels + env; manifest = base
   layers (renamed to OCI media types, blobs untouched) + the layer + OCI annotations;
5. output an OCI layout directory (atomically), or push: base blobs mounted from the base repository
   when it is on the same registry, else copied; new blobs uploaded; the manifest put by digest and
   then under each tag.

Bytecode: a `__pycache__/<module>.*.pyc` left from the base must never run instead of the patched
source. Timestamp pycs would be invalidated by the new mtime and size, but unchecked-hash pycs (and pip
builds under SOURCE_DATE_EPOCH write hash-based ones) are trusted without looking at the source. No fresh
pyc is shipped instead: it would have to be compiled by the image's own interpreter (its magic number
and code objects are version-specific), and nothing runs inside the image. So the layer deletes
(whiteouts) every bytecode file of each patched module that the layers read show, plus the names the
image's interpreter would use (`<module>.cpython-3XY[.opt-N].pyc`, from the site-packages path), in case
a lower layer not read holds one. Python recompiles the patched modules on first import (milliseconds
each). The engine path (a Dockerfile with no RUN cannot delete) overwrites the same names with a 16-byte
stub whose bad magic number makes Python ignore it and recompile from source.

Reproducible: every timestamp is the build epoch (`SOURCE_DATE_EPOCH`, else 0), JSON is canonical and
the tar/gzip deterministic, so the same base, series, image file, revision and epoch give the same
digest. Nothing executes inside the image, so a linux/arm64 image builds on any machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import CHECKOUT, __version__
from patchkit.errors import PatchkitError
from patchkit.images.definitions import Image, load_image
from patchkit.oci.base import BaseImage, open_base
from patchkit.oci.image import epoch_timestamp, layout_index, new_config, new_manifest
from patchkit.oci.layer import Entry, Layer, build_layer, normalize, whiteout_path
from patchkit.oci.layout import write_layout
from patchkit.oci.media import OCI_MANIFEST, Platform, canonical_json, sha256_digest
from patchkit.oci.progress import Progress, Quiet, RichProgress
from patchkit.oci.registry import Reference, RegistryClient
from patchkit.oci.source import ImageLayersSource, PackageRoot
from patchkit.patching.patchset import Patch, PatchSet, load_patchset
from patchkit.patching.planner import FileChange, Plan, State, plan
from patchkit.sources.cache import default_cache_root

REPO_ROOT = CHECKOUT
ANNOTATION_PREFIX = "dev.patchkit"
# Bad magic (zeros): importlib raises ImportError in _classify_pyc, which SourceLoader.get_code catches
# and answers by compiling the source (and rewriting the pyc where it may).
BYTECODE_STUB = bytes(16)
# States a series patch may end in and still be part of a correct image. NOT_APPLIED: applied by this
# build. APPLIED: the base already carries it. Anything else is either an error (broken, partial) or
# a patch the image would claim without carrying it.
CARRIED = (State.NOT_APPLIED, State.APPLIED)
# Upstream carries the fix: reported, left out of the image's series labels. An out-of-range or
# not-applicable patch is NOT skippable: the image names it, so a base it does not cover is an error
# (an image must never ship without a fix its series promises).
SKIPPABLE = (State.UPSTREAMED,)


@dataclass(frozen=True)
class PatchedFile:
    path: str            # absolute image path
    data: bytes
    mode: int
    uid: int
    gid: int
    change: FileChange


@dataclass
class Prepared:
    """Everything decided before anything is written: the plan and the files of the new layer."""

    image: Image
    base: BaseImage
    source: ImageLayersSource
    plan: Plan
    versions: dict[str, str]             # what the base carries
    engine_versions: dict[str, str]      # what ranges were judged against
    carried: list[Patch]                 # patches the image carries, in order
    skipped: list[tuple[Patch, str, str]]   # (patch, state, why)
    files: list[PatchedFile]
    dirs: list[Entry]                    # parent directories, with the base's metadata
    stale_bytecode: list[str]            # image paths deleted (daemonless) or stubbed (engine)


@dataclass
class Built:
    prepared: Prepared
    layer: Layer
    config_bytes: bytes
    manifest_bytes: bytes
    version: str                         # <vllm version>-<series hash>
    tag: str                             # version made a valid tag
    annotations: dict[str, str]
    labels: dict[str, str]
    epoch: int

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest_bytes)


@dataclass
class BuildResult:
    built: Built
    output: Path | None = None
    pushed: list[str] = field(default_factory=list)     # name:tag@digest for each ref
    engine_image: str | None = None

    def summary(self) -> dict:
        prepared = self.built.prepared
        return {
            "image": prepared.image.name,
            "digest": self.built.digest,
            "version": self.built.version,
            "tag": self.built.tag,
            "base": f"{prepared.base.name}@{prepared.base.digest}",
            "series": [p.id for p in prepared.carried],
            "skipped": [p.id for p, _, _ in prepared.skipped],
            "files": [f.path for f in prepared.files],
            "output": str(self.output) if self.output else None,
            "pushed": self.pushed,
            "engine_image": self.engine_image,
        }


# -- the whole build ---------------------------------------------------------------------------------
def build(image_name: str, *, base: str | None = None, output: Path | str | None = None,
          push: Sequence[str] = (), dry_run: bool = False, engine: bool = False, engine_url: str | None = None,
          images_dir: Path | None = None, patches_dir: Path | None = None, epoch: int | None = None,
          revision: str | None = None, source_url: str | None = None, cache: Path | None = None,
          console=None, quiet: bool = False) -> BuildResult:
    """`patchkit build IMAGE`: daemonless by default; `engine=True` builds through a Docker-API engine.

    `output` defaults to build/oci/<image> when nothing is pushed; `push` refs without a tag get the
    computed `<vllm-version>-<series-hash>` tag. `dry_run` prints what would change and writes nothing.
    """
    progress: Progress = Quiet() if quiet else RichProgress(console)
    patchset = load_patchset(patches_dir or REPO_ROOT / "patches")
    image = load_image(images_dir or REPO_ROOT / "images", image_name, patchset)
    # A layout output needs every base blob on disk anyway; a push-only build streams what it reads.
    keep = bool(output is not None or not push) and not dry_run
    prepared = prepare(image, patchset, base=base, cache=cache, progress=progress, keep=keep)
    built = assemble(prepared, epoch=epoch, revision=revision, source_url=source_url)
    result = BuildResult(built)
    if dry_run:
        describe(built, progress)
        return result
    if engine:
        result.engine_image = build_with_engine(built, engine_url=engine_url, push=push, progress=progress)
        return result
    if output is not None or not push:
        result.output = write_output(built, Path(output) if output else Path("build/oci") / image.name)
        progress.note(f"wrote {result.output} ({built.digest})")
    if push:
        result.pushed = push_image(built, push, progress=progress)
    return result


def prepare(image: Image, patchset: PatchSet, *, base: str | None = None, cache: Path | None = None,
            progress: Progress | None = None, keep: bool = True) -> Prepared:
    progress = progress or Quiet()
    spec = base or image.base
    platform = Platform.parse(image.platform)
    try:
        base_image = open_base(spec, platform, cache=cache or default_cache_root() / "oci", progress=progress,
                               keep=keep)
    except PatchkitError as exc:
        raise PatchkitError(f"cannot use base image {spec}: {exc}\n  Pass a reachable base with --base: an OCI "
                            "layout directory (DIR or DIR:NAME) or a registry reference (REGISTRY/REPO@sha256:...)"
                            ) from None
    # The image file's version and layout describe its own base; any other base speaks for itself.
    own = base is None or base_image.digest == image.base_digest or base_image.manifest_digest == image.base_digest
    patches = patchset.series(list(image.series))
    # Only the packages the series touches (and vllm, whose version every range names): proving another
    # package absent would mean reading every layer.
    touched = {"vllm"} | {e.package for p in patches for e in p.edits}
    roots = [PackageRoot(p.name, p.path, p.distribution, p.version if own else None, required=p.name == "vllm")
             for p in image.packages.values() if p.name in touched]
    source = ImageLayersSource(base_image, roots)
    source.prefetch((e.package, c) for p in patches for e in [*p.edits, *([p.upstreamed] if p.upstreamed else [])]
                    for c in e.candidates)
    versions = source.versions()
    engine_versions = image.engine_versions() if own else {}
    result = plan(patches, source, versions=engine_versions or None)
    result.raise_for_errors()
    carried, skipped = [], []
    for r in result.results:
        if r.state in CARRIED:
            carried.append(r.patch)
        elif r.state in SKIPPABLE:
            skipped.append((r.patch, str(r.state), r.detail))
        else:
            raise PatchkitError(
                f"image {image.name}: patch {r.patch.id} is {r.state} on {spec} ({r.detail}); the image's "
                "series promises it: use a base it covers, or change the series or the patch's range"
            )
    if not result.changes:
        states = ", ".join(f"{r.patch.id}: {r.state}" for r in result.results)
        raise PatchkitError(f"image {image.name}: nothing to patch in {spec} ({states})")
    files, dirs, stale = _layer_contents(source, result.changes)
    return Prepared(image, base_image, source, result, versions, result.versions, carried, skipped, files,
                    dirs, stale)


def _layer_contents(source: ImageLayersSource, changes: list[FileChange]):
    files, stale, dir_paths = [], set(), set()
    for change in changes:
        path = source.image_path(change.package, change.path)
        meta = source.meta(path)
        mode, uid, gid = (meta.mode, meta.uid, meta.gid) if meta else (0o644, 0, 0)
        files.append(PatchedFile(path, change.new, mode, uid, gid, change))
        dir_paths.update("/" + a for a in _ancestors(normalize(path)))
        if change.path.endswith(".py"):
            found = source.pycache(change.package, change.path)
            stale.update(found)
            stale.update(_bytecode_names(path))
    for pyc in stale:
        dir_paths.update("/" + a for a in _ancestors(normalize(pyc)))
    dirs = []
    for d in sorted(dir_paths):
        meta = source.meta(d)
        if meta is not None and meta.kind == "dir":
            dirs.append(Entry(d, "dir", mode=meta.mode, uid=meta.uid, gid=meta.gid))
        elif meta is not None:
            raise PatchkitError(f"{source.base.spec}: {d} is a {meta.kind}, not a directory")
    return files, dirs, sorted(stale)


def _ancestors(name: str) -> list[str]:
    out = []
    while "/" in name:
        name = name.rsplit("/", 1)[0]
        out.append(name)
    return out


def _bytecode_names(py_path: str) -> list[str]:
    """The pyc names the image's interpreter would write for a module, from `pythonX.Y` in its path."""
    m = re.search(r"/python(\d)\.(\d+)/", py_path)
    if not m:
        return []
    folder, stem = posixpath.split(py_path[:-3])
    tag = f"cpython-{m.group(1)}{m.group(2)}"
    return [f"{folder}/__pycache__/{stem}.{tag}{opt}.pyc" for opt in ("", ".opt-1", ".opt-2")]


# -- config, manifest, annotations ---------------------------------------------------------------------
def series_hash(patches: Sequence[Patch]) -> str:
    """12 hex of sha256 over the carried patches' ids and content digests, in order."""
    return hashlib.sha256(canonical_json([[p.id, p.digest] for p in patches])).hexdigest()[:12]


def tag_for(version: str) -> str:
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", version)
    return tag[:128]


def build_epoch(epoch: int | None = None) -> int:
    if epoch is not None:
        return int(epoch)
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise PatchkitError(f"SOURCE_DATE_EPOCH={raw!r} is not a number of seconds")
    return int(raw)


def git_revision(root: Path = REPO_ROOT) -> str:
    try:
        import git

        return git.Repo(root).head.commit.hexsha
    except Exception:  # not a checkout (an installed wheel): the annotation says so
        return "unknown"


def git_source_url(root: Path = REPO_ROOT) -> str:
    if os.environ.get("GITHUB_REPOSITORY"):
        return f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
    try:
        import git

        return git.Repo(root).remotes.origin.url
    except Exception:
        return "unknown"


def assemble(prepared: Prepared, *, epoch: int | None = None, revision: str | None = None,
             source_url: str | None = None) -> Built:
    image, base = prepared.image, prepared.base
    epoch = build_epoch(epoch)
    created = epoch_timestamp(epoch)
    revision = revision or git_revision()
    source_url = source_url or git_source_url()
    shash = series_hash(prepared.carried)
    version = f"{prepared.versions['vllm']}-{shash}"
    ids = ",".join(p.id for p in prepared.carried)
    entries = [*prepared.dirs,
               *(Entry(f.path, "file", f.data, f.mode, f.uid, f.gid) for f in prepared.files),
               *(Entry(whiteout_path(p), "whiteout") for p in prepared.stale_bytecode)]
    layer = build_layer(entries, epoch=epoch)
    common = {
        "org.opencontainers.image.base.name": base.name,
        "org.opencontainers.image.base.digest": base.digest,
        "org.opencontainers.image.source": source_url,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": image.name,
        f"{ANNOTATION_PREFIX}.image": image.name,
        f"{ANNOTATION_PREFIX}.series": ids,
        f"{ANNOTATION_PREFIX}.series.hash": shash,
        f"{ANNOTATION_PREFIX}.vllm.version": prepared.versions["vllm"],
    }
    if prepared.engine_versions.get("vllm") and prepared.engine_versions["vllm"] != prepared.versions["vllm"]:
        common[f"{ANNOTATION_PREFIX}.vllm.layout"] = prepared.engine_versions["vllm"]
    if prepared.skipped:
        common[f"{ANNOTATION_PREFIX}.skipped"] = ",".join(f"{p.id}:{state}" for p, state, _ in prepared.skipped)
    labels = {**image.labels, **common}
    annotations = {**common, **{f"{ANNOTATION_PREFIX}.patch.{p.id}": p.digest for p in prepared.carried}}
    config = new_config(base.config, layer, created=created,
                        created_by=f"patchkit build {image.name} (series: {ids})",
                        comment=f"patchkit {__version__}: {len(prepared.files)} patched files, "
                                f"{len(prepared.stale_bytecode)} bytecode whiteouts",
                        labels=labels, env=image.env, n_base_layers=len(base.layers))
    config_bytes = canonical_json(config)
    manifest_bytes = canonical_json(new_manifest(base.manifest, config_bytes, layer, annotations))
    return Built(prepared, layer, config_bytes, manifest_bytes, version, tag_for(version), annotations, labels,
                 epoch)


# -- outputs -----------------------------------------------------------------------------------------
def write_output(built: Built, dest: Path) -> Path:
    """An OCI image layout with every blob (base layers fetched into the cache first if remote)."""
    base = built.prepared.base
    blobs: dict[str, bytes | Path] = {d["digest"]: base.blob(d["digest"], d.get("size")) for d in base.layers}
    blobs[built.layer.digest] = built.layer.blob
    blobs[sha256_digest(built.config_bytes)] = built.config_bytes
    blobs[built.digest] = built.manifest_bytes
    index = layout_index(built.manifest_bytes, base.platform, built.tag)
    write_layout(dest, index, blobs)
    return dest


def push_image(built: Built, refs: Sequence[str], *, progress: Progress | None = None) -> list[str]:
    progress = progress or Quiet()
    base = built.prepared.base
    pushed = []
    for text in refs:
        ref = Reference.parse(text)
        if ref.digest:
            raise PatchkitError(f"--push {text}: give a repository or a tag; the digest is computed")
        client = RegistryClient(ref.registry, progress=progress)
        repo = ref.repository
        for desc in base.layers:
            digest = desc["digest"]
            if client.blob_exists(repo, digest):
                continue
            same_registry = base.reference is not None and base.reference.registry == ref.registry
            if same_registry and client.mount_blob(repo, digest, base.reference.repository):
                progress.note(f"mounted {digest[:19]} from {base.reference.repository}")
                continue
            client.upload_blob(repo, digest, base.copy_source(digest, desc.get("size")))
        for digest, data in ((built.layer.digest, built.layer.blob),
                             (sha256_digest(built.config_bytes), built.config_bytes)):
            if not client.blob_exists(repo, digest):
                client.upload_blob(repo, digest, data)
        client.put_manifest(repo, built.digest, built.manifest_bytes, OCI_MANIFEST)
        tag = ref.tag or built.tag
        client.put_manifest(repo, tag, built.manifest_bytes, OCI_MANIFEST)
        pushed.append(f"{ref.with_tag(tag)}@{built.digest}")
        progress.note(f"pushed {pushed[-1]}")
    return pushed


def describe(built: Built, progress: Progress) -> None:
    """--dry-run: what the build would write, and the digest it would have."""
    p = built.prepared
    say = progress.note
    say(f"image {p.image.name} from {p.base.name}@{p.base.digest} ({p.base.platform}), "
        f"vllm {p.versions.get('vllm')}" + (f" judged as {p.engine_versions['vllm']}"
                                            if p.engine_versions.get("vllm") != p.versions.get("vllm") else ""))
    for r in p.plan.results:
        say(f"  patch {r.patch.id}: {r.state}{' (' + r.detail + ')' if r.detail else ''}")
    for f in p.files:
        old, new = f.change.old.decode().splitlines(), f.data.decode().splitlines()
        say(f"  M {f.path} ({len(old)} -> {len(new)} lines)")
    for pyc in p.stale_bytecode:
        say(f"  D {pyc} (stale bytecode)")
    for key, value in p.image.env.items():
        say(f"  ENV {key}={value}")
    say(f"would produce {built.digest} (tag {built.tag}, layer {built.layer.size} bytes); nothing written")


# -- engine path -------------------------------------------------------------------------------------
def render_context(built: Built, dest: Path) -> Path:
    """A build context: `Dockerfile` (FROM base@digest, one COPY, LABEL, ENV; no RUN) and `rootfs/`."""
    base = built.prepared.base
    if base.reference is None:
        raise PatchkitError(f"the engine path builds FROM a registry image; base {base.spec} is a local OCI "
                            "layout: push it to a registry first, or use the daemonless build")
    dest = Path(dest)
    rootfs = dest / "rootfs"
    for d in built.prepared.dirs:
        (rootfs / normalize(d.path)).mkdir(parents=True, exist_ok=True)
        os.chmod(rootfs / normalize(d.path), d.mode & 0o7777)
    for f in built.prepared.files:
        target = rootfs / normalize(f.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
        os.chmod(target, f.mode & 0o7777)
    for pyc in built.prepared.stale_bytecode:
        target = rootfs / normalize(pyc)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(BYTECODE_STUB)
        os.chmod(target, 0o644)
    os.chmod(rootfs, 0o755)
    (dest / "Dockerfile").write_text(dockerfile(built))
    return dest


def dockerfile(built: Built) -> str:
    p = built.prepared
    ref = p.base.reference
    tag = f":{ref.tag}" if ref.tag else ""
    lines = [
        f"# Rendered by patchkit {__version__} for {p.image.name}: the base pinned by digest, the patched",
        "# files (and stubs over their stale bytecode), labels and environment. Nothing runs in the image.",
        f"FROM {ref.name}{tag}@{p.base.digest}",
        "COPY rootfs/ /",
        _instruction("LABEL", built.labels),
        _instruction("ENV", p.image.env),
        "",
    ]
    return "\n".join(lines)


def _instruction(keyword: str, values: dict[str, str]) -> str:
    # Double-quoted words: JSON escaping covers quotes and backslashes; "$" would be expanded as a
    # build variable, so it is escaped too.
    def word(text: str) -> str:
        return json.dumps(text).replace("$", "\\$")

    parts = [f"{word(k) if keyword == 'LABEL' else k}={word(v)}" for k, v in values.items()]
    return f"{keyword} " + " \\\n    ".join(parts)


def build_with_engine(built: Built, *, engine_url: str | None = None, push: Sequence[str] = (),
                      progress: Progress | None = None) -> str:
    """Build the rendered context through the docker SDK (Docker, or podman's API service). Returns the
    engine's image id. Without a reachable engine: a PatchkitError naming the daemonless path."""
    progress = progress or Quiet()
    import docker

    try:
        client = docker.DockerClient(base_url=engine_url) if engine_url else docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' or OSError's by transport
        where = engine_url or os.environ.get("DOCKER_HOST", "the default Docker socket")
        raise PatchkitError(f"no Docker-API engine at {where} ({exc.__class__.__name__}): the default "
                            "daemonless build needs none, run `patchkit build` without --engine") from None
    tags = [str(Reference.parse(r).with_tag(Reference.parse(r).tag or built.tag)) for r in push]
    local_tag = tags[0] if tags else f"patchkit/{built.prepared.image.name}:{built.tag}"
    with tempfile.TemporaryDirectory(prefix="patchkit-context-") as tmp:
        render_context(built, Path(tmp))
        image_id = None
        try:
            for chunk in client.api.build(path=tmp, tag=local_tag, platform=str(built.prepared.base.platform),
                                          rm=True, decode=True, labels=None):
                if "stream" in chunk and chunk["stream"].strip():
                    progress.note(chunk["stream"].rstrip())
                if "error" in chunk:
                    raise PatchkitError(f"engine build failed: {chunk['error'].strip()}")
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
        except docker.errors.APIError as exc:
            raise PatchkitError(f"engine build failed: {exc.explanation or exc}") from None
    image_id = image_id or client.images.get(local_tag).id
    for tag in tags:
        repo, _, name_tag = tag.rpartition(":")
        if tag != local_tag:
            client.images.get(image_id).tag(repo, name_tag)
        for line in client.images.push(repo, name_tag, stream=True, decode=True):
            if "error" in line:
                raise PatchkitError(f"engine push of {tag} failed: {line['error']}")
    return image_id


# -- bench -------------------------------------------------------------------------------------------
def bench(image_name: str, base: str, *, workdir: Path, images_dir: Path | None = None,
          patches_dir: Path | None = None, buildah: str = "buildah") -> dict:
    """Daemonless build vs `buildah bud` of the rendered context, same image and registry base, one run.

    buildah runs as root with vfs storage and chroot isolation (what works without an engine or
    emulation); its storage is a fresh directory under `workdir`, so its time includes pulling the
    base, as the daemonless time includes reading the base's layers (warm blob cache excluded: a
    fresh cache directory is used as well).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = build(image_name, base=base, output=workdir / "daemonless", images_dir=images_dir,
                   patches_dir=patches_dir, cache=workdir / "cache", quiet=True, revision="bench", source_url="bench")
    daemonless = time.perf_counter() - started
    context = render_context(result.built, workdir / "context")
    if shutil.which(buildah) is None:
        raise PatchkitError("buildah is not installed (apt-get install buildah)")
    storage = workdir / "buildah-storage"
    registry = result.built.prepared.base.reference.registry
    cmd = [buildah, "--root", str(storage / "root"), "--runroot", str(storage / "run"), "--storage-driver", "vfs",
           "bud", "--isolation", "chroot", "--platform", str(result.built.prepared.base.platform),
           "--tls-verify=false" if registry.startswith(("127.", "localhost")) else "--tls-verify=true",
           "-t", f"bench/{image_name}", str(context)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    engine = time.perf_counter() - started
    if proc.returncode != 0:
        raise PatchkitError(f"buildah bud failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"image": image_name, "digest": result.built.digest, "daemonless_s": round(daemonless, 3),
            "buildah_s": round(engine, 3), "ratio": round(engine / daemonless, 2)}
