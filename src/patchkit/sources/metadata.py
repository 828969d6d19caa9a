"""Versions as packages state them in their own files: core metadata, `_version.py`, static pyproject.

importlib.metadata only reads *installed* distributions; these sources are trees, archives and git
blobs, so the few formats are parsed here from bytes. `_version.py` is parsed with `ast` (never
executed): it is code from the tree being patched.
"""

from __future__ import annotations

import ast
import configparser
import tomllib
from email.parser import HeaderParser

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def core_metadata(text: bytes) -> tuple[str | None, str | None]:
    """(Name, Version) from a METADATA / PKG-INFO file (RFC 822 headers)."""
    headers = HeaderParser().parsestr(text.decode("utf-8", errors="replace"), headersonly=True)
    name, version = headers.get("Name"), headers.get("Version")
    return (name.strip() if name else None, version.strip() if version else None)


def same_distribution(a: str | None, b: str) -> bool:
    return a is not None and canonicalize_name(a) == canonicalize_name(b)


def same_version(a: str, b: str) -> bool:
    """PEP 440 equality ("0.33" == "0.33.0"); plain string equality for versions that do not parse."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def version_py(text: bytes) -> str | None:
    """The string assigned to `__version__` or `version` in a `_version.py` (setuptools-scm style)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = {target.id for target in targets if isinstance(target, ast.Name)}
        if names & {"__version__", "version"} and isinstance(value, ast.Constant) and isinstance(value.value, str):
            return value.value
    return None


def static_project_version(pyproject: bytes | None, setup_cfg: bytes | None, dist: str) -> str | None:
    """The version a pyproject.toml `[project]` table or a setup.cfg `[metadata]` section states literally.

    Only for the named distribution, and only when static: a dynamic version is computed at build time
    and cannot be known from the file.
    """
    if pyproject is not None:
        try:
            project = tomllib.loads(pyproject.decode("utf-8", errors="replace")).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        version = project.get("version")
        if same_distribution(project.get("name"), dist) and isinstance(version, str):
            return version
    if setup_cfg is not None:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(setup_cfg.decode("utf-8", errors="replace"))
        except configparser.Error:
            return None
        version = parser.get("metadata", "version", fallback=None)
        name = parser.get("metadata", "name", fallback=None)
        if same_distribution(name, dist) and version and not version.startswith(("attr:", "file:")):
            return version.strip()
    return None
