"""Whether GLM-5.3's path on GB10 calls a kernel instantiation whose launcher refuses GB10 (the host raises below
an opt-in GB10 lacks, with no fallback), read from the release's own source: each step (jit_units.Route) is a
pattern found in a file, its evidence the file and lines it matched. A step not found, or found a different
number of times than the call sites it must account for, means the census cannot tell the instantiation is off
the path: the row fails, it is not assumed unreached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patchkit.census.jit_units import Route
from patchkit.sources.base import Source


@dataclass(frozen=True)
class Reach:
    evidence: tuple[str, ...]  # "file:first-last: what it shows", one per step found
    problem: str               # "" when every step was found as often as it must be


def lines(text: str, match: re.Match) -> str:
    """The 1-based lines a match spans, "12" or "12-15"."""
    first = text.count("\n", 0, match.start()) + 1
    last = first + match.group(0).rstrip().count("\n")
    return f"{first}" if last == first else f"{first}-{last}"


def follow(routes: tuple[Route, ...], sources: dict[str, str | None]) -> Reach:
    """Every step looked up in `sources` (file -> its text, None where the sdist has no such file)."""
    evidence, problems = [], []
    for route in routes:
        text = sources.get(route.file)
        if text is None:
            problems.append(f"{route.file} is not in the sdist (expected: {route.says})")
            continue
        found = list(re.finditer(route.pattern, text, re.S))
        wanted = len(re.findall(route.each, text)) if route.each else 1
        if len(found) != wanted or not found:
            sites = f" for its {wanted} call sites" if route.each else ""
            problems.append(f"{route.file}: {len(found)} matches{sites} of {route.pattern!r} (expected: {route.says})")
            continue
        evidence.append(f"{route.file}:{', '.join(lines(text, m) for m in found)}: {route.says}")
    return Reach(tuple(evidence), "; ".join(problems))


def read_sources(source: Source, files: set[str]) -> dict[str, str | None]:
    """`files` (relative to the sdist's top) read from the verified release archive; None for one it lacks."""
    read = {name: source.distribution_file(name) for name in sorted(files)}
    return {name: None if data is None else data.decode("utf-8", "replace") for name, data in read.items()}
