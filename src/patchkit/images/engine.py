"""The Docker engine route (`--engine`): a rendered build context built FROM the registry base by a
Docker-API engine (Docker, or podman's API service) through the docker SDK.

A Dockerfile with no RUN cannot delete, so where the daemonless layer whites out a patched module's
bytecode, this route overwrites the same names with a 16-byte stub whose bad magic number makes Python
ignore it and recompile from source. The anchors were asserted against the base's layers read from the
registry first (images.prepare); for a base already in the engine, images.local reads them there. The
connection to the engine and what its faults become are patchkit.engine's.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import __version__
from patchkit.engine import EngineError, connect, engine_step, explain
from patchkit.errors import PatchkitError
from patchkit.images.assemble import Built
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference


def render_context(built: Built, dest: Path) -> Path:
    """A build context: `Dockerfile` (FROM base@digest, one COPY, LABEL, ENV; no RUN) and `rootfs/`."""
    base = built.prepared.base
    if base.reference is None:
        raise PatchkitError(f"the engine path builds FROM a registry image; base {base.spec} is a local OCI "
                            "layout: push it to a registry first, or use the daemonless build")
    dest = Path(dest)
    built.contents.write_rootfs(dest / "rootfs")   # the daemonless layer's entries, stubs for its whiteouts
    ref = base.reference
    tag = f":{ref.tag}" if ref.tag else ""
    (dest / "Dockerfile").write_text(dockerfile(built.prepared.image.name, f"{ref.name}{tag}@{base.digest}",
                                                "COPY rootfs/ /", built.labels, built.prepared.image.env))
    return dest


def dockerfile(image_name: str, base: str, add: str, labels: dict[str, str], env: dict[str, str]) -> str:
    lines = [
        f"# Rendered by patchkit {__version__} for {image_name}: the base pinned by digest, the patched",
        "# files (and stubs over their stale bytecode), labels and environment. Nothing runs in the image.",
        f"FROM {base}",
        add,
        _instruction("LABEL", labels),
        _instruction("ENV", env),
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


@dataclass
class Tags:
    """The names one build gives its image: `versioned` (`patchkit/IMAGE:<vllm>-<series>`), `latest`
    (`patchkit/IMAGE:latest`, the moving name `patchkit smoke --image` takes) and the `--push` refs."""

    versioned: str
    latest: str
    push: list[str] = field(default_factory=list)

    @property
    def all(self) -> list[str]:
        return [self.versioned, self.latest, *self.push]


def tags_for(image_name: str, tag: str, push: Sequence[str]) -> Tags:
    """Every route's names: push refs without a tag get the computed one."""
    refs = [str(Reference.parse(r).with_tag(Reference.parse(r).tag or tag)) for r in push]
    return Tags(f"patchkit/{image_name}:{tag}", f"patchkit/{image_name}:latest", refs)


def engine_build(client, context: Path | bytes, tags: Tags, platform: str, progress: Progress) -> str:
    """Build `context` (a directory, or a gzip-compressed tar of one) in the engine, moving `tags` onto the
    new image; its id.

    The invariant, whatever fails or is killed (the engine, the connection, patchkit): no image carries
    `:latest` unless the versioned tag names it too. The two are one name's old and new place, and an
    engine moves tags one at a time, so they never move in two steps that could be split:
    1. `:latest` is taken off the image it names (where it names one): from here until step 2 ends, no
       image is `:latest`; an absent name fails closed where a stale one would run;
    2. the build request itself carries every tag (`t=versioned&t=latest&t=push...`), so the engine sets
       them when it commits the image, versioned first, `:latest` after it, with no request between them;
       an engine that finishes a build after the connection was dropped tags it the same way;
    3. the tags are read back: both name the new image, or the build is refused naming what they name.
    A build the engine refused (an error in its stream: nothing was committed, nothing tagged) puts
    `:latest` back where it was. A build cut off (connection, kill) leaves `:latest` unset, said in the
    error: the next build sets it.
    """
    previous = _untag_latest(client, tags.latest)
    image_id = None
    with engine_step("building the image", lambda: _build_leftovers(tags, previous)):
        try:
            chunks = _build_stream(client, context, tags.all, platform)
            for chunk in chunks:
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("stream", "").strip():
                    progress.note(chunk["stream"].rstrip())
                if "error" in chunk:
                    refused = str(chunk.get("error") or "").strip()[:2000]
                    _retag(client, previous, tags.latest)
                    raise PatchkitError(f"engine build failed: {refused}")
                aux = chunk.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                    image_id = aux["ID"]
        except _api_error() as exc:
            _retag(client, previous, tags.latest)
            raise PatchkitError(f"engine build failed: {explain(exc)}") from None
    if image_id is None:
        raise EngineError("building the image", "the build stream ended without the image id", clean=(
            _build_leftovers(tags, previous)))
    with engine_step("reading back the tags", lambda: _build_leftovers(tags, previous, image_id)):
        named = {tag: client.api.inspect_image(tag).get("Id") for tag in (tags.versioned, tags.latest)}
    if set(named.values()) != {image_id}:
        raise EngineError("reading back the tags", "the engine moved them elsewhere",
                          ", ".join(f"{t} names {i}" for t, i in named.items()) + f", not the build's {image_id}")
    return image_id


def _api_error():
    import docker

    return docker.errors.APIError


def _build_stream(client, context: Path | bytes, tags: list[str], platform: str):
    """The engine's build stream (decoded JSON chunks) for `context` under every name in `tags`: the SDK's
    `build` takes one tag; the API takes `t` once per name."""
    import docker.utils

    api = client.api
    if isinstance(context, Path):
        data = docker.utils.tar(context, gzip=True)
    else:
        data = io.BytesIO(context)
    headers = {"Content-Type": "application/tar", "Content-Encoding": "gzip"}
    api._set_auth_headers(headers)
    response = api._post(api._url("/build"), data=data, headers=headers, stream=True, timeout=None,
                         params={"t": tags, "rm": True, "forcerm": True, "platform": platform})
    api._raise_for_status(response)
    return api._stream_helper(response, decode=True)


def _untag_latest(client, latest: str) -> str | None:
    """Take `latest` off the image it names (step 1 of engine_build); that image's id, or None."""
    import docker

    with engine_step(f"taking {latest} off its image before the build"):
        try:
            previous = client.api.inspect_image(latest)["Id"]
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.NotFound:
            return None
        client.api.remove_image(latest, noprune=True)
    return previous


def _retag(client, image_id: str | None, name: str) -> None:
    """Put `name` back on `image_id` (a build the engine refused committed nothing)."""
    if image_id is None:
        return
    repo, _, tag = name.rpartition(":")
    with engine_step(f"putting {name} back on {image_id[:19]}"):
        client.api.tag(image_id, repo, tag)


def _build_leftovers(tags: Tags, previous: str | None, image_id: str | None = None) -> list[str]:
    """What a build cut off may leave, as commands: the tags it set (if the engine committed it) and the
    `:latest` taken off before it."""
    said = [f"`docker image inspect {tags.versioned} {tags.latest}` shows whether the engine committed "
            f"{image_id[:19] if image_id else 'the build'} (both tags or neither)",
            "`docker image prune` removes an untagged partial build"]
    if previous:
        said.append(f"{tags.latest} was taken off {previous[:19]} before the build: run the build again, or "
                    f"`docker tag {previous[:19]} {tags.latest}`")
    return said


def engine_push(client, image_id: str, tags: Tags, annotations: dict[str, str]) -> list[str]:
    """Push every `--push` name (set on the image by its build) and give each pushed manifest the
    daemonless build's annotations; `name:tag@digest` for each.

    An engine pushes a manifest it writes itself, without annotations (Docker's schema 2 has no field for
    them). So the manifest it pushed is read back and put again under the same tag as an OCI manifest
    with the same config and layer blobs (media types renamed, bytes untouched) and the annotations: a few
    KiB, no blob moves. The engine's RepoDigests keep naming its own manifest, which the registry keeps."""
    pushed: list[str] = []
    for tag in tags.push:
        repo, _, name_tag = tag.rpartition(":")
        with engine_step(f"pushing {tag}", lambda: [f"pushed so far: {', '.join(pushed) or 'nothing'}"]):
            for line in client.api.push(repo, name_tag, stream=True, decode=True):
                if isinstance(line, dict) and "error" in line:
                    raise EngineError(f"pushing {tag}", "the engine refused", str(line["error"])[:2000],
                                      [f"pushed so far: {', '.join(pushed) or 'nothing'}"])
        pushed.append(annotate_pushed(tag, annotations))
    return pushed


def annotate_pushed(tag: str, annotations: dict[str, str]) -> str:
    """Re-put the manifest an engine pushed under `tag` as an OCI manifest carrying `annotations`."""
    from patchkit.oci.media import (
        DOCKER_CONFIG,
        DOCKER_FOREIGN_GZIP,
        DOCKER_LAYER_GZIP,
        DOCKER_MANIFEST,
        OCI_LAYER_GZIP,
        OCI_LAYER_NONDIST_GZIP,
        OCI_MANIFEST,
    )
    from patchkit.oci.registry import RegistryClient

    ref = Reference.parse(tag)
    if ref.tag is None:  # tags_for gives every push name one
        raise PatchkitError(f"{tag}: the engine pushes a name with a tag; this one has none")
    client = RegistryClient(ref.registry)
    data, media_type = client.get_manifest(ref.repository, ref.tag)
    if media_type not in (DOCKER_MANIFEST, OCI_MANIFEST):
        raise PatchkitError(f"the engine pushed {tag} as {media_type!r}, not an image manifest")
    try:
        manifest = json.loads(data)
        renamed = {DOCKER_CONFIG: "application/vnd.oci.image.config.v1+json", DOCKER_LAYER_GZIP: OCI_LAYER_GZIP,
                   DOCKER_FOREIGN_GZIP: OCI_LAYER_NONDIST_GZIP}
        oci = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
               "config": {**manifest["config"], "mediaType": renamed.get(manifest["config"]["mediaType"],
                                                                          manifest["config"]["mediaType"])},
               "layers": [{**layer, "mediaType": renamed.get(layer["mediaType"], layer["mediaType"])}
                          for layer in manifest["layers"]],
               "annotations": {**(manifest.get("annotations") or {}), **annotations}}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PatchkitError(f"the manifest the engine pushed as {tag} is not one patchkit can read "
                            f"({exc.__class__.__name__})") from None
    body = json.dumps(oci, sort_keys=True, separators=(",", ":")).encode()
    digest = client.put_manifest(ref.repository, ref.tag, body, OCI_MANIFEST)
    return f"{tag}@{digest}"


def build_with_engine(built: Built, *, engine_url: str | None = None, push: Sequence[str] = (),
                      progress: Progress | None = None, pushed: list[str] | None = None) -> str:
    """Build the rendered context through the docker SDK (Docker, or podman's API service), moving the
    versioned tag and `:latest` with it (engine_build). Returns the engine's image id; what was pushed
    is appended to `pushed`. Without a reachable engine: a PatchkitError naming the daemonless path."""
    progress = progress or Quiet()
    client = connect(engine_url)
    tags = tags_for(built.prepared.image.name, built.tag, push)
    with tempfile.TemporaryDirectory(prefix="patchkit-context-") as tmp:
        render_context(built, Path(tmp))
        image_id = engine_build(client, Path(tmp), tags, str(built.prepared.base.platform), progress)
    done = engine_push(client, image_id, tags, built.annotations)
    if pushed is not None:
        pushed.extend(done)
    return image_id
