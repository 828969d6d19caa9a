"""preflight on generated header sets (real size and tiny) and on broken checkpoints."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from patchkit.checkpoint.identity import PinMismatch, sha256_bytes
from patchkit.checkpoint.memory import GB10_MEMORY_GIB
from patchkit.checkpoint.preflight import NoMatchingVariant, detect_variant, preflight
from patchkit.checkpoint.quant_config import InvalidQuantConfig, NoQuantConfig, QuantMismatch
from patchkit.images.definitions import series_named
from patchkit.patching.patchset import load_patchset
from patchkit.smoke.synthetic_config import write_header_set
from patchkit.smoke.synthetic_layout import LAYOUTS, REAL_DIMS, TINY_DIMS
from patchkit.variants.definitions import Pins, find_variant
from patchkit.variants.pins import Unpinned

IMAGES = Path(__file__).resolve().parents[1] / "images"
PATCHES = load_patchset(IMAGES.parent / "patches")
DATA = Path(__file__).parent / "data" / "quant-configs"
REDHAT_QC = json.loads((DATA / "redhat-quantization_config.json").read_text())


def unpinned(name: str, **checkpoint_changes):
    v = find_variant(name, IMAGES)
    return replace(v, checkpoint=replace(v.checkpoint, pins=Pins(None, None), **checkpoint_changes))


def series_of(image: str, images: Path = IMAGES) -> list[str]:
    """The patch ids of a real image definition's series (parents included)."""
    return [p.id for p in series_named(image, images, PATCHES)]


def check(root: Path, variant, series: list[str] | None = None, **kw):
    """preflight as the CLI runs it: the real patch set, and the series of the variant's real image."""
    return preflight(root, variant, series=series_of(variant.image) if series is None else series, patchset=PATCHES, **kw)


def pins_of(root: Path) -> dict:
    return {
        "pin_config": sha256_bytes((root / "config.json").read_bytes()),
        "pin_index": sha256_bytes((root / "model.safetensors.index.json").read_bytes()),
    }


def make(tmp_path: Path, layout_name: str, dims=TINY_DIMS, edit_config=None, **layout_changes) -> Path:
    root = tmp_path / layout_name
    write_header_set(root, replace(LAYOUTS[layout_name], **layout_changes), dims, shards=3)
    if edit_config:
        config = json.loads((root / "config.json").read_text())
        edit_config(config)
        (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize("name", ["lab", "4p67", "nvidia-nvfp4", "redhat", "libertai"])
def test_every_variant_layout_passes(tmp_path, name):
    root = make(tmp_path, name)
    report = check(root, unpinned(name), **pins_of(root))
    assert report.ok, report.problems
    assert report.patches["checkpoint"] == sorted(find_variant(name, IMAGES).patches)
    assert report.patches["platform"] == ["nope-mla-pad", "persistent-topk-cc12", "pool-topk-init"]
    assert bool(report.mtp["layers"]) == (name != "redhat")
    json.loads(report.to_json())
    with open("/dev/null", "w") as sink:
        Console(file=sink).print(report)


def test_real_size_nvidia_checkpoint(tmp_path):
    root = make(tmp_path, "nvidia-nvfp4", dims=REAL_DIMS)
    report = check(root, unpinned("nvidia-nvfp4"), **pins_of(root))
    assert report.ok, report.problems
    assert report.tensors > 145_000 and report.header_only_shards == 3
    assert report.mtp == {"layers": [45], "routed_expert_formats": {"BF16": 864}, "excluded_by_override": True}
    mem = report.memory
    assert 85 < mem["weights_gib_per_rank"] < 97 and mem["kv_gib"] == 10.0
    assert mem["total_gib"] == pytest.approx(mem["weights_gib_per_rank"] + 10 + mem["reserve_gib"])
    # One Spark alone cannot hold it.
    alone = check(root, unpinned("nvidia-nvfp4"), tp=1, **pins_of(root))
    assert any(f"exceed GB10's {GB10_MEMORY_GIB} GiB at TP=1" in p for p in alone.problems)


def test_bf16_mtp_outside_ignore_fails_without_the_exclusion(tmp_path):
    root = make(tmp_path, "nvidia-nvfp4")
    report = check(root, unpinned("nvidia-nvfp4", exclude_mtp_from_quant=False), **pins_of(root))
    assert not report.ok
    assert any("mtp routed_expert module(s) stored BF16 but vLLM 0.33 builds them NVFP4" in p for p in report.problems)
    assert any("mtp shared_expert" in p for p in report.problems)


def test_lab_without_the_namespace_patch_is_flagged(tmp_path):
    root = make(tmp_path, "lab")
    variant = replace(unpinned("lab"), patches=())
    report = check(root, variant, **pins_of(root))
    assert report.problems == [
        "the checkpoint needs patch modelopt-mtp-namespace (mtp routed_expert); variant lab does not list it"
    ]


def test_4p67_needs_packed_modules_for_its_attention(tmp_path):
    root = make(tmp_path, "4p67")
    report = check(root, replace(unpinned("4p67"), patches=("modelopt-mtp-namespace",)), **pins_of(root))
    assert len(report.problems) == 1 and "packed-modules-4p67 (main attention, main indexer, mtp attention" in report.problems[0]


def test_redhat_with_mtp_weights_contradicts_the_variant(tmp_path):
    root = make(tmp_path, "redhat", has_mtp=True)
    report = check(root, unpinned("redhat"), **pins_of(root))
    assert "variant says no MTP weights, but the checkpoint has tensors under layers [45]" in report.problems


def test_weight_only_storage_under_a_w4a4_declaration(tmp_path):
    """NVFP4 (W4A4) declared, no input_scale stored: vLLM would fold an unloaded scale."""
    root = make(tmp_path, "nvidia-nvfp4", storage={"routed_expert": "NVFP4A16", "dense_mlp": "NVFP4",
                                                   "mtp:routed_expert": "BF16"})
    report = check(root, unpinned("nvidia-nvfp4"), **pins_of(root))
    assert any("main routed_expert module(s) stored NVFP4A16 but vLLM 0.33 builds them NVFP4" in p for p in report.problems)

    def weight_only(config):  # the same storage declared weight-only: vLLM reroutes to W4A16 and loads it
        for group in config["quantization_config"]["config_groups"].values():
            group.pop("input_activations")

    root2 = make(tmp_path / "b", "nvidia-nvfp4", edit_config=weight_only,
                 storage={"routed_expert": "NVFP4A16", "dense_mlp": "NVFP4A16", "mtp:routed_expert": "BF16"})
    assert check(root2, unpinned("nvidia-nvfp4"), **pins_of(root2)).ok


def test_quantized_attention_in_a_flat_checkpoint_cannot_load(tmp_path):
    root = make(tmp_path, "libertai", storage={"routed_expert": "NVFP4A16", "attention": "NVFP4A16"})
    report = check(root, unpinned("libertai"), **pins_of(root))
    assert any("main attention module(s) stored NVFP4A16 but vLLM 0.33 builds them unquantized" in p for p in report.problems)


def test_identity_and_declaration_fail_closed(tmp_path):
    root = make(tmp_path, "lab")
    with pytest.raises(Unpinned):
        check(root, unpinned("lab"))
    with pytest.raises(PinMismatch) as mismatch:
        check(root, unpinned("lab"), pin_config="0" * 64, pin_index=pins_of(root)["pin_index"])
    assert (mismatch.value.path, mismatch.value.pin) == (root / "config.json", "0" * 64)
    with pytest.raises(QuantMismatch) as declared:
        check(root, unpinned("nvidia-nvfp4"), **pins_of(root))
    assert (declared.value.variant, declared.value.declares, declared.value.expects) == (
        "nvidia-nvfp4", "modelopt MIXED_PRECISION", "modelopt NVFP4")
    # No variant named and no pinned variant matches these files.
    with pytest.raises(NoMatchingVariant, match=r"matches no pinned variant.*--variant") as none:
        detect_variant(root, IMAGES)
    assert (none.value.root, none.value.partial) == (root, ())


def test_a_config_without_its_layers_and_a_tp_below_one_are_refused_with_their_kind(tmp_path):
    from patchkit.checkpoint.memory import BadTensorParallelSize
    from patchkit.checkpoint.preflight import InvalidModelConfig

    def text(config):
        return config.get("text_config", config)

    for name, edit, field, found in [
        ("list", lambda c: c.update(text_config=[1]), "text_config", [1]),
        ("zero", lambda c: text(c).update(num_hidden_layers=0), "num_hidden_layers", 0),
        ("absent", lambda c: text(c).pop("num_hidden_layers"), "num_hidden_layers", None),
        ("bool", lambda c: text(c).update(num_hidden_layers=True), "num_hidden_layers", True),
    ]:
        root = make(tmp_path / name, "lab", edit_config=edit)
        with pytest.raises(InvalidModelConfig) as bad:
            check(root, unpinned("lab"), **pins_of(root))
        assert (bad.value.path, bad.value.field, bad.value.found) == (root / "config.json", field, found)
    root = make(tmp_path / "tp", "lab")
    with pytest.raises(BadTensorParallelSize) as tp:
        check(root, unpinned("lab"), tp=-2, **pins_of(root))
    assert tp.value.tp == -2


def test_variant_is_detected_from_its_pins(tmp_path):
    """A pinned variant is found by hashing alone; here an images dir whose nvidia pins are this set's."""
    root = make(tmp_path, "nvidia-nvfp4")
    images = tmp_path / "images"
    (images / "glm53-flash-nvidia-nvfp4").mkdir(parents=True)
    text = (IMAGES / "glm53-flash-nvidia-nvfp4" / "variant.toml").read_text()
    pins = pins_of(root)
    text = text.replace(find_variant("nvidia-nvfp4", IMAGES).checkpoint.pins.config_sha256, pins["pin_config"])
    text = text.replace(find_variant("nvidia-nvfp4", IMAGES).checkpoint.pins.index_sha256, pins["pin_index"])
    (images / "glm53-flash-nvidia-nvfp4" / "variant.toml").write_text(text)
    report = check(root, detect_variant(root, images))
    assert report.variant == "nvidia-nvfp4" and report.ok


def test_a_partly_pinned_variant_is_named_but_never_detected(tmp_path):
    """redhat pins its index only (a public manifest's hash): a checkpoint whose index matches is not
    trusted by hashing, the refusal names the variant, and naming it still demands the config pin."""
    root = make(tmp_path, "redhat")
    images = tmp_path / "images"
    (images / "glm53-flash-nvfp4-redhat").mkdir(parents=True)
    text = (IMAGES / "glm53-flash-nvfp4-redhat" / "variant.toml").read_text()
    own = find_variant("redhat", IMAGES).checkpoint.pins
    assert own.config_sha256 is None and own.index_sha256 in text
    (images / "glm53-flash-nvfp4-redhat" / "variant.toml").write_text(text.replace(own.index_sha256, pins_of(root)["pin_index"]))
    with pytest.raises(NoMatchingVariant) as none:
        detect_variant(root, images)
    assert none.value.partial == ("redhat",)
    partial = find_variant("redhat", images)
    with pytest.raises(Unpinned) as unpinned_config:
        check(root, partial)
    assert unpinned_config.value.label == "config.json"
    assert check(root, partial, pin_config=pins_of(root)["pin_config"]).ok
    with pytest.raises(PinMismatch) as mismatch:
        check(root, partial, pin_config="0" * 64)
    assert mismatch.value.pin == "0" * 64


# ---------------------------------------------------------------- the real RedHat layout (compressed-tensors)

def test_the_synthetic_redhat_config_is_the_reconstructed_record(tmp_path):
    """The synthetic redhat layout (what preflight tests and the CPU smoke use) writes exactly the
    reconstructed public quantization_config: groups, targets, format, ignore cannot drift apart."""
    from patchkit.smoke.synthetic_config import compressed_tensors_config

    assert compressed_tensors_config() == REDHAT_QC
    written = json.loads((make(tmp_path, "redhat") / "config.json").read_text())["quantization_config"]
    assert written == REDHAT_QC


def test_redhat_mixed_precision_layout_passes_group_by_group(tmp_path):
    """`format: mixed-precision` with an NVFP4 group on the routed experts of layers 3-44: the experts
    are NVFP4, the dense MLP and shared experts unquantized. Forcing the top-level format per module
    (the old reading) would have demanded NVFP4 of every quantizable module."""
    root = make(tmp_path, "redhat")
    report = check(root, unpinned("redhat"), **pins_of(root))
    assert report.ok, report.problems
    assert report.declared["quant_algo"] == "mixed-precision" and report.declared["source"] == "config.json"
    # The same config with a dense MLP stored NVFP4: no group targets it, so vLLM builds it unquantized.
    root2 = make(tmp_path / "b", "redhat", storage={"routed_expert": "NVFP4-CT", "dense_mlp": "NVFP4-CT"})
    problems = check(root2, unpinned("redhat"), **pins_of(root2)).problems
    assert any("main dense_mlp module(s) stored NVFP4-CT but vLLM 0.33 builds them unquantized" in p for p in problems)


def test_compressed_tensors_ignore_and_fused_shards(tmp_path):
    from patchkit.vllm_rules import CompressedTensors, QuantConfigRefused

    quant = {"format": "nvfp4-pack-quantized", "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}},
             "ignore": ["re:.*shared_experts.*", "model.language_model.layers.0.mlp.gate_proj"]}
    ct = CompressedTensors(quant, "test")
    assert ct.target_of("language_model.model.layers.3.mlp.shared_experts.down_proj", "RowParallelLinear") is None
    assert ct.target_of("language_model.model.layers.1.mlp.down_proj", "RowParallelLinear") == "Linear"
    # gate_proj ignored (its layer-path entry mapped to vLLM's name) but up_proj not: vLLM refuses the fused layer
    with pytest.raises(QuantConfigRefused, match="some of its fused shards are ignored") as err:
        ct.target_of("language_model.model.layers.0.mlp.gate_up_proj", "MergedColumnParallelLinear")
    assert err.value.where == "language_model.model.layers.0.mlp.gate_up_proj"
    # the three projections of expert 0 must agree (CompressedTensorsMoEMethod.get_moe_method)
    split = {**quant, "ignore": ["re:.*experts\\.0\\.up_proj"]}
    with pytest.raises(QuantConfigRefused, match="resolve to different schemes") as err:
        CompressedTensors(split, "test").moe_scheme("language_model.model.layers.3.mlp.experts")
    assert err.value.where == "language_model.model.layers.3.mlp.experts"
    for bad, problem in (({"config_groups": [1]}, "config_groups is not an object"),
                         ({"config_groups": {"g": {"weights": {}}}}, "config group 'g' has no targets list")):
        with pytest.raises(QuantConfigRefused) as err:
            CompressedTensors(bad, "hf_quant_config.json")
        assert (err.value.where, err.value.problem) == ("hf_quant_config.json", problem)
    assert ct.moe_scheme("language_model.model.layers.3.mlp.experts")["group"] == "g"  # Linear -> RoutedExperts


@pytest.mark.vllm
def test_the_mirror_matches_vllms_own_resolution_on_the_real_config():
    """vLLM's own functions on the same config: which target (or none) each layer of the model gets."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
        find_matched_target,
        should_ignore_layer,
    )
    from vllm.model_executor.models.glm4_1v import Glm4vForConditionalGeneration

    from patchkit.vllm_rules import PACKED_MODULES, CompressedTensors

    extra = {"re:.*shared_experts.*": None}
    for quant in (REDHAT_QC, {**REDHAT_QC, "ignore": [*REDHAT_QC["ignore"], *extra, "model.language_model.layers.1.mlp.gate_proj",
                                                      "model.language_model.layers.1.mlp.up_proj"]}):
        theirs = CompressedTensorsConfig.from_config(json.loads(json.dumps(quant)))
        theirs.apply_vllm_mapper(Glm4vForConditionalGeneration.hf_to_vllm_mapper)
        theirs._add_fused_moe_to_target_scheme_map()
        ours = CompressedTensors(quant, "test")
        layers = []
        for i in range(46):
            base = f"language_model.model.layers.{i}.mlp" if i < 45 else f"model.layers.{i}.mlp"
            layers += [(f"{base}.experts.0.{p}", "RoutedExperts") for p in ("gate_proj", "up_proj", "down_proj")]
            layers += [(f"{base}.gate_up_proj", "MergedColumnParallelLinear"), (f"{base}.down_proj", "RowParallelLinear"),
                       (f"{base}.shared_experts.down_proj", "RowParallelLinear")]
        layers.append(("language_model.lm_head", "ParallelLMHead"))
        for name, cls in layers:
            module = type(cls, (), {})()
            want = None if should_ignore_layer(name, theirs.ignore, PACKED_MODULES) else find_matched_target(
                name, module, theirs.target_scheme_map.keys(), PACKED_MODULES)
            assert ours.target_of(name, cls) == want, name


def test_modelopt_mixed_reads_its_layer_table_from_hf_quant_config_json(tmp_path):
    """vLLM's get_quant_config: a modelopt_mixed config.json table without quantized_layers falls through
    to the checkpoint's one hf_quant_config.json ({"producer": ..., "quantization": {...}})."""
    moved = {}

    def split(config):
        quant = config["quantization_config"]
        moved.update(quant)
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}

    root = make(tmp_path, "lab", edit_config=split)
    nested = {"producer": {"name": "modelopt", "version": "0.47.0"},
              "quantization": {k: v for k, v in moved.items() if k not in ("quant_method", "ignore")}
              | {"exclude_modules": moved.get("ignore", [])}}
    (root / "hf_quant_config.json").write_text(json.dumps(nested))
    report = check(root, unpinned("lab"), **pins_of(root))
    assert report.ok, report.problems
    assert report.declared["source"] == "hf_quant_config.json"
    assert report.identity["hf_quant_config_sha256"] == sha256_bytes((root / "hf_quant_config.json").read_bytes())
    assert any("which no pin covers" in n for n in report.notes)

    (root / "hf_quant_config.json").write_text(json.dumps({**nested, "producer": {"name": "other"}}))
    with pytest.raises(InvalidQuantConfig) as producer:
        check(root, unpinned("lab"), **pins_of(root))
    assert (producer.value.where, producer.value.field) == (str(root / "hf_quant_config.json"), "producer.name")
    (root / "hf_quant_config.json").unlink()
    with pytest.raises(NoQuantConfig, match=r"no quantization_config with quantized_layers.*\(found none\)") as none:
        check(root, unpinned("lab"), **pins_of(root))
    assert (none.value.method, none.value.without_layers, none.value.found) == ("modelopt_mixed", True, ())


def _rename_tensors(root: Path, old: str, new: str) -> None:
    """Rewrite a tensor-name component in the index and in every shard header (header-only shards)."""
    import struct

    index = json.loads((root / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k.replace(old, new): v for k, v in index["weight_map"].items()}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in set(index["weight_map"].values()):
        raw = (root / shard).read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + length])
        header = json.dumps({k.replace(old, new): v for k, v in header.items()}).encode()
        (root / shard).write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length :])


def test_tensor_name_spelling_is_judged_against_the_images_series(tmp_path):
    """The nested spelling needs a patch that loads it (naming-shim's [needed_when] spelling rule): the lab
    image's real series carries it; the same series without it is refused, naming the patch."""
    root = make(tmp_path, "lab")
    unshimmed = [p for p in series_of("glm53-flash-nvfp4-lab") if p != "naming-shim"]
    flat = check(root, unpinned("lab"), unshimmed, **pins_of(root))
    assert flat.spelling["kind"] == "flat" and flat.ok, flat.problems
    assert flat.patches["spelling"] == [] and flat.patches["missing"] == []
    _rename_tensors(root, ".hc_attn_fn", ".attn_hc.fn")
    nested = check(root, unpinned("lab"), unshimmed, **pins_of(root))
    assert (nested.spelling["kind"], nested.spelling["nested"]) == ("mixed", {"hyper-connections": 45})
    assert nested.patches["spelling"] == ["naming-shim"]
    assert [(m["patch"], m["why"]) for m in nested.patches["missing"]] == [
        ("naming-shim", PATCHES.patch("naming-shim").needed_when.why)]
    assert len(nested.problems) == 1 and "lacks patch naming-shim" in nested.problems[0]
    assert "lacks naming-shim: vLLM 0.30-0.33 stop at the first nested name" in nested.spelling["verdict"]
    shimmed = check(root, unpinned("lab"), **pins_of(root))  # the lab image's own series
    assert shimmed.ok and shimmed.spelling["verdict"].endswith("image glm53-flash-nvfp4-lab loads them through naming-shim")


def test_an_image_without_a_platform_patch_the_variant_needs_is_refused(tmp_path):
    """The real images/ pass; a copy of them whose root image leaves out pool-topk-init (which every child
    inherits) fails the lab variant: the missing patch named, with its patch.toml reason and what met it."""
    root = make(tmp_path, "lab")
    good = check(root, unpinned("lab"), **pins_of(root))
    assert good.ok and good.patches["missing"] == [], good.problems
    assert good.patches["platform"] == ["nope-mla-pad", "persistent-topk-cc12", "pool-topk-init"]
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images)
    definition = images / "glm53-flash-nvfp4" / "image.toml"
    text = definition.read_text()
    assert text.count('"pool-topk-init", ') == 1
    definition.write_text(text.replace('"pool-topk-init", ', ""))
    series = series_of("glm53-flash-nvfp4-lab", images)
    assert "pool-topk-init" not in series and "persistent-topk-cc12" in series
    report = check(root, unpinned("lab"), series, **pins_of(root))
    assert not report.ok
    need = PATCHES.patch("pool-topk-init").needed_when
    assert need.config_set == ["index_topk"]
    assert report.patches["missing"] == [{"patch": "pool-topk-init", "why": need.why,
                                          "found": [f"config index_topk = {4 * TINY_DIMS.kpool * 32}"]}]
    assert len(report.problems) == 1
    assert all(word in report.problems[0] for word in ("glm53-flash-nvfp4-lab", "pool-topk-init", "variant lab", need.why))


def test_cli_preflight_refuses_an_images_folder_missing_a_needed_patch(tmp_path):
    """`patchkit preflight --images DIR` judges DIR's definitions (exit 1, JSON names the missing patch)."""
    import subprocess
    import sys

    root = make(tmp_path, "4p67")  # an unpinned variant: the pins are given
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images)
    definition = images / "glm53-flash-nvfp4" / "image.toml"
    definition.write_text(definition.read_text().replace('"pool-topk-init", ', ""))
    pins = pins_of(root)
    run = subprocess.run([sys.executable, "-m", "patchkit", "preflight", str(root), "--variant", "4p67", "--json",
                          "--images", str(images), "--patches", str(PATCHES.folder),
                          "--pin-config", pins["pin_config"], "--pin-index", pins["pin_index"]],
                         capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is False and report["image"] == "glm53-flash-nvfp4-4p67"
    assert [m["patch"] for m in report["patches"]["missing"]] == ["pool-topk-init"]


def test_cli_preflight_reads_the_series_of_the_variants_image(tmp_path):
    import subprocess
    import sys

    root = make(tmp_path, "4p67")
    pins = pins_of(root)
    run = subprocess.run([sys.executable, "-m", "patchkit", "preflight", str(root), "--variant", "4p67", "--json",
                          "--pin-config", pins["pin_config"], "--pin-index", pins["pin_index"]],
                         capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    verdict = json.loads(run.stdout)["spelling"]["verdict"]
    assert verdict.startswith("flat tensor names") and verdict.endswith("image glm53-flash-nvfp4-4p67 loads them as stored")
