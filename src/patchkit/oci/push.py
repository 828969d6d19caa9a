"""The blobs of an image pushed to one repository in parallel, as go-containerregistry's `remote.Write`
does: a bounded pool of workers (`PATCHKIT_PUSH_JOBS`, default 4), each blob there already, mounted or
uploaded (`RegistryClient.push_blob`, retried there); the manifest is the caller's to put once this
returns, that is once every blob is confirmed. The first blob that fails stops the rest: blobs not yet
started are never started, those in flight stop at their next chunk or retry, and the failure is raised
once none is running, naming the blob and the registry's answer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.oci.registry import Outcome, RegistryClient, transfers_folded
from patchkit.oci.transport import Cancelled, Reader

DEFAULT_JOBS = 4


@dataclass(frozen=True)
class Blob:
    """One blob to push: its content as `push_blob` takes it, and the repository of the same registry it
    may be mounted from."""

    digest: str
    size: int
    content: bytes | Path | Callable[[], Reader]
    mount_from: str | None = None


class BadPushJobs(PatchkitError):
    """PATCHKIT_PUSH_JOBS is set to `value`, not a number of parallel blob pushes from 1 to 64 (exit 2)."""

    def __init__(self, value: str):
        self.value = value
        super().__init__(f"PATCHKIT_PUSH_JOBS={value!r}: expected a number of parallel blob pushes from 1 to 64")


def push_jobs() -> int:
    value = os.environ.get("PATCHKIT_PUSH_JOBS", "")
    if not value:
        return DEFAULT_JOBS
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise BadPushJobs(value)
    return int(value)


def push_blobs(client: RegistryClient, repo: str, blobs: Sequence[Blob], *,
               jobs: int | None = None) -> dict[str, Outcome]:
    """Every blob in `repo`, `jobs` at a time (default `push_jobs()`); {digest: how it got there}. One bar
    for all of them (mounted and existing blobs count as done)."""
    jobs = jobs or push_jobs()
    cancel = threading.Event()
    lock = threading.Lock()
    outcomes: dict[str, Outcome] = {}
    with client.progress.task(f"push {len(blobs)} blobs to {repo}", sum(b.size for b in blobs)) as bar:
        def advance(n: int) -> None:
            with lock:  # a Progress need not be thread-safe; rich's is, a test's recorder may not be
                bar(n)

        def one(blob: Blob) -> None:
            try:
                with transfers_folded():
                    outcome = client.push_blob(repo, blob.digest, blob.content, mount_from=blob.mount_from,
                                               advance=advance, cancel=cancel)
            except BaseException:
                cancel.set()  # here, not when the pool reports it: this worker's next blob must not start
                raise
            if outcome is not Outcome.UPLOADED:
                advance(blob.size)
            if outcome is Outcome.MOUNTED:
                client.progress.note(f"mounted {blob.digest[:19]} from {blob.mount_from}")
            outcomes[blob.digest] = outcome

        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="patchkit-push") as pool:
            futures = [pool.submit(one, blob) for blob in blobs]
            wait(futures, return_when=FIRST_EXCEPTION)
            if cancel.is_set():
                for future in futures:
                    future.cancel()   # those not started never start
            wait(futures)             # those in flight stop at their next chunk, request or wait
    errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    if errors:  # the failure, not the Cancelled it caused in the others
        raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])
    return outcomes
