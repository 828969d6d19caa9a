"""docs/DESIGN.md stays true: every module path and every `module.Name` it documents exists in src/."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = (REPO / "docs" / "DESIGN.md").read_text()


def test_every_documented_folder_is_a_package_and_every_package_is_documented():
    documented = set(re.findall(r"^([a-z_]+)/ ", DESIGN, re.M))
    packages = {p.name for p in (REPO / "src" / "patchkit").iterdir() if (p / "__init__.py").is_file()}
    assert documented == packages


def test_every_documented_name_exists():
    names = set(re.findall(r"`((?:patching|sources|oci|images|verify|checkpoint|bootlog|smoke|variants|wheels)"
                           r"(?:\.[a-z_]+)+(?:\.[A-Z]\w*|\.[a-z_]+\w*)?)", DESIGN))
    assert len(names) >= 10
    missing = []
    for dotted in sorted(names):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest module prefix, then attributes
            try:
                obj = importlib.import_module("patchkit." + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    assert not missing, missing


def test_the_documented_states_are_the_planners():
    from patchkit.patching.patchset import Action
    from patchkit.patching.planner import EditState, Mode, State

    for enum, line in ((State, "A patch's `State` is one of"), (EditState, "an edit's `EditState` one of"),
                       (Mode, "`Mode` is"), (Action, "an edit's `Action` is")):
        start = " ".join(DESIGN.split()).index(line) + len(line)
        text = " ".join(DESIGN.split())[start:start + 200]
        listed = re.match(r"\s*`([^`]+)`", text).group(1)
        assert {v.strip() for v in listed.split("|")} == {m.value for m in enum}, (enum, listed)
