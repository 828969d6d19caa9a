"""Where the code to patch comes from: a directory, a released sdist or wheel, a git ref.

Every source is read-only and answers `read(package, path)` and `versions()`; see docs/DESIGN.md.
"""

from patchkit.sources.archives import CorruptArchiveError
from patchkit.sources.base import DISTRIBUTIONS, PACKAGES, Source, read_many
from patchkit.sources.cache import FileCache, SdistCache
from patchkit.sources.combined import CombinedSource, combine_sources
from patchkit.sources.directory import DirectorySource
from patchkit.sources.git import GitSource
from patchkit.sources.index import discover_releases
from patchkit.sources.sdist import SdistSource
from patchkit.sources.spec import open_source
from patchkit.sources.wheel import WheelSource

__all__ = [
    "DISTRIBUTIONS",
    "PACKAGES",
    "CombinedSource",
    "CorruptArchiveError",
    "DirectorySource",
    "FileCache",
    "GitSource",
    "SdistCache",
    "SdistSource",
    "Source",
    "WheelSource",
    "combine_sources",
    "discover_releases",
    "open_source",
    "read_many",
]
