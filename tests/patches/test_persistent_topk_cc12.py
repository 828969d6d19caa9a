"""persistent-topk-cc12: settled per stack. Upstreamed on releases 0.30.0-0.34.0 (their persistent_topk
kernel falls back on low-shared-memory GPUs such as GB10), kept for the pinned base's nightly, whose
source predates that fallback.

- The kernel evidence: the installed release's own sdist (csrc/.../topk.cu and persistent_topk.cuh)
  carries the low-shared-memory planning the patch's why relies on.
- The probe: on the installed release (its _version.py stamp) the patch is upstreamed; on a copy of
  the same tree stamped as the base's nightly (0.1.dev20051+g487ecf187, its public version string;
  the one hand-made file here) the guards apply, with the release's layout declared as images do.
- The guards' behaviour on that nightly-stamped copy, by the release's own code: on the 0.31+ layout
  vLLM's real dispatcher (`get_indexer_topk`, what GLM's kpool indexer calls) for GB10 (12.1), 12.0,
  9.0 and 10.0 at GLM-5.3's select_k (2048 // 4 = 512), 8 and 128 rows, "auto" and explicit
  "persistent"; on the 0.30 layout (no dispatcher: the kpool indexer calls persistent_topk itself) the
  kpool indexer's own persistent_topk condition, evaluated from its source. Only the capability query
  and `is_cuda` are stand-ins.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile

import pytest
from packaging.version import Version

from conftest import VllmTree
from probes import LAYOUT_030, probe_fixtures

pytestmark = pytest.mark.vllm

SELECT_K = 2048 // 4
GB10_OPTIN_SMEM = 101_376  # bytes, GB10's opt-in shared memory per block (vLLM PR #54110's GB10 runs)
NIGHTLY_STAMP = """__version__ = version = '0.1.dev20051+g487ecf187'
__version_tuple__ = version_tuple = (0, 1, 'dev20051', 'g487ecf187')
"""  # the pinned base's vLLM (docs/field-records.md); its own _version.py is not public

CAPABILITIES = ((12, 1), (12, 0), (9, 0), (10, 0))
PROBE = r'''
import ast, json, os
import torch
import vllm
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability

platform = type(current_platform)
platform.is_cuda = lambda self: True
out, bf16_out = {}, {}
kpool = os.path.join(vllm.__path__[0], "model_executor", "layers", "sparse_attn_indexer_kpool.py")
if os.path.exists(kpool):  # 0.30 layout: the kpool indexer's own condition, from its source
    tree = ast.parse(open(kpool, encoding="utf-8").read())
    tests = [n.test for n in ast.walk(tree) if isinstance(n, ast.If) and "select_k in (512, 1024, 2048)" in ast.unparse(n.test)]
    assert len(tests) == 1, len(tests)
    condition = compile(ast.Expression(tests[0]), kpool, "eval")
for major, minor in CAPABILITIES:
    platform.get_device_capability = classmethod(lambda cls, device_id=0, c=(major, minor): DeviceCapability(*c))
    if os.path.exists(kpool):
        taken = eval(condition, {"current_platform": current_platform, "select_k": SELECT_K})
        out[f"{major}.{minor}"] = {"kpool": "persistent" if taken else "per_row"}
        continue
    from vllm.model_executor.layers import indexer_topk
    indexer_topk.get_indexer_topk.cache_clear()
    chosen = {}
    for backend in ("auto", "persistent"):
        for rows in (8, 128):
            logits = torch.zeros(rows, 4096, dtype=torch.float32)
            try:
                chosen[f"{backend}/{rows}"] = indexer_topk.get_indexer_topk(backend).resolve_backend(logits, SELECT_K, rows)
            except RuntimeError as e:
                chosen[f"{backend}/{rows}"] = f"refused: {e}"
            # 0.34.0 on: whether this call would hand bf16 logits to the top-k (its bf16
            # persistent_topk needs 128 KiB of shared memory, more than GB10 has)
            topk = indexer_topk.get_indexer_topk(backend)
            if hasattr(topk, "takes_bf16_logits"):
                bf16 = torch.zeros(rows, 4096, dtype=torch.bfloat16)
                try:
                    taken = topk.takes_bf16_logits(bf16, SELECT_K, rows)
                except RuntimeError as e:
                    taken = f"refused: {e}"
                bf16_out.setdefault(f"{major}.{minor}", {})[f"{backend}/{rows}"] = taken
    out[f"{major}.{minor}"] = chosen
print(json.dumps({"chosen": out, "bf16": bf16_out}))
'''.replace("SELECT_K", str(SELECT_K)).replace("CAPABILITIES", repr(CAPABILITIES))

stock_probe, _patched = probe_fixtures(PROBE)


@pytest.fixture(scope="module")
def stock(stock_probe):
    return stock_probe["chosen"]


def _patch():
    from patchkit.patching.patchset import load_patchset

    return load_patchset(REPO_PATCHES).patch("persistent-topk-cc12")


REPO_PATCHES = __import__("pathlib").Path(__file__).resolve().parents[2] / "patches"


@pytest.fixture(scope="module")
def nightly_tree(tmp_path_factory, vllm_release):
    """The installed release hard-linked, stamped as the base's nightly, the guards applied with the
    release's layout declared (as an image does for its dev-build base); None when the run excludes it."""
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.patching.tree import write_plan
    from patchkit.sources.directory import DirectorySource

    site = tmp_path_factory.mktemp("nightly-site")
    installed = installed_package("vllm")
    shutil.copytree(installed, site / "vllm", copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    stamp = site / "vllm" / "_version.py"
    stamp.unlink()  # a hard link: unlink, never write through to the install
    stamp.write_text(NIGHTLY_STAMP)
    source = DirectorySource(site)
    excluded = "persistent-topk-cc12" in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",")
    plan = planner.plan([] if excluded else [_patch()], source, versions={"vllm": str(vllm_release)})
    plan.raise_for_errors()
    write_plan(site, source, plan)
    return site, plan


@pytest.fixture(scope="module")
def guarded(nightly_tree):
    return VllmTree(root=nightly_tree[0], python=sys.executable).run(PROBE)["chosen"]


def test_release_stamp_marks_it_upstreamed_and_the_nightly_gets_the_guards(nightly_tree, vllm_release):
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource

    release = planner.plan([_patch()], DirectorySource(installed_package("vllm").parent))
    assert release.result("persistent-topk-cc12").state == planner.State.UPSTREAMED, vllm_release
    site, plan = nightly_tree
    assert DirectorySource(site).versions()["vllm"] == "0.1.dev20051+g487ecf187"
    assert [r.state for r in plan.results] == [planner.State.NOT_APPLIED]  # applied by the fixture


@pytest.mark.network
def test_released_kernel_plans_for_low_shared_memory(vllm_release):
    """The evidence behind [upstreamed]: the release's own persistent_topk host code reads the opt-in
    shared memory, sizes its chunks and occupancy to it, and on < 128 KiB devices falls back to the
    per-row kernel when the cooperative grid would not be resident; its floor fits GB10."""
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.release import open_release

    cache = ArchiveCache()
    open_release("vllm", str(vllm_release), cache=cache, progress=False)  # downloads once if missing
    with tarfile.open(cache.lookup("vllm", str(vllm_release)).path) as sdist:
        names = [n for n in sdist.getnames() if re.search(r"/csrc/(libtorch_stable/)?(topk\.cu|persistent_topk\.cuh)$", n)]
        text = {n.rsplit("/", 1)[1]: sdist.extractfile(n).read().decode() for n in names}
    topk, header = text["topk.cu"], text["persistent_topk.cuh"]
    assert "max_smem_per_block = device_prop->sharedMemPerBlockOptin;" in topk
    assert "effective_max_smem = max_smem_per_block;" in topk
    assert "static_cast<size_t>(effective_max_smem) - P::kFixedSmemLarge;" in topk
    assert topk.count("cudaOccupancyMaxActiveBlocksPerMultiprocessor(") == 3  # one per vector width
    fallback = re.search(r"if \(needs_cooperative && total_ctas > hw_resident_cap\) \{\s*"
                         r"if \(max_smem_per_block < 128 \* 1024\) \{.*?top_k_per_row_decode\(", topk, re.S)
    assert fallback, "the low-shared-memory fallback to top_k_per_row_decode"
    medium = re.search(r"constexpr size_t kSmemMedium =\s*[^;]+;\s*//\s*(\d+)", header)
    assert medium and int(medium.group(1)) < GB10_OPTIN_SMEM
    if "typename InT" in topk:  # 0.34.0 on: one kernel per logits type; only bf16 asks for 128 KiB
        assert re.search(r"sizeof\(InT\) == sizeof\(float\) \|\| max_smem_per_block >= 128 \* 1024", topk)


def test_stock_never_hands_bf16_logits_to_the_top_k_on_sm12x(stock_probe, vllm_release):
    """0.34.0's bf16 persistent_topk needs 128 KiB (GB10 has 101,376 B): vLLM's own dispatcher must
    never send bf16 logits there on 12.x, while 10.x takes them (so the probe can tell)."""
    bf16 = stock_probe["bf16"]
    if not bf16:
        assert vllm_release < Version("0.34"), "SparseIndexerTopk.takes_bf16_logits is gone: read the kernel again"
        pytest.skip(f"vLLM {vllm_release} has no bf16 top-k hand-off (0.34.0 brought it)")
    for capability in ("12.1", "12.0"):
        assert set(bf16[capability].values()) == {False}, bf16[capability]
    assert True in bf16["10.0"].values(), bf16["10.0"]


def test_stock_dispatch_takes_persistent_topk_on_sm12x(stock):
    """What the guards change: stock picks persistent_topk on 12.x (fine on a release kernel)."""
    for capability in ("12.1", "12.0"):
        assert set(stock[capability].values()) == {"persistent"}, stock[capability]


@pytest.mark.parametrize("capability", ["12.1", "12.0"])
def test_nightly_guards_never_take_persistent_topk_on_sm12x(guarded, capability, vllm_layout):
    chosen = guarded[capability]
    if vllm_layout == LAYOUT_030:  # the kpool indexer's condition: GB10 falls through to per-row
        assert chosen == {"kpool": "per_row"}
        return
    assert chosen["auto/8"] == chosen["auto/128"] == "per_row"
    for rows in (8, 128):
        assert chosen[f"persistent/{rows}"] == (
            "refused: sparse_indexer_topk_backend='persistent' was requested, but: "
            "is not supported on the SM12x family (patchkit)"
        )


@pytest.mark.parametrize("capability", ["9.0", "10.0"])
def test_sm90_and_sm100_keep_their_kernels(stock, guarded, capability):
    assert stock[capability] == guarded[capability]
    assert "persistent" in guarded[capability].values()
