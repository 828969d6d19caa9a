"""The CPU load smoke: reference-packed tiny checkpoints resolved through stock and patched vLLM.

Runs in the `nox -s tests` environment, which holds both vLLM (the `stock_vllm`/`patched_vllm` fixtures)
and nvidia-modelopt for the packing (PATCHKIT_MODELOPT_PYTHON points elsewhere if needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit import PINNED_VLLM
from patchkit.smoke.cpu import _job, build_checkpoints, smoke_cpu
from patchkit.smoke.load_check import judge
from patchkit.smoke.quantprobe import SRC, probe_prefixes, quantprobe
from patchkit.smoke.synthetic_config import (
    hf_quant_config,
    modelopt_config_json,
)
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS, modules
from patchkit.variants.definitions import load_variants

IMAGES = Path(__file__).resolve().parents[1] / "images"
PATCHES = IMAGES.parent / "patches"
def _modelopt_python() -> Path | None:
    """ModelOpt's interpreter: PATCHKIT_MODELOPT_PYTHON, else this one when it has ModelOpt (nox -s tests)."""
    if os.environ.get("PATCHKIT_MODELOPT_PYTHON"):
        return Path(os.environ["PATCHKIT_MODELOPT_PYTHON"])
    return Path(sys.executable) if importlib.util.find_spec("modelopt") else None


MODELOPT_PYTHON = _modelopt_python()


def _need_modelopt():
    if MODELOPT_PYTHON is None or not MODELOPT_PYTHON.exists():
        message = "no ModelOpt environment (nox -s tests installs it; or set PATCHKIT_MODELOPT_PYTHON)"
        if os.environ.get("PATCHKIT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


def test_every_expected_row_is_a_probed_layer():
    for variant in load_variants(IMAGES).values():
        probed = {(layer, prefix) for layer, prefix, _, _ in probe_prefixes(LAYOUTS[variant.name], TINY_DIMS)}
        for row in variant.expect.quantprobe:
            assert (row.layer, row.prefix) in probed, (variant.name, row)


def test_config_mirror_matches_modelopt():
    """modelopt_config_json (used for header sets without ModelOpt) equals ModelOpt's own converter."""
    _need_modelopt()
    inputs = {}
    for name, layout in LAYOUTS.items():
        if layout.fmt == "modelopt":
            inputs[name] = hf_quant_config(layout, TINY_DIMS, modules(layout, TINY_DIMS))
    code = (
        "import json,sys\n"
        "from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format as c\n"
        "print(json.dumps({k: c(v) for k, v in json.loads(sys.stdin.read()).items()}))\n"
    )
    proc = subprocess.run([str(MODELOPT_PYTHON), "-c", code], input=json.dumps(inputs), capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(SRC)), check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(real) == {"nvidia-nvfp4", "libertai", "lab", "4p67"}
    for name, hf_quant in inputs.items():
        assert modelopt_config_json(hf_quant) == real[name], name


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke-cpu")


@pytest.mark.vllm
def test_stock_vllm_shows_the_failures_the_patches_fix(stock_vllm, workdir):
    _need_modelopt()
    variants = list(load_variants(IMAGES).values())
    reports = {r.variant: r for r in smoke_cpu(variants, workdir, str(MODELOPT_PYTHON), stock_vllm.python, stock_vllm.root, "stock")}
    assert {n for n, r in reports.items() if r.ok} == {"nvidia-nvfp4", "redhat", "libertai"}
    lab = reports["lab"].problems
    assert lab == ["model.layers.45.mlp.experts: resolves to None: expected MXFP8; weights stored MXFP8 cannot load as None"]
    p4 = "\n".join(reports["4p67"].problems)
    assert "model.layers.45.mlp.experts: resolves to None: expected W4A16_NVFP4" in p4
    assert "language_model.model.layers.0.self_attn.in_proj_qkvbfg_a: resolves to None: expected MXFP8" in p4


@pytest.mark.vllm
def test_patched_vllm_loads_every_variant(patched_vllm, workdir):
    _need_modelopt()
    variants = list(load_variants(IMAGES).values())
    for report in smoke_cpu(variants, workdir, str(MODELOPT_PYTHON), patched_vllm.python, patched_vllm.root, "patched"):
        assert report.ok, (report.variant, report.problems)
        assert all(r["verdict"] == "ok" for r in report.rows)


@pytest.mark.vllm
def test_nvidia_needs_the_mtp_override(stock_vllm, workdir):
    """Without serve-args' --hf-overrides, vLLM builds the BF16 predictor NVFP4."""
    _need_modelopt()
    nvidia = load_variants(IMAGES)["nvidia-nvfp4"]
    build_checkpoints([nvidia.name], workdir, str(MODELOPT_PYTHON))
    job, stored = _job(nvidia, workdir, exclude_mtp=False)
    report = judge(nvidia, quantprobe([job], stock_vllm.python, stock_vllm.root)[0], stored, "stock, no override")
    assert "model.layers.45.mlp.experts: resolves to NVFP4: expected None; weights stored BF16 cannot load as NVFP4" in report.problems


def _smoked_on(image) -> set[str]:
    """The releases an image's CPU smoke runs on: the layout its base's vLLM has, and the pinned release."""
    return {image.packages["vllm"].layout or PINNED_VLLM, PINNED_VLLM}


@pytest.mark.vllm
def test_each_image_loads_its_variants_on_its_base_layout(vllm_release, workdir, tmp_path_factory):
    """Each image's own series (not the default one) on the release whose layout its base has (every
    image's base is the day-0 build, layout 0.30.0) and on the pinned release; on 0.31.0/0.32.0 no
    image's base has the layout, so none is smoked there (the default series is, above)."""
    _need_modelopt()
    from patchkit.images.definitions import load_images
    from patchkit.patching.copies import installed_package, patched_copy
    from patchkit.patching.patchset import load_patchset

    patchset = load_patchset(PATCHES)
    images = load_images(IMAGES, patchset)
    chosen = [image for image in images.values() if str(vllm_release) in _smoked_on(image)]
    if not chosen:
        pytest.skip(f"vLLM {vllm_release}: no image's base has this layout (images are smoked on "
                    f"{sorted(set().union(*map(_smoked_on, images.values())))})")
    by_image = {}
    for variant in load_variants(IMAGES).values():
        by_image.setdefault(variant.image, []).append(variant)
    smoked = []
    for image in chosen:
        site = tmp_path_factory.mktemp(f"image-{image.name}")
        patched_copy(installed_package("vllm"), site, patchset.series(list(image.series)))
        for report in smoke_cpu(by_image.get(image.name, []), workdir, str(MODELOPT_PYTHON), sys.executable, site, image.name):
            assert report.ok, (str(vllm_release), image.name, report.variant, report.problems)
            smoked.append(report.variant)
    assert smoked, f"no variant is served by {[i.name for i in chosen]}"
