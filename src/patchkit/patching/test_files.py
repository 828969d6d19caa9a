"""Which file holds a patch's behaviour tests: `tests/patches/test_<id>.py`, the id's dashes as underscores.

One rule for everything that runs or reads them: the rebase's behaviour tests (patching/rebase/checks.py),
retirement's counts in a test record (upstream/retire.py) and the noxfile's `patch-necessity` session. It
imports nothing, so the noxfile, which cannot import patchkit's dependencies, imports it as it imports
patchkit/__init__.
"""

BEHAVIOUR_TESTS = "tests/patches"  # relative to the checkout


def behaviour_test_file(patch_id: str) -> str:
    """The patch's behaviour test module, relative to the checkout."""
    return f"{BEHAVIOUR_TESTS}/test_{patch_id.replace('-', '_')}.py"


def behaviour_test_prefix(patch_id: str) -> str:
    """What every node id of the patch's behaviour tests in a test record starts with."""
    return behaviour_test_file(patch_id) + "::"
