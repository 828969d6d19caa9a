"""patchkit's one cache root: `$PATCHKIT_CACHE_DIR` (the group's `--cache-dir` sets it), else the user
cache directory. Every cache (archives, OCI blobs, image files, compiles, results) lives under it; it is
here, below every layer, because readers on every layer (sources, oci, images, ...) keep their caches there.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def default_cache_root() -> Path:
    override = os.environ.get("PATCHKIT_CACHE_DIR")
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("patchkit"))
