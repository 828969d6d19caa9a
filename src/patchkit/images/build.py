"""`patchkit build IMAGE`: image definition + base image -> one appended layer of patched files.

Three routes, one plan: every route reads the base's real files where the base is, plans the series
on them (every anchor asserted; nothing is written or pushed before the last check passed), and adds
one layer of the patched files:
- daemonless (the default; images.prepare + images.assemble): open the base for linux/arm64 (registry
  reference or OCI layout), read only the layers that can hold the target files, then write an OCI
  layout or push (base blobs mounted or streamed, never re-compressed);
- `--load` (images.local): the base is already in the local Docker/podman engine: read the target
  files from a created container of it, build `FROM base` + the patched files in the engine. Only the
  patched files move. Without the base in the engine, `--load` takes the `--engine` route;
- `--engine` (images.engine): a rendered context built FROM the registry base by the engine.

Bytecode: a `__pycache__/<module>.*.pyc` left from the base must never run instead of the patched
source. Timestamp pycs would be invalidated by the new mtime and size, but unchecked-hash pycs (and pip
builds under SOURCE_DATE_EPOCH write hash-based ones) are trusted without looking at the source. No fresh
pyc is shipped instead: it would have to be compiled by the image's own interpreter (its magic number
and code objects are version-specific), and nothing runs inside the image. So the daemonless layer
deletes (whiteouts) every bytecode file of each patched module that the layers read show, plus the names
the image's interpreter would use (`<module>.cpython-3XY[.opt-N].pyc`, from the site-packages path), in
case a lower layer not read holds one. Python recompiles the patched modules on first import
(milliseconds each). The engine routes (a Dockerfile with no RUN cannot delete) overwrite the same names
with a 16-byte stub whose bad magic number makes Python ignore it and recompile from source.

Nothing executes inside the image, so a linux/arm64 image builds on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import CHECKOUT
from patchkit.cache_root import default_cache_root
from patchkit.engine import connect
from patchkit.errors import PatchFailed
from patchkit.images.assemble import Built, assemble, describe, push_image, write_output
from patchkit.images.definitions import load_image
from patchkit.images.engine import build_with_engine
from patchkit.images.leftovers import recover
from patchkit.images.local import Loaded, build_local, find_local_base, prepare_local
from patchkit.images.prepare import prepare
from patchkit.oci.media import Platform
from patchkit.oci.progress import Progress, Quiet
from patchkit.patching.patchset import load_patchset
from patchkit.sources.cache import FileCache

REPO_ROOT = CHECKOUT


class NotTheProvenImage(PatchFailed):
    """The build of `image` made manifest `digest`, not the `proven` one its proof's receipt names (exit 1):
    the inputs moved between the proof and this build (another base, patch set, revision or
    SOURCE_DATE_EPOCH), so what would be pushed is not what was proved."""

    def __init__(self, image: str, digest: str, proven: str):
        super().__init__(f"{image} built as {digest}, but the proof's receipt proved {proven}: not pushed and "
                         "not written (build with the proof's base, patch set, --revision and SOURCE_DATE_EPOCH, "
                         "or prove this build)")
        self.image, self.digest, self.proven = image, digest, proven


@dataclass
class BuildResult:
    built: Built | Loaded
    output: Path | None = None
    pushed: list[str] = field(default_factory=list)     # name:tag@digest for each ref
    engine_image: str | None = None
    route: str = "daemonless"      # daemonless | local-engine | engine

    def summary(self) -> dict:
        prepared = self.built.prepared
        return {
            "image": prepared.image.name,
            "route": self.route,
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
            **({"transferred_bytes": self.built.transferred} if isinstance(self.built, Loaded) else {}),
            # What the build could not check (e.g. a base without FlashInfer: the pad's FlashInfer asserts).
            "notes": {r.patch.id: r.detail for r in prepared.plan.results if r.detail},
        }


def build(image_name: str, *, base: str | None = None, output: Path | str | None = None,
          push: Sequence[str] = (), dry_run: bool = False, engine: bool = False, load: bool = False,
          engine_url: str | None = None, images_dir: Path | None = None, patches_dir: Path | None = None,
          epoch: int | None = None, revision: str | None = None, source_url: str | None = None,
          cache: Path | None = None, progress: Progress | None = None, proven: str | None = None) -> BuildResult:
    """`patchkit build IMAGE`: daemonless by default; `load=True` builds into the local engine from its
    copy of the base; `engine=True` builds FROM the registry base through a Docker-API engine.

    `cache` is the build's cache directory: base blobs, and the local route's engine reads in its files/
    (default: the user cache's oci/ and files/). `output` defaults to build/oci/<image> when nothing is
    pushed; `push` refs without a tag get the computed `<vllm-version>-<series-hash>` tag. `dry_run` reports
    what would change and writes nothing. `progress` gets the notes and byte counts (default: none shown).
    `proven` (daemonless route only) is the manifest digest an in-image proof proved: any other build is
    refused before anything is written or pushed.
    """
    progress = progress or Quiet()  # the caller renders: the CLI passes a RichProgress on its stderr console
    patchset = load_patchset(patches_dir or REPO_ROOT / "patches")
    image = load_image(images_dir or REPO_ROOT / "images", image_name, patchset)
    if load:
        client = connect(engine_url)
        recover(client, progress.note)
        local = find_local_base(client, base or image.base, Platform.parse(image.platform))
        if local is not None:
            progress.note(f"route: local engine (base {local.image_id[:19]} is in the engine; only the patched "
                          "files move)")
            files = FileCache(cache / "files" if cache else default_cache_root() / "files")
            on_engine = prepare_local(image, patchset, client, local, explicit=base is not None, cache=files)
            source = on_engine.source
            progress.note(f"read the base's files: {source.requests} from the engine ({source.received} bytes), "
                          "the rest from the cache of this base" if source.requests else
                          "read the base's files from the cache of this base (the engine was asked for none)")
            loaded = build_local(on_engine, client, push=push, epoch=epoch, revision=revision,
                                 source_url=source_url, progress=progress)
            progress.note(f"loaded {loaded.local_tag} ({loaded.image_id[:19]}; {loaded.transferred} bytes "
                          "moved to and from the engine)")
            return BuildResult(loaded, pushed=loaded.pushed, engine_image=loaded.image_id, route="local-engine")
        progress.note(f"route: engine (base {base or image.base} is not in the engine: its layers are read "
                      "from the registry and the engine pulls it)")
        engine = True
    # A layout output needs every base blob on disk anyway; a push-only or engine build streams what it reads.
    keep = bool(output is not None or not (push or engine)) and not dry_run
    prepared = prepare(image, patchset, base=base, cache=cache, progress=progress, keep=keep)
    built = assemble(prepared, epoch=epoch, revision=revision, source_url=source_url)
    if proven is not None and built.digest != proven:
        raise NotTheProvenImage(image.name, built.digest, proven)
    result = BuildResult(built)
    if dry_run:
        describe(built, progress)
        return result
    if engine:
        result.route = "engine"
        result.engine_image = build_with_engine(built, engine_url=engine_url, push=push, progress=progress,
                                                pushed=result.pushed)
        return result
    if output is not None or not push:
        result.output = write_output(built, Path(output) if output else Path("build/oci") / image.name)
        progress.note(f"wrote {result.output} ({built.digest})")
    if push:
        result.pushed = push_image(built, push, progress=progress)
    return result
