"""The FlashInfer a vLLM release pins, read from the release itself (`requirements/cuda.txt`).

A vLLM release is served with the FlashInfer it pins (0.30: 0.6.18.post1, 0.31/0.32: 0.7.0.post1, 0.33:
0.7.2.post1), so a patch touching FlashInfer is only honestly checked against that pairing.
"""

from __future__ import annotations

import re

from patchkit.sources.base import Source

PIN = re.compile(r"^flashinfer-python==([^\s;#]+)", re.MULTILINE)


def pinned_flashinfer(source: Source) -> str | None:
    """`flashinfer-python==X` pinned by the vLLM release behind `source`, when the source can tell."""
    data = source.distribution_file("requirements/cuda.txt")
    match = PIN.search(data.decode("utf-8", "replace")) if data else None
    return match.group(1) if match else None
