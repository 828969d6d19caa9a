"""What names a series: the full series' name, and the hash of the patches an artifact carries.

A series is an ordered list of patch ids: patches/series.toml's whole list, or an image's subset of it.
`full` is the name of the whole list wherever a command takes a series name. The hash names what an
artifact carries: an image's version and tag (`<vllm>-<hash>`) and a wheel's local version
(`+glm53.<hash>`) are built from the same one, so one carried series names both artifacts alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from patchkit.patching.patchset import Patch

FULL_SERIES = "full"


def series_hash(patches: Sequence[Patch]) -> str:
    """12 hex of sha256 over the carried patches' ids and content digests, in order, as canonical JSON
    (no whitespace, UTF-8: the bytes oci.media.canonical_json gives, so hashes made before this moved
    here are unchanged)."""
    data = json.dumps([[p.id, p.digest] for p in patches], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:12]
