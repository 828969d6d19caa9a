"""What an image says about itself: version and tag, OCI labels and annotations, and the build epoch.

Two rules keep the metadata honest and the build reproducible:
- `org.opencontainers.image.source` is written only when it is a URL people can open (https or http;
  an scp-style `git@host:owner/repo` becomes its https form, and any user:password part is dropped). A
  clone of a local directory would otherwise publish a path on the builder's disk.
- the creation time is `SOURCE_DATE_EPOCH` when set, else the time of the commit being built (what the
  publish workflow sets SOURCE_DATE_EPOCH to), so the same commit gives the same digest on any machine;
  0 (1970) only outside a git checkout.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from patchkit import CHECKOUT
from patchkit.errors import PatchkitError
from patchkit.oci.base import Base
from patchkit.oci.image import epoch_timestamp
from patchkit.patching.series import series_hash

if TYPE_CHECKING:
    from patchkit.images.prepare import Prepared

ANNOTATION_PREFIX = "dev.patchkit"
_SCP_LIKE = re.compile(r"^(?:[^@/:]+@)?(?P<host>[A-Za-z0-9.-]+\.[A-Za-z]{2,}):(?!//)(?P<path>[^\\]+)$")


class BadSourceDateEpoch(PatchkitError):
    """SOURCE_DATE_EPOCH is set to `value`, which is not a whole number of seconds since 1970 (exit 2)."""

    def __init__(self, value: str):
        self.value = value
        super().__init__(f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds")


class SourceUrlNotPublic(PatchkitError):
    """`--source-url` `url` is not a URL people can open (https or http; an scp-style git address is
    taken), so it is not written as the image's source (exit 2)."""

    def __init__(self, url: str):
        self.url = url
        super().__init__(f"--source-url {url!r} is not a URL people can open (https://...)")


def tag_for(version: str) -> str:
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", version)
    return tag[:128]


def image_tag(vllm_version: str, shash: str, base_digest: str) -> str:
    """`<vllm-version>-<series-hash>-<base>`: the tag every route gives a build (daemonless, --engine,
    --load), its last part the first 12 hex of the base's digest (its image id where the engine knows no
    registry digest), so builds of one series on two bases never overwrite each other's tag."""
    return tag_for(f"{vllm_version}-{shash}-{base_digest.removeprefix('sha256:')[:12]}")


def names_engine_id(spec: str, image_id: str) -> bool:
    """Whether `spec` is the image id `image_id` the engine resolved it to, whole or a prefix (a short id)."""
    hex_id = image_id.removeprefix("sha256:")
    given = spec.removeprefix("sha256:")
    return bool(re.fullmatch(r"[0-9a-f]+", given)) and hex_id.startswith(given)


def base_annotations(base: Base) -> dict[str, str]:
    """`org.opencontainers.image.base.name` / `.base.digest` from what names the base in a registry, and
    nothing else. The OCI annotations spec: base.name is "the image reference of the image this image is
    based on", in distribution's reference grammar, and base.digest "the digest of the image this image
    is based on" (a manifest's or index's digest, what a registry serves it by). So:
    - a registry reference: that reference (tag kept) and the digest it resolved to;
    - an OCI layout: its digest only (its path is a place on the builder's disk, not a name);
    - an engine's image: the repo digest the engine recorded when it pulled it (the one of the repository
      given, else the first); an image id, a short id or a local tag the engine knows no repo digest for
      names nothing a registry serves (an id is the digest of the image's config, not of a manifest):
      both are left out and `dev.patchkit.base.image-id` says which image it was."""
    image_id = base.image_id
    if image_id is None:
        name = {} if base.reference is None else {"org.opencontainers.image.base.name": base.name}
        return {**name, "org.opencontainers.image.base.digest": base.digest}
    out = {f"{ANNOTATION_PREFIX}.base.image-id": image_id}
    ref = None if names_engine_id(base.spec, image_id) else base.reference
    if ref is not None and ref.digest:
        return {**out, "org.opencontainers.image.base.name": str(ref.with_tag(ref.tag)),
                "org.opencontainers.image.base.digest": ref.digest}
    recorded = list(base.repo_digests)
    pick = next((rd for rd in recorded if ref is not None and rd.split("@", 1)[0] in (ref.name, ref.repository)),
                recorded[0] if recorded else None)
    if pick is None or "@" not in pick:
        return out
    repo, digest = pick.split("@", 1)
    tag = ref.tag if ref is not None and repo in (ref.name, ref.repository) else None
    return {**out, "org.opencontainers.image.base.name": f"{repo}:{tag}" if tag else repo,
            "org.opencontainers.image.base.digest": digest}


def commit_epoch(root: Path = CHECKOUT) -> int | None:
    """The committer time of HEAD, or None outside a git checkout."""
    try:
        import git

        return int(git.Repo(root).head.commit.committed_date)
    except Exception:  # not a checkout (an installed wheel), or no commit yet
        return None


def build_epoch(epoch: int | None = None, root: Path = CHECKOUT) -> int:
    if epoch is not None:
        return int(epoch)
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None:
        committed = commit_epoch(root)
        return committed if committed is not None else 0
    if not raw.isdigit():
        raise BadSourceDateEpoch(raw)
    return int(raw)


def git_revision(root: Path = CHECKOUT) -> str:
    try:
        import git

        return git.Repo(root).head.commit.hexsha
    except Exception:  # not a checkout (an installed wheel): the annotation says so
        return "unknown"


def public_url(url: str | None) -> str | None:
    """`url` as a link people can open, or None when it is not one (a local path, file://, unknown)."""
    if not url:
        return None
    url = url.strip()
    scp = _SCP_LIKE.match(url)
    if scp and "://" not in url:
        url = f"https://{scp.group('host')}/{scp.group('path')}"
    parts = urlsplit(url)
    if parts.scheme == "ssh" and parts.hostname and "." in parts.hostname:
        parts = parts._replace(scheme="https")
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port and parts.scheme == "http" else "")
    path = parts.path[:-4] if parts.path.endswith(".git") else parts.path
    return urlunsplit((parts.scheme, host, path, "", ""))


def git_source_url(root: Path = CHECKOUT) -> str | None:
    if os.environ.get("GITHUB_REPOSITORY"):
        return f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
    try:
        import git

        return public_url(git.Repo(root).remotes.origin.url)
    except Exception:
        return None


@dataclass(frozen=True)
class Metadata:
    version: str                 # <vllm version>-<series hash>
    tag: str                     # image_tag(): the version and the base, made a valid tag
    labels: dict[str, str]       # image config labels (the image file's own, then patchkit's)
    annotations: dict[str, str]  # manifest annotations (patchkit's, plus each patch's digest)
    epoch: int
    created: str


def describe_image(prepared: Prepared, *, epoch: int | None = None, revision: str | None = None,
                   source_url: str | None = None) -> Metadata:
    image, base = prepared.image, prepared.base
    epoch = build_epoch(epoch)
    created = epoch_timestamp(epoch)
    source = git_source_url()
    if source_url:
        source = public_url(source_url)
        if source is None:
            raise SourceUrlNotPublic(source_url)
    shash = series_hash(prepared.carried)
    version = f"{prepared.versions['vllm']}-{shash}"
    common = {
        **base_annotations(base),
        **({"org.opencontainers.image.source": source} if source else {}),
        "org.opencontainers.image.revision": revision or git_revision(),
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": image.name,
        f"{ANNOTATION_PREFIX}.image": image.name,
        f"{ANNOTATION_PREFIX}.series": ",".join(p.id for p in prepared.carried),
        f"{ANNOTATION_PREFIX}.series.hash": shash,
        f"{ANNOTATION_PREFIX}.vllm.version": prepared.versions["vllm"],
    }
    if prepared.engine_versions.get("vllm") and prepared.engine_versions["vllm"] != prepared.versions["vllm"]:
        common[f"{ANNOTATION_PREFIX}.vllm.layout"] = prepared.engine_versions["vllm"]
    if prepared.skipped:
        common[f"{ANNOTATION_PREFIX}.skipped"] = ",".join(f"{p.id}:{state}" for p, state, _ in prepared.skipped)
    labels = {**image.labels, **common}
    annotations = {**common, **{f"{ANNOTATION_PREFIX}.patch.{p.id}": p.digest for p in prepared.carried}}
    return Metadata(version, image_tag(prepared.versions["vllm"], shash, base.digest), labels, annotations, epoch,
                    created)
