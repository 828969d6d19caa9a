"""What a patchkit build marks on an engine so that a run cut off (engine killed, connection reset, a
garbled answer, patchkit itself killed) leaves nothing the next build cannot find and clear:

- every container patchkit creates (sources.container_files' read containers) carries
  patchkit.engine.RUN_LABEL, the run that made it, so one whose create answer was lost (its id never
  learnt) is still found by label;
- before a build takes `:latest` off the image it names, it tags that image HOLD_TAG.<run>: the engine
  itself keeps which image `:latest` was on until the build ends and removes the mark;
- the images patchkit builds carry its `dev.patchkit.image` label from their first step (images.local
  writes LABEL before ADD), so an untagged one a build left is found by label. An image a user built
  FROM one of patchkit's inherits every label, so the label alone does not make an image patchkit's:
  its history must also be patchkit's own steps from the top (`built_by_patchkit`).

`recover` (called by each build route right after it connects) removes the containers of runs that are
over, puts `:latest` back where a run that is over took it off and the engine has none, and removes the
untagged images patchkit built. A run is over as patchkit.engine.is_over tells (its process is gone, or
a run on another host started long ago). Nothing of a live run is touched,
so builds at once on one engine do not clear each other's containers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from patchkit.engine import RUN_ID, RUN_LABEL, engine_step, is_over, this_run

IMAGE_LABEL = "dev.patchkit.image"       # on every image patchkit builds (images.labels.describe_image)
HOLD_TAG = "was-latest"                  # `<repo>:was-latest.<run>`: where `:latest` was before a build
_HOLD = re.compile(rf"(?:localhost/|docker\.io/)?(patchkit/[^:]+):{HOLD_TAG}\.({RUN_ID.pattern})")


def hold_tag(latest: str) -> str:
    """`patchkit/IMAGE:latest` -> `patchkit/IMAGE:was-latest.<run>`."""
    return f"{latest.rpartition(':')[0]}:{HOLD_TAG}.{this_run()}"


def bare_name(tag: str) -> str:
    """A tag as patchkit names it: without the registry an engine may prefix (podman: localhost/)."""
    return tag.removeprefix("localhost/").removeprefix("docker.io/")


def put_back_latest(client, latest: str, previous: str) -> str | None:
    """Where the engine has no `latest`: put it on `previous` while a versioned tag still names it, else (a
    build was committed but cut off before `:latest`) on the newest image a versioned tag of the repository
    names; the image it was put on, None where `latest` is there (or nothing can carry it)."""
    repo = latest.rpartition(":")[0]
    summaries = client.api.images(name=repo)
    named = {bare_name(t): s["Id"] for s in summaries for t in s.get("RepoTags") or [] if "<none>" not in t}
    if latest in named:
        return None
    created = {s["Id"]: int(s.get("Created") or 0) for s in summaries}
    versioned = {i for t, i in named.items() if t.startswith(f"{repo}:")
                 and not t.startswith((f"{repo}:latest", f"{repo}:{HOLD_TAG}."))}
    target = previous if previous in versioned else max(versioned, key=lambda i: created.get(i, 0), default=None)
    if target is not None:
        client.api.tag(target, repo, "latest")
    return target


# What patchkit's --load Dockerfile writes above its LABEL, in order (images.engine.dockerfile, labels_first).
_ABOVE_LABEL = ("ADD", "ENV")


def _keyword(created_by: object) -> str:
    """The Dockerfile keyword of an image history entry: the classic builder writes `/bin/sh -c #(nop)  ENV
    A=B` (two spaces), buildah `/bin/sh -c #(nop) ENV A=B`, BuildKit `ENV A=B`."""
    text = str(created_by or "").rpartition("#(nop)")[2].strip()
    return text.split(None, 1)[0].upper() if text else ""


def built_by_patchkit(client, image_id: str) -> bool:
    """Whether `image_id` is a step of a patchkit build (its LABEL step, its ADD, its final ENV), not an image
    built FROM one: from the top of its history, at most patchkit's steps above its own LABEL of
    IMAGE_LABEL. A user's `FROM patchkit/...` adds its own steps above them; no history, no proof."""
    import docker

    try:
        history = client.api.history(image_id)
    except docker.errors.NotFound:
        return False
    entries = [e for e in history if isinstance(e, dict)] if isinstance(history, list) else []
    for depth, entry in enumerate(entries[:len(_ABOVE_LABEL) + 1]):
        if _keyword(entry.get("CreatedBy")) == "LABEL" and IMAGE_LABEL in str(entry.get("CreatedBy")):
            above = [_keyword(e.get("CreatedBy")) for e in entries[:depth]]
            return above == list(reversed(_ABOVE_LABEL[:depth]))
    return False


def recover(client, note: Callable[[str], None] = lambda _: None) -> list[str]:
    """Clear what runs that are over left on the engine (the module's docstring says what); what was done,
    each also given to `note`."""
    import docker

    done: list[str] = []
    with engine_step("clearing what earlier patchkit runs left on the engine"):
        for summary in client.api.containers(all=True, filters={"label": RUN_LABEL}):
            if is_over((summary.get("Labels") or {}).get(RUN_LABEL, "")):
                try:
                    client.api.remove_container(summary["Id"], force=True)
                except docker.errors.NotFound:
                    continue
                done.append(f"removed container {summary['Id'][:12]} an earlier run made")
        images = client.api.images()
        named = {bare_name(t): s["Id"] for s in images for t in s.get("RepoTags") or [] if "<none>" not in t}
        unmarked: set[str] = set()
        for tag, image_id in sorted(named.items()):
            hold = _HOLD.fullmatch(tag)
            if hold is None or not is_over(hold.group(2)):
                continue
            put = put_back_latest(client, f"{hold.group(1)}:latest", image_id)
            if put is not None:
                done.append(f"put {hold.group(1)}:latest on {put[:19]} (an earlier run took it off)")
            try:
                client.api.remove_image(tag)   # (where it is the last name, the image and its steps go)
            except docker.errors.NotFound:
                pass
            unmarked.add(tag)
        for summary in images:   # untagged now: a mark removed above may have been an image's last name
            tags = [t for t in summary.get("RepoTags") or [] if "<none>" not in t and bare_name(t) not in unmarked]
            if tags or IMAGE_LABEL not in (summary.get("Labels") or {}) or not built_by_patchkit(client, summary["Id"]):
                continue   # a name keeps it, or it is no step of patchkit's (a user's image FROM one of them)
            try:
                client.api.remove_image(summary["Id"])
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError:
                continue  # in use (a container of it, a child image): not a leftover to take
            done.append(f"removed untagged image {summary['Id'][:19]} patchkit built")
    for line in done:
        note(line)
    return done
