"""The Docker engine route (`--engine`): a rendered build context built FROM the registry base by a
Docker-API engine (Docker, or podman's API service) through the docker SDK.

A Dockerfile with no RUN cannot delete, so where the daemonless layer whites out a patched module's
bytecode, this route overwrites the same names with a 16-byte stub whose bad magic number makes Python
ignore it and recompile from source. The anchors were asserted against the base's layers read from the
registry first (images.prepare); for a base already in the engine, images.local reads them there.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from patchkit import __version__
from patchkit.errors import PatchkitError
from patchkit.images.assemble import Built
from patchkit.oci.layer import normalize
from patchkit.oci.progress import Progress, Quiet
from patchkit.oci.registry import Reference

# Bad magic (zeros): importlib raises ImportError in _classify_pyc, which SourceLoader.get_code catches
# and answers by compiling the source (and rewriting the pyc where it may).
BYTECODE_STUB = bytes(16)
# The Docker API version spoken. Naming it saves the SDK's /version round trip, which podman answers in
# ~0.4 s (it gathers host facts). 1.41 is Docker 20.10's; every later Docker and podman 3+ serve it, and
# it has everything used here (build with platform, archive reads, push).
API_VERSION = "1.41"


def connect(engine_url: str | None = None):
    """A docker SDK client for `engine_url` (else DOCKER_HOST, else the default socket), pinged."""
    import docker

    try:
        client = (docker.DockerClient(base_url=engine_url, version=API_VERSION) if engine_url
                  else docker.from_env(version=API_VERSION))
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' or OSError's by transport
        where = engine_url or os.environ.get("DOCKER_HOST", "the default Docker socket")
        raise PatchkitError(f"no Docker-API engine at {where} ({exc.__class__.__name__}): the default "
                            "daemonless build needs none, run `patchkit build` without --engine/--load") from None
    return client


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


def engine_build(client, context: Path | bytes, tag: str, platform: str, progress: Progress) -> str:
    """Build `context` (a directory, or a gzip-compressed tar of one) in the engine under `tag`; the new
    image's id."""
    import docker

    where = {"path": str(context)} if isinstance(context, Path) else {
        "fileobj": io.BytesIO(context), "custom_context": True, "encoding": "gzip"}
    image_id = None
    try:
        for chunk in client.api.build(**where, tag=tag, platform=platform, rm=True, decode=True, labels=None):
            if "stream" in chunk and chunk["stream"].strip():
                progress.note(chunk["stream"].rstrip())
            if "error" in chunk:
                raise PatchkitError(f"engine build failed: {chunk['error'].strip()}")
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except docker.errors.APIError as exc:
        raise PatchkitError(f"engine build failed: {exc.explanation or exc}") from None
    return image_id or client.images.get(tag).id


def engine_tags(built: Built, push: Sequence[str]) -> tuple[str, list[str]]:
    """(the local tag, the push tags): push refs without a tag get the computed one."""
    tags = [str(Reference.parse(r).with_tag(Reference.parse(r).tag or built.tag)) for r in push]
    return (tags[0] if tags else f"patchkit/{built.prepared.image.name}:{built.tag}"), tags


def engine_push(client, image_id: str, local_tag: str, tags: list[str]) -> None:
    for tag in tags:
        repo, _, name_tag = tag.rpartition(":")
        if tag != local_tag:
            client.images.get(image_id).tag(repo, name_tag)
        for line in client.images.push(repo, name_tag, stream=True, decode=True):
            if "error" in line:
                raise PatchkitError(f"engine push of {tag} failed: {line['error']}")


def build_with_engine(built: Built, *, engine_url: str | None = None, push: Sequence[str] = (),
                      progress: Progress | None = None) -> str:
    """Build the rendered context through the docker SDK (Docker, or podman's API service). Returns the
    engine's image id. Without a reachable engine: a PatchkitError naming the daemonless path."""
    progress = progress or Quiet()
    client = connect(engine_url)
    local_tag, tags = engine_tags(built, push)
    with tempfile.TemporaryDirectory(prefix="patchkit-context-") as tmp:
        render_context(built, Path(tmp))
        image_id = engine_build(client, Path(tmp), local_tag, str(built.prepared.base.platform), progress)
    engine_push(client, image_id, local_tag, tags)
    return image_id
