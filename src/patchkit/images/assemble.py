"""The daemonless image: one layer of patched files on the base, its config and manifest, and where it
goes (an OCI layout, or a registry push).

1. ONE layer: images.new_layer's entries (the patched files, mode and owner as in the base, their
   parent directories with the base's metadata, whiteouts for their bytecode, the pinned wheels' files);
2. config = base config + that layer's diff_id + a history entry + labels + env; manifest = base
   layers (renamed to OCI media types, blobs untouched) + the layer + OCI annotations;
3. an OCI layout directory (atomically), or a push: base blobs mounted from the base repository when
   it is on the same registry, else streamed across; new blobs uploaded; the manifest put by digest and
   then under each tag.

Reproducible: every timestamp is the build epoch (images.labels), JSON is canonical and the tar/gzip
deterministic, so the same base, series, image file, revision and epoch give the same digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.images.labels import describe_image
from patchkit.images.new_layer import NewLayer, new_layer
from patchkit.images.prepare import Prepared
from patchkit.oci.base import BaseImage
from patchkit.oci.image import layout_index, new_config, new_manifest
from patchkit.oci.layer import Layer, build_layer
from patchkit.oci.layout import LocalBlob, write_layout
from patchkit.oci.media import OCI_MANIFEST, canonical_json, sha256_digest
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.push import Blob, push_blobs
from patchkit.oci.registry import Reference, RegistryClient
from patchkit.sources.image_layers import ImageLayersSource


class PushToDigest(PatchkitError):
    """`--push` `target` names a digest; a push names a repository or a tag, its digest is the build's (exit 2)."""

    def __init__(self, target: str):
        self.target = target
        super().__init__(f"--push {target}: give a repository or a tag; the digest is computed")


@dataclass
class Built:
    prepared: Prepared[BaseImage, ImageLayersSource]
    contents: NewLayer                   # the layer's entries, which the --engine route renders too
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


def assemble(prepared: Prepared[BaseImage, ImageLayersSource], *, epoch: int | None = None, revision: str | None = None,
             source_url: str | None = None) -> Built:
    image, base = prepared.image, prepared.base
    meta = describe_image(prepared, epoch=epoch, revision=revision, source_url=source_url)
    ids = ",".join(p.id for p in prepared.carried)
    contents = new_layer(prepared)
    layer = build_layer(contents.entries, epoch=meta.epoch)
    config = new_config(base.config, layer, created=meta.created,
                        created_by=f"patchkit build {image.name} (series: {ids})",
                        comment=f"patchkit {__version__}: {len(prepared.files)} patched files, "
                                f"{len(prepared.stale_bytecode)} bytecode whiteouts",
                        labels=meta.labels, env=image.env, n_base_layers=len(base.layers))
    config_bytes = canonical_json(config)
    manifest_bytes = canonical_json(new_manifest(base.manifest, config_bytes, layer, meta.annotations))
    return Built(prepared, contents, layer, config_bytes, manifest_bytes, meta.version, meta.tag, meta.annotations,
                 meta.labels, meta.epoch)


def write_output(built: Built, dest: Path) -> Path:
    """An OCI image layout with every blob (base layers fetched into the cache first if remote), each base
    layer hashed against its descriptor on the way in: the layers the build did not read are checked
    here, and the output holds regular files only, never a link into the base."""
    base = built.prepared.base
    blobs: dict[str, bytes | LocalBlob] = {d["digest"]: base.local_blob(d["digest"], d["size"]) for d in base.layers}
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
            raise PushToDigest(text)
        client = RegistryClient(ref.registry, progress=progress)
        repo = ref.repository
        mount_from = (base.reference.repository if base.reference is not None
                      and base.reference.registry == ref.registry else None)
        # each base layer reopened from its start for every send (verified as it is sent)
        blobs = [Blob(d["digest"], d["size"], partial(base.copy_source, d["digest"], d["size"]), mount_from)
                 for d in base.layers]
        blobs += [Blob(built.layer.digest, len(built.layer.blob), built.layer.blob),
                  Blob(sha256_digest(built.config_bytes), len(built.config_bytes), built.config_bytes)]
        push_blobs(client, repo, blobs)  # in parallel; the manifest only once every blob is there
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
    for line in p.extras.describe():
        say(line)
    for key, value in p.image.env.items():
        say(f"  ENV {key}={value}")
    read = set(p.source.layers_read)
    for d in p.base.layers:
        if d["digest"] not in read:
            say(f"  base layer {d['digest']} ({d['size']:,} B) not read: it holds none of the files to patch, "
                "and a dry run does not check its digest (a build does, on the way into the output)")
    say(f"would produce {built.digest} (tag {built.tag}, layer {built.layer.size} bytes); nothing written")
