"""The local-engine route (`patchkit build IMAGE --load`): the base is already in the Docker or podman
engine (a Spark owner pulled it to run it), so only the patched files move.

1. find the base in the engine: by the digest the image file pins (any of the image's RepoDigests), or
   by the name or id given with --base; it must be the image's platform;
2. read the files the series names from the engine's copy of the base (sources.container_files: created,
   never started, containers of it, a request per file, kilobytes; kept under the base's image id, so a
   rebuild on the same base asks the engine for nothing) and plan on them, so every anchor is still
   asserted against the base's real files, not the network's;
3. build a context of a Dockerfile (`FROM base`, `ADD layer.tar /`, LABEL, ENV; no RUN) and one small
   uncompressed tar of the build's one layer with stubs over its stale bytecode (images.new_layer:
   the patched files, mode and owner as in the base, and the pinned wheels' files), and let the engine
   build it: the base's layers stay where they are. The build moves
   the versioned tag and `:latest` together (images.engine.engine_build says how) and pushes `--push`.
   An image the engine already holds from the same inputs (images.reuse: found by the content key it is
   labelled with) is not built again: nothing is sent, only the tags move (images.engine.engine_retag).

Whatever the engine does at any of these steps (errs, drops the connection, is killed, loses a
container) is an exit-2 error naming the step, what the engine kept and the command clearing it
(patchkit.engine.EngineError); the next build clears it (images.leftovers.recover).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from patchkit.engine import EngineError, engine_step
from patchkit.errors import PatchkitError
from patchkit.images.definitions import Image
from patchkit.images.engine import dockerfile, engine_build, engine_push, engine_retag, tags_for
from patchkit.images.labels import describe_image
from patchkit.images.new_layer import new_layer
from patchkit.images.prepare import Prepared, is_own_base, package_roots, plan_on
from patchkit.images.reuse import KEY_LABEL, content_key, held_image
from patchkit.oci.base import LocalBase, WrongPlatform
from patchkit.oci.media import Platform
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference
from patchkit.patching.patchset import PatchSet
from patchkit.sources.cache import FileCache
from patchkit.sources.container_files import ContainerSource


def find_local_base(client, spec: str, platform: Platform) -> LocalBase | None:
    """The engine's copy of `spec`, or None when the engine does not have it."""
    import docker

    try:
        ref = Reference.parse(spec)
    except PatchkitError:
        ref = None
    found, from_ref = None, spec
    with engine_step(f"looking up the base {spec}"):
        if ref is not None and ref.digest:
            # The summary list carries RepoDigests: one request (images.list() inspects every image too).
            for summary in client.api.images():
                digests = summary.get("RepoDigests") if isinstance(summary, dict) else None
                match = next((rd for rd in digests or [] if isinstance(rd, str) and rd.endswith("@" + ref.digest)),
                             None)
                if match:
                    found, from_ref = client.images.get(summary["Id"]), match
                    break
        else:
            try:
                found = client.images.get(spec)
            except (docker.errors.ImageNotFound, docker.errors.NotFound):
                found = None   # (any other refusal: engine_step's EngineError)
    if found is None:
        return None
    attrs = found.attrs
    have = {"os": attrs.get("Os"), "architecture": attrs.get("Architecture"), "variant": attrs.get("Variant")}
    if not platform.matches(have):
        raise WrongPlatform(spec, str(platform), f"{have['os']}/{have['architecture']}", in_engine=True)
    digest = ref.digest if ref is not None and ref.digest else next(
        (rd.split("@", 1)[1] for rd in attrs.get("RepoDigests") or []), found.id)
    name = str(ref.with_tag(ref.tag)) if ref is not None else spec
    layers = (attrs.get("RootFS") or {}).get("Layers") if isinstance(attrs.get("RootFS"), dict) else None
    return LocalBase(spec=spec, name=name, digest=digest, platform=platform, reference=ref, image_id=found.id,
                     repo_digests=tuple(attrs.get("RepoDigests") or ()), from_ref=from_ref,
                     layers=tuple(str(layer) for layer in layers) if isinstance(layers, list) else ())


def prepare_local(image: Image, patchset: PatchSet, client, base: LocalBase, *, explicit: bool,
                  cache: FileCache) -> Prepared[LocalBase, ContainerSource]:
    """Plan on the engine's copy of the base. A plan that fails on anything the cache answered is made
    again from the engine alone (refreshing the cache): a wrong cache entry costs time, never the build,
    and a failure is only ever reported against what the engine holds."""
    own = is_own_base(image, base.spec if explicit else None, {base.digest})
    roots = package_roots(image, patchset.series(list(image.series)), own)
    for trust_cache in (True, False):
        source = ContainerSource(client, base, roots, cache, trust_cache=trust_cache)
        try:
            return plan_on(image, patchset, base, source, own=own, spec=base.spec, dirs=False)
        except EngineError:
            raise             # the engine failing is not the cache's doing: asking it everything again would not help
        except PatchkitError:
            if not source.from_cache:
                raise
        finally:
            source.close()
    raise AssertionError("unreachable: the second pass trusts no cache")


@dataclass
class Loaded:
    """An image built in the local engine from its copy of the base."""

    prepared: Prepared[LocalBase, ContainerSource]
    version: str
    tag: str
    labels: dict[str, str]
    annotations: dict[str, str]
    epoch: int
    image_id: str = ""
    local_tag: str = ""
    sent: int = 0                 # build context bytes sent to the engine
    pushed: list[str] = field(default_factory=list)   # name:tag@digest of each --push ref

    @property
    def digest(self) -> str:
        return self.image_id

    @property
    def transferred(self) -> int:
        return self.prepared.source.received + self.sent


def build_local(prepared: Prepared[LocalBase, ContainerSource], client, *, push: Sequence[str] = (),
                epoch: int | None = None, revision: str | None = None, source_url: str | None = None,
                progress: Progress | None = None) -> Loaded:
    progress = progress or Quiet()
    meta = describe_image(prepared, epoch=epoch, revision=revision, source_url=source_url)
    loaded = Loaded(prepared, meta.version, meta.tag, meta.labels, meta.annotations, meta.epoch)
    tags = tags_for(prepared.image.name, meta.tag, push)
    loaded.local_tag = tags.versioned
    layer = new_layer(prepared).engine_tar(meta.epoch)

    def render(labels: dict[str, str]) -> str:
        return dockerfile(prepared.image.name, prepared.base.from_ref, "ADD layer.tar /", labels,
                          prepared.image.env, labels_first=True)

    labels = {**meta.labels, KEY_LABEL: content_key(prepared.base, render(meta.labels), layer)}
    held = held_image(client, prepared.base, labels, prepared.image.env)
    if held is not None:   # the same image: only the tags move (images.reuse says why this is needed)
        progress.note(f"the engine holds this very image ({held[:19]}, {KEY_LABEL}={labels[KEY_LABEL][:19]}): "
                      "nothing is sent, only the tags move")
        loaded.image_id = engine_retag(client, held, tags, progress)
    else:
        context = _context(render(labels).encode(), layer, meta.epoch)
        loaded.sent = len(context)
        loaded.image_id = engine_build(client, context, tags, str(prepared.base.platform), progress)
    loaded.pushed = engine_push(client, loaded.image_id, tags, meta.annotations)
    return loaded


def _context(dockerfile_text: bytes, layer: bytes, epoch: int) -> bytes:
    """The build context: the Dockerfile and the layer tar, gzip-compressed (Python source packs ~4:1):
    what is sent is what is counted."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("Dockerfile", dockerfile_text), ("layer.tar", layer)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), epoch, 0o644
            tar.addfile(info, io.BytesIO(data))
    return context.getvalue()
