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
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchkit import __version__
from patchkit.engine import EngineError, answer, connect, engine_faults, engine_refusals, engine_step, explain
from patchkit.errors import PatchkitError
from patchkit.images.assemble import Built
from patchkit.images.leftovers import IMAGE_LABEL, bare_name, hold_tag, put_back_latest, recover
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference


class EngineNeedsRegistryBase(PatchkitError):
    """An --engine build of the base `spec`, a local OCI layout: the engine's Dockerfile builds FROM a
    registry image only (exit 2)."""

    def __init__(self, spec: str):
        self.spec = spec
        super().__init__(f"the engine path builds FROM a registry image; base {spec} is a local OCI layout: push it "
                         "to a registry first, or use the daemonless build")


def render_context(built: Built, dest: Path) -> Path:
    """A build context: `Dockerfile` (FROM base@digest, one COPY, LABEL, ENV; no RUN) and `rootfs/`."""
    base = built.prepared.base
    if base.reference is None:
        raise EngineNeedsRegistryBase(base.spec)
    dest = Path(dest)
    built.contents.write_rootfs(dest / "rootfs")   # the daemonless layer's entries, stubs for its whiteouts
    ref = base.reference
    tag = f":{ref.tag}" if ref.tag else ""
    (dest / "Dockerfile").write_text(dockerfile(built.prepared.image.name, f"{ref.name}{tag}@{base.digest}",
                                                "COPY rootfs/ /", built.labels, built.prepared.image.env))
    return dest


def dockerfile(image_name: str, base: str, add: str, labels: dict[str, str], env: dict[str, str], *,
               labels_first: bool = False) -> str:
    """`labels_first`: LABEL before `add`, so every step's image carries patchkit's labels and an untagged
    one a build cut off leaves is found by them (images.leftovers)."""
    steps = [_instruction("LABEL", labels), add] if labels_first else [add, _instruction("LABEL", labels)]
    lines = [
        f"# Rendered by patchkit {__version__} for {image_name}: the base pinned by digest, the patched",
        "# files (and stubs over their stale bytecode), labels and environment. Nothing runs in the image.",
        f"FROM {base}",
        *steps,
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
    1. the image `:latest` names (where it names one) is marked `<repo>:was-latest.<run>` (images.leftovers:
       the engine keeps where `:latest` was), then `:latest` is taken off it: from here until step 2 ends,
       no image is `:latest`; an absent name fails closed where a stale one would run;
    2. the build request itself carries every tag (`t=versioned&t=latest&t=push...`), so the engine sets
       them when it commits the image, versioned first, `:latest` after it, with no request between them;
       an engine that finishes a build after the connection was dropped tags it the same way;
    3. the tags are read back: both name the new image, or the build is refused naming what they name;
       then the mark is removed (where the engine fails that, the build stands and the note says so).
    A build that fails puts `:latest` back on the marked image where the engine still answers and has no
    `:latest` (it committed nothing, or not yet), and says what it left: the mark, an untagged image of
    the steps it finished, the command clearing each. Where it cannot, the next build does
    (images.leftovers.recover).
    """
    previous = _untag_latest(client, tags.latest)
    image_id, steps = None, list[str]()
    with engine_step("building the image", lambda: _build_leftovers(client, tags, previous, steps)):
        try:
            chunks = _build_stream(client, context, tags.all, platform)
            for chunk in chunks:
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("stream", "").strip():
                    progress.note(chunk["stream"].rstrip())
                    steps += STEP_IMAGE.findall(chunk["stream"])
                if "error" in chunk:
                    refused = str(chunk.get("error") or "").strip()[:2000]
                    left = _refused_leftovers(client, tags, previous, steps)
                    raise EngineError("building the image", "the engine refused", f"{refused}; {left}")
                aux = chunk.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                    image_id = aux["ID"]
        except engine_refusals() as exc:
            raise EngineError("building the image", exc.__class__.__name__,
                              f"{explain(exc)}; {_refused_leftovers(client, tags, previous, steps)}") from None
    if image_id is None:
        raise EngineError("building the image", "the build stream ended without the image id", clean=(
            _build_leftovers(client, tags, previous, steps)))
    _settle(client, image_id, tags, previous, lambda: _build_leftovers(client, tags, previous, steps, image_id),
            progress)
    return image_id


def engine_retag(client, image_id: str, tags: Tags, progress: Progress) -> str:
    """Move `tags` onto `image_id`, the image the engine already holds for this build (images.reuse), under
    engine_build's invariant and in its steps: nothing where every tag names it already; else `:latest`
    marked and taken off, the tags set one request each, `:latest` last, read back, the mark removed."""
    with engine_step("reading the tags of the image the engine holds"):
        have = {bare_name(t) for t in client.api.inspect_image(image_id).get("RepoTags") or [] if isinstance(t, str)}
    if set(tags.all) <= have:
        return image_id
    previous = _untag_latest(client, tags.latest)

    def left() -> list[str]:
        return _restored_then(client, tags, previous, [
            f"`docker image inspect {tags.versioned} {tags.latest}` shows whether both name {image_id[:19]}"])

    with engine_step("moving the tags onto the image the engine holds", left):
        for tag in [tags.versioned, *tags.push, tags.latest]:
            repo, _, name = tag.rpartition(":")
            client.api.tag(image_id, repo, name)
    _settle(client, image_id, tags, previous, left, progress)
    return image_id


def _settle(client, image_id: str, tags: Tags, previous: str | None, left: Callable[[], list[str]],
            progress: Progress) -> None:
    """Step 3 of engine_build: both tags read back on `image_id` (else refused), then the mark removed."""
    with engine_step("reading back the tags", left):
        named = {tag: client.api.inspect_image(tag).get("Id") for tag in (tags.versioned, tags.latest)}
    if set(named.values()) != {image_id}:
        raise EngineError("reading back the tags", "the engine moved them elsewhere",
                          ", ".join(f"{t} names {i}" for t, i in named.items()) + f", not the build's {image_id}")
    if previous is not None:   # the image is built and named: a mark left is the next build's to clear
        hold = hold_tag(tags.latest)
        try:
            client.api.remove_image(hold)   # (where it is the image's last name, the image and its steps go)
        except engine_faults() as exc:
            progress.note(f"the engine did not remove the mark {hold} ({answer(exc, 300)}): `docker rmi {hold}` "
                          "removes it (the next patchkit build does)")


# A finished step's image in the build stream: Docker's classic builder ` ---> 0123456789ab`, podman's `--> 0123456789a`
STEP_IMAGE = re.compile(r"^ ?-{2,3}> ([0-9a-f]{11,64})\s*$", re.MULTILINE)


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
    """Mark the image `latest` names and take `latest` off it (step 1 of engine_build); its id, or None."""
    import docker

    hold = hold_tag(latest)
    found: list[str] = []

    with engine_step(f"taking {latest} off its image before the build",
                     lambda: [_restore(client, latest, found[0])] if found else []):
        try:
            found.append(client.api.inspect_image(latest)["Id"])
        except docker.errors.NotFound:   # (ImageNotFound is a NotFound)
            return None
        repo, _, tag = hold.rpartition(":")
        client.api.tag(found[0], repo, tag)
        client.api.remove_image(latest, noprune=True)
    return found[0]


def _restore(client, latest: str, previous: str | None) -> str:
    """Put `:latest` back where it was unless the engine has one (it committed the build; images.leftovers'
    put_back_latest), then remove the mark; what was done, or what is left and its command where the
    engine does not answer."""
    if previous is None:
        return ""
    hold = hold_tag(latest)
    try:
        put = put_back_latest(client, latest, previous)
        client.api.remove_image(hold)   # (where it is the image's last name, the image and its steps go)
    except engine_faults():
        return (f"{latest} may be off {previous}: `docker tag {previous} {latest}` puts it back and "
                f"`docker rmi {hold}` removes the mark kept of where it was (the next patchkit build does both)")
    if put is None:
        return f"{latest} names the build the engine committed"
    return f"{latest} is back on {put[:19]}" if put == previous else f"{latest} put on {put[:19]}, which the engine committed"


def _refused_leftovers(client, tags: Tags, previous: str | None, steps: list[str]) -> str:
    """A build the engine refused committed no tag: `:latest` back where it was, and the untagged image of
    the steps it finished (named in the stream) removed, or named with the command that removes it."""
    import docker

    said = [s for s in [_restore(client, tags.latest, previous)] if s]
    if steps:
        try:
            client.api.remove_image(steps[-1])
            said.append(f"the untagged image of the steps it finished ({steps[-1]}) removed")
        except docker.errors.NotFound:
            pass
        except engine_faults():
            said.append(f"the steps it finished left the untagged image {steps[-1]}: `docker rmi {steps[-1]}` "
                        f"removes it (the next patchkit build does)")
    return "; ".join(said) or "nothing was left"


def _build_leftovers(client, tags: Tags, previous: str | None, steps: list[str],
                     image_id: str | None = None) -> list[str]:
    """What a build cut off left, as commands: `:latest` put back where the engine still answers (else how
    to), whether the engine committed the build, and the untagged images of it."""
    said = [f"`docker image inspect {tags.versioned} {tags.latest}` shows whether the engine committed "
            f"{image_id[:19] if image_id else 'the build'} (both tags or neither)",
            f"an untagged partial build{' (' + steps[-1] + ')' if steps else ''} is removed by "
            f"`docker image prune -f --filter label={IMAGE_LABEL}` (the next patchkit build does it)"]
    return _restored_then(client, tags, previous, said)


def _restored_then(client, tags: Tags, previous: str | None, said: list[str]) -> list[str]:
    """`:latest` put back where a cut-off step took it off (_restore's line first, where it says one), then `said`."""
    restored = _restore(client, tags.latest, previous)
    return [restored, *said] if restored else said


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


class UnreadablePush(PatchkitError):
    """What the registry holds as `tag` after the engine pushed it is no image manifest patchkit can give the
    annotations (exit 2): its `media_type`, and the `problem` reading it ("" where the media type alone is not
    an image manifest's; else the name of what the reader raised)."""

    def __init__(self, tag: str, media_type: str | None, problem: str = ""):
        self.tag, self.media_type, self.problem = tag, media_type, problem
        super().__init__(f"the manifest the engine pushed as {tag} is not one patchkit can read ({problem})" if problem
                         else f"the engine pushed {tag} as {media_type!r}, not an image manifest")


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
        raise PatchkitError(f"{tag}: the engine pushes a name with a tag; this one has none "
                            "(a patchkit bug: please report it)")
    client = RegistryClient(ref.registry)
    data, media_type = client.get_manifest(ref.repository, ref.tag)
    if media_type not in (DOCKER_MANIFEST, OCI_MANIFEST):
        raise UnreadablePush(tag, media_type)
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
        raise UnreadablePush(tag, media_type, exc.__class__.__name__) from None
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
    recover(client, progress.note)
    tags = tags_for(built.prepared.image.name, built.tag, push)
    with tempfile.TemporaryDirectory(prefix="patchkit-context-") as tmp:
        render_context(built, Path(tmp))
        image_id = engine_build(client, Path(tmp), tags, str(built.prepared.base.platform), progress)
    done = engine_push(client, image_id, tags, built.annotations)
    if pushed is not None:
        pushed.extend(done)
    return image_id
