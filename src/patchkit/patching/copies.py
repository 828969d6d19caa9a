"""A patched copy of an installed package, beside the original, for probes and smoke runs.

The copy is made of hard links, which is safe because patchkit replaces files by rename: the installed
originals are never written. Importing the copy first on sys.path gives the patched package while the
interpreter's own install stays stock, so one environment can show a bug and its fix side by side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.patching import planner
from patchkit.patching.patchset import Patch
from patchkit.patching.tree import write_plan
from patchkit.sources.directory import DirectorySource


class NotInstalled(PatchkitError):
    """A package the interpreter does not import (exit 2): `package`, and `python` the interpreter asked."""

    def __init__(self, package: str, python: str):
        self.package, self.python = package, python
        super().__init__(f"{package} is not installed for {python}")


def installed_package(package: str, python: str | None = None) -> Path:
    """Where `python` (default: this interpreter) imports `package` from."""
    if python in (None, sys.executable):
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec else []
    else:
        code = (f"import importlib.util as u, json; s = u.find_spec({package!r}); "
                "print(json.dumps(list(s.submodule_search_locations) if s else []))")
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
        locations = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else []
    if not locations:
        raise NotInstalled(package, python or sys.executable)
    return Path(locations[0])


def patched_copy(installed: Path, dest: Path, patches: list[Patch]) -> planner.Plan:
    """Hard-link `installed` (a package dir) into `dest/<name>` and apply `patches` there, fail closed.

    A stamp naming the original and the series is written last, so `reuse_or_copy` can tell a finished
    copy of this series from a half-made one or a copy of another series.
    """
    shutil.copytree(installed, dest / installed.name, copy_function=os.link,
                    ignore=shutil.ignore_patterns("__pycache__"))
    source = DirectorySource(dest)
    plan = planner.plan(patches, source)
    plan.raise_for_errors()
    write_plan(dest, source, plan)
    (dest / STAMP).write_text(_stamp(installed, patches))
    return plan


STAMP = ".patchkit-copy.json"


def _stamp(installed: Path, patches: list[Patch]) -> str:
    return json.dumps({"installed": str(installed.resolve()), "series": [[p.id, p.digest] for p in patches]})


def reuse_or_copy(installed: Path, dest: Path, patches: list[Patch]) -> None:
    """`dest` holds a patched copy of `installed` with exactly `patches`: kept if its stamp says so,
    else (missing, half-made, another series or another original) removed and made again."""
    stamp = dest / STAMP
    if stamp.is_file() and stamp.read_text() == _stamp(installed, patches):
        return
    if dest.exists():
        shutil.rmtree(dest)
    patched_copy(installed, dest, patches)
