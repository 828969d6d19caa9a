"""The architecture the README describes, enforced: layers only import downwards (import-linter reads
.importlinter), and no two modules of patchkit import each other, directly or through others (grimp)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]


def test_layers_only_import_downwards():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--config", str(REPO / ".importlinter")], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("patchkit")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.append(" -> ".join((module, *back)))
    assert cycles == []
