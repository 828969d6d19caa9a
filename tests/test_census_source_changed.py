"""The compiled census never guesses a figure from a release whose source moved: FlashInfer 0.6.18.post1's
real sparse MLA SM120 decode launcher (its sdist from the package index, read through patchkit's own archive
reader) with one drift each, as a release could bring it, is refused typed (SourceChanged) naming the file
and what was looked for; nvcc still running at its limit is stopped (CompileTimedOut)."""

from __future__ import annotations

import re
import sys

import pytest

from patchkit.census.jit_census import CompileTimedOut, SourceChanged, _run, launcher_constants, materialise
from patchkit.sources.cache import ArchiveCache
from patchkit.sources.release import open_release

DECODE = "csrc/sparse_mla_sm120_decode_dsv3_2.cu"
FUNCTION, CONSTANT = "launch_decode_dsv3_2_impl", "DYN_SMEM_BYTES"


@pytest.fixture(scope="module")
def decode(tmp_path_factory) -> str:
    cache = ArchiveCache()
    open_release("flashinfer-python", "0.6.18.post1", cache=cache)  # downloaded and verified once
    archive = cache.lookup("flashinfer-python", "0.6.18.post1")
    assert archive is not None
    top = materialise(archive.path, (DECODE,), tmp_path_factory.mktemp("fi"))
    return (top / DECODE).read_text()


def test_the_real_launcher_gives_its_budget_and_block(decode):
    copy, block = launcher_constants(decode, FUNCTION, CONSTANT, DECODE)
    assert f"return {CONSTANT};" in copy and block


@pytest.mark.parametrize("drift, expected", [
    (lambda t: t.replace(f"{FUNCTION}(", f"{FUNCTION}_v2("), f"a launcher {FUNCTION}(...)"),
    (lambda t: re.sub(rf"\b{CONSTANT}\b", "SMEM_BYTES", t), f"{FUNCTION} defining constexpr {CONSTANT}"),
    (lambda t: re.sub(r"dim3\s+block\w*\(", "auto grid_of(", t), f"{FUNCTION} launching with a `dim3 block(...)`"),
], ids=["launcher renamed", "constant renamed", "block size no longer a dim3"])
def test_a_drifted_launcher_is_refused_naming_what_was_looked_for(decode, drift, expected):
    changed = drift(decode)
    assert changed != decode
    with pytest.raises(SourceChanged) as err:
        launcher_constants(changed, FUNCTION, CONSTANT, DECODE)
    assert err.value.what == DECODE and err.value.expected.startswith(expected), err.value.expected


def test_a_tool_still_running_at_its_limit_is_stopped(tmp_path):
    with pytest.raises(CompileTimedOut) as err:
        _run([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, 0.5, "nvcc (stand-in: a sleeping Python)")
    assert err.value.timeout == 0.5 and err.value.what.startswith("nvcc")
