"""Which version of a package a base (an image, a site-packages) holds: one rule, used by every route
(the daemonless layer reads in sources.image_layers, the local engine's reads in sources.container_files, directories).

What a real build writes, from vLLM 0.33.0's sdist (pyproject.toml `[tool.setuptools_scm]`, setup.py
`get_vllm_version()`): setuptools-scm's version is written into `vllm/_version.py`
(`get_version(write_to="vllm/_version.py")`: a release `0.33.0`, a development build
`0.1.dev20051+g487ecf187`, the same string either way), and only then does setup.py append one device
suffix for the distribution's METADATA: `cu130` (a CUDA other than VLLM_MAIN_CUDA_VERSION), `precompiled`,
`cpu`, `tpu`, `xpu`, a ROCm variant or `empty`, joined by `+`, or by `.` when the version already has a
local part ("dev versions might contain +"). FlashInfer's `flashinfer/_build_meta.py` states the
`__version__` its METADATA states. So:

- the version a base holds is its dist-info METADATA `Version` (what pip and importlib.metadata report);
  without one the version is not confirmed, and the build stops;
- the package's version module, where it has one, states that version or that version less one suffix
  label; anything else is two builds mixed in one base, and the build stops;
- an image file's declared version must equal it (PEP 440 equality, local part included);
- the release layout a final release with a local suffix matches is its public version
  (`0.30.0+cu130` has 0.30.0's files); a development build's layout is only ever a declared claim.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from patchkit.errors import PatchkitError
from patchkit.sources.base import NotADistribution
from patchkit.sources.metadata import core_metadata, same_version, version_py

# The module each package writes its own version into (vLLM: setuptools-scm; FlashInfer: its build).
VERSION_MODULES = {"vllm": "_version.py", "flashinfer": "_build_meta.py"}
# A device suffix (vLLM's setup.py: cu130, cpu, rocm...), or patchkit's own patched-wheel label
# glm53.<12 hex of the series hash> (wheels/build.py LOCAL_PREFIX), whose _version.py stays the release's.
_SUFFIX = re.compile(r"[a-z0-9]+|glm53\.[0-9a-f]{12}")


class VersionUnconfirmed(PatchkitError):
    """No dist-info METADATA states the package's version (exit 2): `where` the tree, `distribution` asked
    for, the version module's `declared` one, and the dist-info paths `looked_at`."""

    def __init__(self, where: str, distribution: str, declared: str | None, looked_at: str):
        self.where, self.distribution, self.declared, self.looked_at = where, distribution, declared, looked_at
        what = f"the declared {distribution} {declared} is not confirmed" if declared else \
            f"the {distribution} version in this base is unknown"
        super().__init__(f"{where}: no {distribution} dist-info METADATA ({looked_at}), so {what}")


class VersionsDisagree(PatchkitError):
    """The version module and the METADATA name different versions (exit 2): `where` the tree, the
    `distribution`, the `module` read and its `module_version`, the `metadata` path and its `declared` one."""

    def __init__(self, where: str, distribution: str, *, declared: str | None, module: str,
                 module_version: str | None, metadata: str | None):
        self.where, self.distribution, self.declared = where, distribution, declared
        self.module, self.module_version, self.metadata = module, module_version, metadata
        if declared is not None and metadata is not None and not same_version(declared, metadata):
            said = f"the image definition declares {distribution} {declared} but the base carries {metadata}"
        else:
            said = (f"{distribution} versions disagree: METADATA {metadata}, {module} {module_version}"
                    + (f", image file {declared}" if declared else ""))
        super().__init__(f"{where}: {said} (a build writes one version into both: "
                         "METADATA may only add a device suffix such as +cu130)")


def metadata_version(text: bytes, path: str) -> str:
    """The `Version` of a METADATA file; a file without one is refused."""
    _, version = core_metadata(text)
    if not version:
        raise NotADistribution(path, "no Version field", "a Version field", "none")
    return version


def with_suffix_of(module_version: str, metadata: str) -> bool:
    """Whether `metadata` is `module_version` itself or it plus one device suffix, as vLLM's setup.py
    appends one (`+` before it, `.` when the version already has a local part)."""
    if metadata == module_version:
        return True
    sep = "." if "+" in module_version else "+"
    head, found, suffix = metadata.partition(module_version + sep)
    return not head and bool(found) and _SUFFIX.fullmatch(suffix) is not None


def held_version(where: str, distribution: str, *, metadata: bytes | None, metadata_path: str,
                 module_name: str | None = None, module: bytes | None = None, declared: str | None = None) -> str:
    """The version the base holds (its METADATA's), checked against its version module and the image
    file; raises VersionUnconfirmed or VersionsDisagree (exit 2)."""
    if metadata is None:
        raise VersionUnconfirmed(where, distribution, declared, metadata_path)
    actual = metadata_version(metadata, metadata_path)
    stated = version_py(module) if module is not None else None
    if (module is not None and (stated is None or not with_suffix_of(stated, actual))) or (
            declared is not None and not same_version(actual, declared)):
        raise VersionsDisagree(where, distribution, declared=declared, module=module_name or "version module",
                               module_version=stated, metadata=actual)
    return actual


def release_layout(version: str) -> str | None:
    """The release whose files a final release with a local part holds (`0.30.0+cu130` -> `0.30.0`);
    None for a version that is its own layout or a development/pre-release (no release to name)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    if parsed.local is None or parsed.is_prerelease or parsed.is_devrelease:
        return None
    return parsed.public


def release_layouts(versions: dict[str, str]) -> dict[str, str]:
    """`versions` where a local suffix hides the release layout, as the planner's `versions=` override."""
    return {package: layout for package, version in versions.items() if (layout := release_layout(version))}
