"""A static package index of patched wheels: PEP 503 HTML pages, and PEP 691 JSON beside them.

Static hosting (GitHub Pages) serves files, not content negotiation, so pip reads the HTML page;
each link carries `#sha256=` (pip checks the download against it) and `data-requires-python` (pip
skips a wheel this Python cannot run). The JSON (`index.json`) is the same list for tools that ask
for it by name. The wheels themselves can live elsewhere (release assets: Pages refuses files over
100 MB): `base_url` is where they are downloaded from; without it the links point at the wheels
in the index folder itself.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from urllib.parse import quote

from packaging.utils import canonicalize_name

from patchkit.errors import PatchkitError
from patchkit.localfiles import atomic_write
from patchkit.sources.verified_wheel import open_wheel
from patchkit.wheels.manifest import MANIFEST, WheelManifest


@dataclass(frozen=True)
class IndexedWheel:
    filename: str
    project: str
    version: str
    sha256: str
    size: int
    requires_python: str | None
    manifest: WheelManifest | None


def read_wheel(path: Path) -> IndexedWheel:
    """A wheel the index may list: verified whole as pip would install it (sources/verified_wheel.py), so a link the
    index gives never leads pip to a wheel it refuses; BadWheel (exit 2) naming it otherwise."""
    with open_wheel(path) as wheel:
        metadata = wheel.read(f"{wheel.dist_info}/METADATA", "metadata")
        name = f"{wheel.dist_info}/{MANIFEST}"
        manifest = (WheelManifest.from_bytes(wheel.read(name, "definition"), f"{path}, member {name}")
                    if name in wheel.members else None)
        requires = BytesHeaderParser().parsebytes(metadata).get("Requires-Python")
        return IndexedWheel(path.name, wheel.name, wheel.version, wheel.sha256, path.stat().st_size,
                            requires.strip() if requires else None, manifest)


class NoWheels(PatchkitError):
    """A wheel folder that holds no wheel to index (exit 2): `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder
        super().__init__(f"no wheel in {folder}: build them first (patchkit wheel build --output {folder})")


def write_index(wheels: Path, out: Path, base_url: str | None = None) -> list[IndexedWheel]:
    """`out/simple/` (PEP 503 + 691) for every wheel in the folder `wheels`, and `out/index.html` for people."""
    found = [read_wheel(p) for p in sorted(wheels.glob("*.whl"))]
    if not found:
        raise NoWheels(wheels)
    projects: dict[str, list[IndexedWheel]] = {}
    for wheel in found:
        projects.setdefault(wheel.project, []).append(wheel)
    simple = out / "simple"
    root_links = "".join(f'<a href="{quote(p)}/">{html.escape(p)}</a><br/>\n' for p in sorted(projects))
    atomic_write(simple / "index.html", _page("Simple index", root_links))
    atomic_write(simple / "index.json", _json({"meta": {"api-version": "1.1"},
                                               "projects": [{"name": p} for p in sorted(projects)]}))
    for project, files in projects.items():
        # Relative to out/simple/<project>/ when the wheels sit in the index folder itself.
        prefix = base_url.rstrip("/") + "/" if base_url else _relative(wheels, simple / project)
        links = "".join(
            f'<a href="{html.escape(prefix + quote(w.filename))}#sha256={w.sha256}"'
            + (f' data-requires-python="{html.escape(w.requires_python)}"' if w.requires_python else "")
            + f">{html.escape(w.filename)}</a><br/>\n"
            for w in files
        )
        atomic_write(simple / project / "index.html", _page(f"Links for {project}", links))
        atomic_write(simple / project / "index.json", _json({
            "meta": {"api-version": "1.1"}, "name": canonicalize_name(project),
            "versions": sorted({w.version for w in files}),
            "files": [{"filename": w.filename, "url": prefix + quote(w.filename), "hashes": {"sha256": w.sha256},
                       "requires-python": w.requires_python, "size": w.size} for w in files],
        }))
    atomic_write(out / "index.html", _overview(found))
    return found


def _relative(wheels: Path, page: Path) -> str:
    return Path(os.path.relpath(wheels.resolve(), page.resolve())).as_posix() + "/"


def _page(title: str, body: str) -> bytes:
    return (f'<!DOCTYPE html>\n<html>\n<head><meta name="pypi:repository-version" content="1.1">'
            f"<title>{html.escape(title)}</title></head>\n<body>\n<h1>{html.escape(title)}</h1>\n{body}"
            "</body>\n</html>\n").encode()


def _json(payload: dict) -> bytes:
    return (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode()


def _overview(wheels: list[IndexedWheel]) -> bytes:
    """Which version to ask pip for, per series and platform, and the patches each carries."""
    rows = []
    for w in wheels:
        m = w.manifest
        patches = ", ".join(p.id for p in m.patches) if m else "(not a patchkit wheel)"
        series = m.series if m else ""
        platform = w.filename.removesuffix(".whl").rsplit("-", 1)[1]
        rows.append(f"<tr><td><code>{html.escape(w.version)}</code></td><td>{html.escape(series)}</td>"
                    f"<td>{html.escape(platform)}</td><td>{html.escape(patches)}</td></tr>\n")
    table = ("<p>pip install --extra-index-url URL/simple &quot;vllm==VERSION&quot;</p>\n<table>\n"
             "<tr><th>version</th><th>series</th><th>platform</th><th>patches</th></tr>\n" + "".join(rows) + "</table>\n")
    return _page("Patched vLLM wheels (patchkit)", table)
