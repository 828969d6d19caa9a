"""Where the code to patch comes from: a directory, a released sdist or wheel, a git ref, a base image's
files (its layers, or the local engine's copy).

Every source is read-only and satisfies `sources.base.Source` (`versions()`, `read(package, path)`, `read_many`,
`distribution_file`, `package_files`); see docs/DESIGN.md.
"""

import importlib

# Imported on first use (PEP 562): `patchkit.sources.base` is read by every command, while the git and
# index clients (gitpython, requests) cost a third of a warm `verify`'s start-up and most commands never
# touch them.
_HOME = {
    "CorruptArchiveError": "archives", "DISTRIBUTIONS": "base", "PACKAGES": "base", "Source": "base",
    "SourceDefaults": "base", "ImageFiles": "base", "FileCache": "cache", "ArchiveCache": "cache", "CombinedSource": "combined",
    "combine_sources": "combined", "DirectorySource": "directory", "GitSource": "git",
    "discover_releases": "index", "SdistSource": "sdist", "open_source": "spec", "WheelSource": "wheel",
}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'patchkit.sources' has no attribute {name!r}")
    return getattr(importlib.import_module(f"patchkit.sources.{_HOME[name]}"), name)


__all__ = [
    "DISTRIBUTIONS",
    "PACKAGES",
    "ArchiveCache",
    "CombinedSource",
    "CorruptArchiveError",
    "DirectorySource",
    "FileCache",
    "GitSource",
    "ImageFiles",
    "SdistSource",
    "Source",
    "SourceDefaults",
    "WheelSource",
    "combine_sources",
    "discover_releases",
    "open_source",
]
