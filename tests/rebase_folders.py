"""Patch folders and vLLM trees for the rebase and anchor-rule tests.

The patches come from tests/data/rebase/series-0.33 (the series as it stood for 0.33.0, its README): crafted
drift of real 0.33.0 files is measured against the edits written for those files, not patches/ after a port.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERIES = REPO / "tests" / "data" / "rebase" / "series-0.33"


def one_patch(dest: Path, patch_id: str, toml_edit=None) -> Path:
    """A patch folder holding one patch of SERIES (optionally its patch.toml rewritten by toml_edit)."""
    dest.mkdir(parents=True)
    shutil.copytree(SERIES / patch_id, dest / patch_id)
    if toml_edit:
        path = dest / patch_id / "patch.toml"
        path.write_text(toml_edit(path.read_text()))
    (dest / "series.toml").write_text(f'series = ["{patch_id}"]\n')
    return dest


def tree(dest: Path, version: str, files: dict[str, str], stamp: str | None = None) -> Path:
    """A vLLM tree of the given files, stating its release in vllm/_version.py (or the given stamp)."""
    (dest / "vllm").mkdir(parents=True)
    (dest / "vllm" / "__init__.py").write_text("")
    (dest / "vllm" / "_version.py").write_text(stamp or f'__version__ = version = "{version}"\n')
    for path, text in files.items():
        (dest / "vllm" / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / "vllm" / path).write_text(text)
    return dest
