"""patchkit.vllm_rules: the one mirror of vLLM's loading rules, checked against vLLM's own code, and read
by every part that needs a rule (preflight, the CPU smoke's judgement, the variant files, the quantprobe
rows, the MTP ignore)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit.checkpoint.mtp_ignore import SPELLINGS
from patchkit.smoke.load_check import judge
from patchkit.smoke.quantprobe import probe_prefixes
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS, modules
from patchkit.variants.definitions import find_variant
from patchkit.vllm_rules import (
    HF_TO_VLLM_PREFIXES,
    MODELOPT_METHODS,
    hf_to_vllm,
    loads,
    mapped_excludes,
    module_prefix,
)

IMAGES = Path(__file__).resolve().parents[1] / "images"
# Names as checkpoints and quant configs spell them: every module of the synthetic layouts (the real
# tensor names), the entries ModelOpt and compressed-tensors configs list, and what the mapper must leave.
NAMES = sorted({m.name for layout in LAYOUTS.values() for m in modules(layout, TINY_DIMS)}) + [
    "lm_head", "lm_head.weight", "model.visual*", "model.visual.blocks.0.attn.qkv", "re:.*shared_experts.*",
    "Linear", "model.language_model.layers.45.*", "language_model.model.layers.3.mlp"]


@pytest.mark.vllm
def test_the_name_mapper_is_vllms():
    from vllm.models.glm5next import Glm5NextForConditionalGeneration

    theirs = Glm5NextForConditionalGeneration.hf_to_vllm_mapper
    assert tuple(theirs.orig_to_new_prefix.items()) == HF_TO_VLLM_PREFIXES
    assert not (theirs.orig_to_new_substr or theirs.orig_to_new_regex or theirs.orig_to_new_suffix)
    for name in NAMES:
        assert hf_to_vllm(name) == theirs._map_name(name), name


@pytest.mark.vllm
def test_each_modelopt_algorithm_routes_to_the_method_the_table_names():
    """As vLLM's _verify_quantization picks it: the method whose override claims the config, else its
    quant_method."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    for algo, method in MODELOPT_METHODS.items():
        config = {"quant_method": "modelopt", "quant_algo": algo}
        claimed = [m for m in QUANTIZATION_METHODS if m.startswith("modelopt")
                   and get_quantization_config(m).override_quantization_method(dict(config), None) == m]
        assert (claimed or [config["quant_method"]]) == [method], algo


def test_module_prefixes_are_the_mapped_weight_names():
    """A module's vLLM prefix is what the mapper makes of its weights; the MTP draft's is its own."""
    assert module_prefix("lm_head") == "language_model.lm_head" == hf_to_vllm("lm_head.weight")[: -len(".weight")]
    assert module_prefix("model.language_model.layers.3.mlp.experts") == "language_model.model.layers.3.mlp.experts"
    assert module_prefix("model.language_model.layers.45.mlp.experts", mtp=True) == "model.layers.45.mlp.experts"
    rows = probe_prefixes(LAYOUTS["lab"], TINY_DIMS)  # the quantprobe rows take their prefixes from the same rule
    assert ("LinearBase", "language_model.lm_head", "lm_head", "model") in rows
    assert ("RoutedExperts", "model.layers.45.mlp.experts", "model.language_model.layers.45.mlp.experts.0.gate_proj",
            "model") in rows
    assert SPELLINGS[:3] == ("model.layers.{i}.*", "model.language_model.layers.{i}.*", "language_model.model.layers.{i}.*")
    assert mapped_excludes(["model.visual*", "lm_head"]) == ["model.visual", "visual.*", "lm_head"]


def test_the_smoke_judges_storage_with_the_table_preflight_reads():
    """One table, keyed by the checkpoint's format: a routed-experts layer built NVFP4 loads compressed-
    tensors' packed NVFP4 in a compressed-tensors checkpoint and ModelOpt's in a ModelOpt one, never the
    other's (the smoke's old table let NVFP4 load either, whatever the format)."""
    row = {"layer": "RoutedExperts", "prefix": "p", "module": "m", "built": "model", "algo": "NVFP4"}
    redhat, nvidia = find_variant("redhat", IMAGES), find_variant("nvidia-nvfp4", IMAGES)
    assert loads("compressed-tensors", "NVFP4") == {"NVFP4-CT"} and loads("modelopt", "NVFP4") == {"NVFP4"}
    ok = judge(redhat, [dict(row)], {"m": "NVFP4-CT"}, "test")
    assert [r["verdict"] for r in ok.rows] == ["ok"]
    refused = judge(nvidia, [dict(row)], {"m": "NVFP4-CT"}, "test")
    assert [r["verdict"] for r in refused.rows] == ["weights stored NVFP4-CT cannot load as NVFP4"]
    assert loads("modelopt", "None") == loads("compressed-tensors", None) == {"BF16", "F16", "F32"}
    assert loads("modelopt", "NO-SUCH") == frozenset()
