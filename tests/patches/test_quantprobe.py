"""quantprobe: `PATCHKIT_QUANTPROBE=1` makes the real resolution path print the `[quantprobe]` boot marker.

One probe per tree builds vLLM's real GLM-5.3 layers on CPU (tests/patches/quant_configs.py) under three
checkpoint quant configs and captures what vLLM writes to stderr while it does: ModelOpt
MIXED_PRECISION shaped like the lab checkpoint (NVFP4 routed experts, MXFP8 MTP experts, the rest
BF16), flat ModelOpt NVFP4 with an ignore list shaped like nvidia's, and compressed-tensors NVFP4 W4A4
shaped like RedHat's. Each layer resolves its quant method through vLLM's own
`resolve_quant_method` -> `get_quant_method`; the probe only reads stderr.

Stock vLLM prints no marker (vLLM has none). Patched with the variable: every linear and routed-experts
layer built with the config prints one line in the documented format (the regex is read from the
patch's own text), with the algorithm the real resolution chose. Patched without it: nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from quant_configs import probe_prelude

from patchkit.patching.patchset import load_patchset
from probes import patches_under_test, probe_fixtures

REPO = Path(__file__).resolve().parents[2]
ON = {"HF_HUB_OFFLINE": "1", "PATCHKIT_QUANTPROBE": "1"}
OFF = {"HF_HUB_OFFLINE": "1", "PATCHKIT_QUANTPROBE": ""}

PROBE = probe_prelude() + r'''
import contextlib, importlib, io, json, pkgutil, tempfile
from quant_configs import *

env = Glm5NextOnCpu(tempfile.mkdtemp())
# Like the ModelOpt MoE backend oracles Glm5NextOnCpu replaces: compressed-tensors' NVFP4 MoE method
# picks a GPU kernel at construction (none exists on a CPU); the choice has no bearing on the resolution.
import vllm.model_executor.layers.quantization.compressed_tensors as ct_package
for info in pkgutil.walk_packages(ct_package.__path__, ct_package.__name__ + "."):
    if info.name.endswith("nvfp4"):
        module = importlib.import_module(info.name)
        if hasattr(module, "select_nvfp4_moe_backend"):
            module.select_nvfp4_moe_backend = lambda *args, **kwargs: (None, None)

# RedHatAI/GLM-5.3-Flash-NVFP4's quantization_config as the public records give it (tests/data/README.md):
# top-level format mixed-precision, NVFP4 W4A4 on the routed experts of layers 3-44 by regex target,
# everything else in no group (BF16).
COMPRESSED_TENSORS = json.loads(__REDHAT_CONFIG__)

def stderr_while_building(quantization_config, layers, mtp=False):
    env.checkpoint(quantization_config)
    env.target()
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        for index in layers:
            env.target_layer(index)
        if mtp:
            env.mtp_layer()
    return captured.getvalue().splitlines()

print(json.dumps({
    "mixed": stderr_while_building(lab_quantization_config(), [0, 3], mtp=True),
    "flat": stderr_while_building(nvidia_quantization_config(), [3]),
    "compressed_tensors": stderr_while_building(COMPRESSED_TENSORS, [0, 3]),
}))
'''

PROBE = PROBE.replace("__REDHAT_CONFIG__", repr((REPO / "tests/data/quant-configs/redhat-quantization_config.json").read_text()))
stock, patched = probe_fixtures(PROBE, ON)


@pytest.fixture(scope="module")
def patched_off(patched_vllm):
    return patched_vllm.run(PROBE, env=OFF)


def documented_line() -> re.Pattern:
    """The line's regex as the patch documents it for readers of boot logs."""
    why = patches_under_test().patch("quantprobe").why  # a rebased set documents its own line
    (regex,) = [line.strip() for line in why.splitlines() if line.strip().startswith("^\\[quantprobe\\]")]
    return re.compile(regex)


def markers(lines: list[str]) -> list[str]:
    return [line for line in lines if "quantprobe" in line]


@pytest.mark.vllm
def test_stock_vllm_prints_no_marker(stock):
    for config, lines in stock.items():
        assert markers(lines) == [], config


@pytest.mark.vllm
def test_without_the_variable_the_patched_tree_prints_nothing(patched_off):
    for config, lines in patched_off.items():
        assert markers(lines) == [], config


@pytest.mark.vllm
def test_every_marker_has_the_documented_format(patched):
    line = documented_line()
    for config, lines in patched.items():
        found = markers(lines)
        assert found, f"{config}: no [quantprobe] line"
        for text in found:
            assert line.fullmatch(text), f"{config}: {text!r}"


def rows(lines: list[str]) -> dict[str, tuple[str, str]]:
    line = documented_line()
    out = {}
    for text in markers(lines):
        layer, prefix, algo = line.fullmatch(text).groups()
        assert prefix not in out, f"{prefix} reported twice"
        out[prefix] = (layer, algo)
    return out


@pytest.mark.vllm
def test_modelopt_mixed_precision_reports_its_per_prefix_resolution(patched):
    got = rows(patched["mixed"])
    # the recipes' marker of a live MTP namespace fix, and the main model's NVFP4 experts
    assert got["model.layers.45.mlp.experts"] == ("RoutedExperts", "MXFP8")
    assert got["language_model.model.layers.3.mlp.experts"] == ("RoutedExperts", "NVFP4")
    # BF16 parts of the lab checkpoint resolve to no quantized method
    assert got["language_model.model.layers.3.mlp.shared_experts.gate_up_proj"] == ("LinearBase", "None")
    assert got["language_model.model.layers.0.mlp.gate_up_proj"] == ("LinearBase", "None")


@pytest.mark.vllm
def test_flat_modelopt_reports_its_algorithm_and_the_ignore_list(patched):
    got = rows(patched["flat"])
    assert got["language_model.model.layers.3.mlp.experts"] == ("RoutedExperts", "NVFP4")
    assert got["language_model.model.layers.3.mlp.shared_experts.gate_up_proj"] == ("LinearBase", "None")


@pytest.mark.vllm
def test_compressed_tensors_reports_the_matched_scheme(patched):
    got = rows(patched["compressed_tensors"])
    assert got["language_model.model.layers.3.mlp.experts"] == ("RoutedExperts", "NVFP4")
    assert got["language_model.model.layers.3.mlp.shared_experts.down_proj"] == ("LinearBase", "None")
    # Layer 0's dense MLP matches no group's regex target: unquantized, as the redhat variant expects.
    assert got["language_model.model.layers.0.mlp.gate_up_proj"] == ("LinearBase", "None")


def test_every_image_carries_the_probe():
    from patchkit.images.definitions import load_images

    patchset = load_patchset(REPO / "patches")
    for name, image in load_images(REPO / "images", patchset).items():
        assert "quantprobe" in image.series, name
        assert image.env.get("PATCHKIT_QUANTPROBE") is None, f"{name}: the probe is opt-in, never set by the image"
