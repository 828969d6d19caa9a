"""Which file holds a patch's behaviour tests: `tests/patches/test_<id>.py`, the id's dashes as underscores.

One rule for everything that runs or reads them: the rebase's behaviour tests (patching/rebase/checks.py),
retirement's counts in a test record (upstream/retire.py) and the noxfile's `patch-necessity` and `tests`
sessions. It imports only the standard library and packaging (which comes with nox), so the noxfile, which
cannot import patchkit's other dependencies, imports it as it imports patchkit/__init__.
"""

import tomllib
from pathlib import Path

BEHAVIOUR_TESTS = "tests/patches"  # relative to the checkout


def behaviour_test_file(patch_id: str) -> str:
    """The patch's behaviour test module, relative to the checkout."""
    return f"{BEHAVIOUR_TESTS}/test_{patch_id.replace('-', '_')}.py"


def behaviour_test_prefix(patch_id: str) -> str:
    """What every node id of the patch's behaviour tests in a test record starts with."""
    return behaviour_test_file(patch_id) + "::"


def beyond_the_pin(patches: Path, pinned: str, releases: tuple[str, ...]) -> dict[str, list[str]]:
    """Per release, the behaviour test files of each patch under `patches` whose `vllm` range leaves
    `pinned` out, on the newest of `releases` the patch claims. On the pin those tests skip (out of range),
    yet an image may still carry the patch (its base is an older vLLM), so the pinned run runs them there.
    A patch whose range holds none of `releases` is left out: nothing of it could run."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    out: dict[str, list[str]] = {}
    for toml in sorted(patches.glob("*/patch.toml")):
        claims = SpecifierSet(tomllib.loads(toml.read_text())["vllm"])
        inside = [r for r in releases if Version(r) in claims]
        if Version(pinned) not in claims and inside:
            newest = max(inside, key=Version)
            out.setdefault(newest, []).append(behaviour_test_file(toml.parent.name))
    return out
