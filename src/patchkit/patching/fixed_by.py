"""Which patches fix a finding, as the fix texts print them: read from the patches' own `fixes`
(patches/<id>/patch.toml) in this checkout's patch set, never written beside the finding.

The boot-log causes (bootlog/causes.py) and the serving findings (smoke/serving.py) name the patch that
fixes them through `fixed_by`; tests/test_fixes.py checks both directions against the real series (every
finding printed with its patches has one, every `fixes` entry names a finding that exists). The set is
read once, when a fix text first needs it.
"""

from __future__ import annotations

from functools import cache

from patchkit import CHECKOUT
from patchkit.patching.patchset import SERIES_FILE, PatchSet, load_patchset

PATCHES = CHECKOUT / "patches"


@cache
def _checkout_patchset() -> PatchSet | None:
    # An installed copy without the checkout's patches/ still judges logs; its fix texts then say so.
    return load_patchset(PATCHES) if (PATCHES / SERIES_FILE).is_file() else None


def fixed_by(finding: str) -> str:
    """The ids of the patches declaring `fixes = [finding]`, in application order, comma-separated."""
    patchset = _checkout_patchset()
    ids = patchset.fixing(finding) if patchset is not None else ()
    return ", ".join(ids) if ids else f"none in {PATCHES} declares fixes = [{finding!r}]"
