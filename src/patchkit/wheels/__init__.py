"""Patched vLLM wheels: a release's wheel with a series applied (build.py), pip's static index (index.py).

release.py fetches the release's wheel for a platform, archive.py copies zip members without
recompressing, manifest.py the `patchkit.json` that `patchkit status` reads. A wheel is read and
verified (and its RECORD parsed and written) by the sources layer: sources/verified_wheel.py.
"""

ARCHES = ("aarch64", "x86_64")
"""Linux machines vLLM publishes wheels for: the Spark (GB10, aarch64) and x86_64 GPU boxes."""
