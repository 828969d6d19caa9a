"""What a patchkit build marks on an engine so that a run cut off (engine killed, connection reset, a
garbled answer, patchkit itself killed) leaves nothing the next build cannot find and clear:

- every container patchkit creates (images.engine_files' read containers) carries RUN_LABEL, the run that
  made it, so one whose create answer was lost (its id never learnt) is still found by label;
- before a build takes `:latest` off the image it names, it tags that image HOLD_TAG.<run>: the engine
  itself keeps which image `:latest` was on until the build ends and removes the mark;
- the images patchkit builds carry its `dev.patchkit.image` label from their first step (images.local
  writes LABEL before ADD), so an untagged one a build left is found by label. An image a user built
  FROM one of patchkit's inherits every label, so the label alone does not make an image patchkit's:
  its history must also be patchkit's own steps from the top (`built_by_patchkit`).

`recover` (called by each build route right after it connects) removes the containers of runs that are
over, puts `:latest` back where a run that is over took it off and the engine has none, and removes the
untagged images patchkit built. A run is over when its process is gone (same host: pid and start time),
or, for a run on another host, when it started more than STALE_S ago. Nothing of a live run is touched,
so builds at once on one engine do not clear each other's containers.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from patchkit.engine import engine_step

RUN_LABEL = "dev.patchkit.run"          # on every container patchkit creates: the run that made it
IMAGE_LABEL = "dev.patchkit.image"       # on every image patchkit builds (images.labels.describe_image)
HOLD_TAG = "was-latest"                  # `<repo>:was-latest.<run>`: where `:latest` was before a build
STALE_S = 6 * 3600                       # a run on another host older than this is over (no build lasts it)
_RUN = re.compile(r"([0-9a-f]{8})\.(\d+)\.(\d+)\.(\d+)")   # host hash . pid . start ticks . unix time
_HOLD = re.compile(rf"(?:localhost/|docker\.io/)?(patchkit/[^:]+):{HOLD_TAG}\.({_RUN.pattern})")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _start_ticks(pid: int) -> int | None:
    """The process's start time since boot (/proc/PID/stat field 22): with the pid, one process ever."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes().decode()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@cache
def this_run() -> str:
    """This process's run id (tag-safe: host hash, pid, start ticks, unix time, dot-separated)."""
    pid = os.getpid()
    return f"{_host()}.{pid}.{_start_ticks(pid) or 0}.{int(time.time())}"


def run_labels() -> dict[str, str]:
    """The labels of a container this run creates."""
    return {RUN_LABEL: this_run()}


def clear_command() -> str:
    """The command that removes every container this run made, the ones whose ids it never learnt too."""
    return f"docker rm -f $(docker ps -aq --filter label={RUN_LABEL}={this_run()})"


def hold_tag(latest: str) -> str:
    """`patchkit/IMAGE:latest` -> `patchkit/IMAGE:was-latest.<run>`."""
    return f"{latest.rpartition(':')[0]}:{HOLD_TAG}.{this_run()}"


def is_over(run: str) -> bool:
    """Whether the run `run` has ended (a value patchkit did not write is no run of its: never over)."""
    found = _RUN.fullmatch(run or "")
    if found is None:
        return False
    host, pid, ticks, started = found.group(1), int(found.group(2)), int(found.group(3)), int(found.group(4))
    if host != _host():
        return time.time() - started > STALE_S
    if pid == os.getpid() and ticks == (_start_ticks(pid) or 0):
        return False
    now = _start_ticks(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False  # no /proc here and the pid lives: taken for the same run
    return now != ticks


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
