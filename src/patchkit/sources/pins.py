"""The FlashInfer a vLLM release pins, read from the release itself: `requirements/cuda.txt` in its sdist,
checkout or git tree, `Requires-Dist` in its wheel's METADATA (the same pin: 0.34.0 states 0.7.3 in both).

A vLLM release is served with the FlashInfer it pins (0.30: 0.6.18.post1, 0.31/0.32: 0.7.0.post1, 0.33:
0.7.2.post1), so a patch touching FlashInfer is only honestly checked against that pairing; what is
checked when the pin was never published is `sources.companion`'s policy.
"""

from __future__ import annotations

import re
from email.parser import HeaderParser

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from patchkit.sources.base import Source

PIN = re.compile(r"^flashinfer-python==([^\s;#]+)", re.MULTILINE)


def pinned_flashinfer(source: Source) -> str | None:
    """`flashinfer-python==X` pinned by the vLLM release behind `source`, when the source can tell."""
    data = source.distribution_file("requirements/cuda.txt")
    match = PIN.search(data.decode("utf-8", "replace")) if data else None
    return match.group(1) if match else None


def pinned_in_metadata(metadata: bytes) -> str | None:
    """The exact `flashinfer-python==X` among a wheel's `Requires-Dist` (core metadata); None when it pins
    none exactly (a range, or no such requirement). Lines that do not parse are not requirements pip reads."""
    headers = HeaderParser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    for line in headers.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        specifiers = list(requirement.specifier)
        if (canonicalize_name(requirement.name) == "flashinfer-python" and len(specifiers) == 1
                and specifiers[0].operator == "==" and "*" not in specifiers[0].version):
            return specifiers[0].version
    return None
