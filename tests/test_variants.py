"""The five variant definitions and the validation that keeps a wrong one from loading."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from patchkit.errors import PatchkitError
from patchkit.variants.definitions import PINNED_KV_BYTES, UnknownVariant, find_variant, load_variant, load_variants
from patchkit.variants.pins import InvalidPin, PinContradicted, Unpinned, resolve_pins
from patchkit.vllm_rules import UnloadableCheckpoint, WrongQuantMethod, check_method

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
PINS = Path(__file__).parent / "data" / "pins"  # public records of checkpoint identities (tests/data/README.md)
SHA_A = "a" * 64
SHA_B = "b" * 64


@pytest.fixture(scope="module")
def variants():
    return load_variants(IMAGES)


def test_all_five_variants_load_with_their_image_dirs(variants):
    assert {v.name: v.image for v in variants.values()} == {
        "libertai": "glm53-flash-nvfp4",
        "lab": "glm53-flash-nvfp4-lab",
        "4p67": "glm53-flash-nvfp4-4p67",
        "nvidia-nvfp4": "glm53-flash-nvidia-nvfp4",
        "redhat": "glm53-flash-nvfp4-redhat",
    }


def test_shared_serve_contract(variants):
    for v in variants.values():
        assert v.serve.served_model_name == "glm53"
        assert v.serve.tensor_parallel_size == 2
        assert v.serve.kv_cache_memory_bytes == PINNED_KV_BYTES == 10737418240
        assert v.serve.kv_cache_dtype == "fp8_ds_mla"


def test_speculation_only_where_the_checkpoint_has_mtp(variants):
    spec = {n: (v.serve.speculative and v.serve.speculative.num_speculative_tokens) for n, v in variants.items()}
    assert spec == {"lab": 3, "4p67": 3, "nvidia-nvfp4": 3, "libertai": 5, "redhat": None}
    assert variants["redhat"].checkpoint.mtp == "absent"


def test_quantization_methods_are_vllm_033_names(variants):
    assert {n: v.quantization for n, v in variants.items()} == {
        "lab": "modelopt_mixed",
        "4p67": "modelopt_mixed",
        "nvidia-nvfp4": "modelopt_fp4",
        "libertai": "modelopt_fp4",
        "redhat": "compressed-tensors",
    }


@pytest.mark.vllm
def test_methods_exist_in_the_pinned_vllm(stock_vllm, variants):
    """The names come from the installed vLLM 0.33's own QUANTIZATION_METHODS, not from memory."""
    known = stock_vllm.run(
        "import json\n"
        "from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS\n"
        "print(json.dumps(list(QUANTIZATION_METHODS)))\n"
    )
    for name in ("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "compressed-tensors"):
        assert name in known
    assert {v.quantization for v in variants.values()} <= set(known)


def test_pinned_variants_are_those_with_public_records_and_only_nvidia_excludes_its_mtp(variants):
    nvidia = variants["nvidia-nvfp4"]
    assert nvidia.pinned and nvidia.checkpoint.revision == "423acf37583782c51c142d145aef733d72943d93"
    assert nvidia.checkpoint.exclude_mtp_from_quant
    assert {n for n, v in variants.items() if v.pinned} == {"nvidia-nvfp4", "lab"}
    assert [n for n, v in variants.items() if v.checkpoint.exclude_mtp_from_quant] == ["nvidia-nvfp4"]


def test_lab_pins_are_the_public_runtime_locks(variants):
    """tests/data/pins: a public GB10 runtime lock of the lab checkpoint (tests/data/README.md)."""
    record = json.loads((PINS / "sparkring-glm53-flash-pins.json").read_text())["target_model"]
    lab = variants["lab"].checkpoint
    assert (lab.repo, lab.revision) == (record["repository"], record["revision"])
    assert (lab.pins.config_sha256, lab.pins.index_sha256) == (record["config_sha256"], record["weight_index_sha256"])
    assert record["quantization"]["algorithm"] == lab.quant_algo and "sparkring" in lab.pin_source


def sparkring_record(name: str) -> dict:
    """A sparkring checkpoint profile: repository, revision and each file's size and sha256."""
    record = json.loads((PINS / name).read_text())
    return {"repo": record["repository"], "revision": record["revision"],
            "config": record["files"]["config.json"]["sha256"], "index": record["files"][record["index"]]["sha256"]}


def test_the_lab_qad_revision_is_another_checkpoint_and_fails_the_identity_check(variants):
    """175ae8ce ("NVFP4 QAD") shares 520de24e's config.json but not its index: the variant stays on the
    revision its measurements and runtime lock are for, and a QAD download is refused at the index."""
    qad, lab = sparkring_record("sparkring-lab-175ae8ce-pins.json"), variants["lab"].checkpoint
    assert qad["repo"] == lab.repo and qad["revision"] != lab.revision
    assert qad["config"] == lab.pins.config_sha256 and qad["index"] != lab.pins.index_sha256
    assert "520de24e" in lab.pin_source and "175ae8ce" not in lab.pin_source


def test_nvidia_keeps_its_pinned_revision_and_a_da920bb0_download_is_refused(variants):
    """sparkring's record of revision da920bb0 shares the index pin but not the config.json pin of the
    variant's 423acf37 (docs/field-records.md): the variant is not switched, and such a download fails the
    config check."""
    record, nvidia = sparkring_record("sparkring-nvidia-da920bb0-pins.json"), variants["nvidia-nvfp4"].checkpoint
    assert record["repo"] == nvidia.repo and record["revision"] != nvidia.revision
    assert record["index"] == nvidia.pins.index_sha256 and record["config"] != nvidia.pins.config_sha256
    field_records = (REPO / "docs" / "field-records.md").read_text()
    assert record["revision"] in field_records and record["config"] in field_records


def test_redhat_index_pin_is_the_public_manifests_and_its_config_stays_unpinned(variants):
    """uwoobeat's manifest of the Hub files at the pinned revision: the index is LFS (its sha256 is the
    file's), config.json is not and has no hash. A partial pin stays fail-closed for the unknown part."""
    rows = {row["path"]: row for row in csv.DictReader((PINS / "uwoobeat-redhat-36c184c6-files.tsv").open(), delimiter="\t")}
    redhat = variants["redhat"]
    for row in rows.values():
        assert f"/resolve/{redhat.checkpoint.revision}/" in row["url"] and redhat.checkpoint.repo in row["url"]
    assert redhat.checkpoint.pins.index_sha256 == rows["model.safetensors.index.json"]["upstream_lfs_sha256"]
    assert rows["config.json"]["upstream_lfs_sha256"] == "" and redhat.checkpoint.pins.config_sha256 is None
    assert not redhat.pinned and "--pin-config" in redhat.checkpoint.pin_source
    with pytest.raises(Unpinned) as unpinned:
        resolve_pins(redhat)
    assert (unpinned.value.variant, unpinned.value.label) == ("redhat", "config.json")
    index = redhat.checkpoint.pins.index_sha256
    assert resolve_pins(redhat, config_sha256=SHA_A) == resolve_pins(redhat, config_sha256=SHA_A, index_sha256=index)
    assert resolve_pins(redhat, config_sha256=SHA_A).index_sha256 == index
    with pytest.raises(PinContradicted) as contradicted:
        resolve_pins(redhat, config_sha256=SHA_A, index_sha256=SHA_B)
    assert (contradicted.value.label, contradicted.value.own, contradicted.value.given) == (
        "model.safetensors.index.json", index, SHA_B)


def test_aliases_resolve():
    assert find_variant("nvfp4-spark", IMAGES).name == "lab"
    with pytest.raises(UnknownVariant, match="unknown variant 'nope'; known: ") as info:
        find_variant("nope", IMAGES)
    assert info.value.name == "nope" and "lab (nvfp4-spark)" in info.value.known


def test_variant_patches_exist_in_the_patch_set(variants):
    patches = REPO / "patches"
    if not any(patches.glob("*/patch.toml")):
        pytest.skip("the patch set (issue 3) is not in this checkout yet")
    for v in variants.values():
        for patch in v.patches:
            assert (patches / patch / "patch.toml").is_file(), (v.name, patch)


# ------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("fmt", "algo", "method", "needed"),
    [
        ("modelopt", "NVFP4", "modelopt", "modelopt_fp4"),
        ("modelopt", "MIXED_PRECISION", "modelopt_fp4", "modelopt_mixed"),
        ("modelopt", "MXFP8", "modelopt_mixed", "modelopt_mxfp8"),
        ("compressed-tensors", "nvfp4-pack-quantized", "modelopt_fp4", "compressed-tensors"),
    ],
)
def test_wrong_method_pairing_is_a_clear_error(fmt, algo, method, needed):
    with pytest.raises(WrongQuantMethod) as info:
        check_method(fmt, algo, method, "here")
    assert (info.value.where, info.value.method, info.value.needed) == ("here", method, needed)


def test_the_modelopt_fp8_method_is_named_as_such():
    with pytest.raises(WrongQuantMethod, match=r"needs 'modelopt_fp4'.*`modelopt` is the FP8 config"):
        check_method("modelopt", "NVFP4", "modelopt", "here")


@pytest.mark.parametrize(("fmt", "algo"), [("modelopt", "INT4_AWQ"), ("gguf", "Q4")])
def test_a_layout_vllm_cannot_load_is_refused(fmt, algo):
    with pytest.raises(UnloadableCheckpoint, match=r"^here: ") as info:
        check_method(fmt, algo, fmt, "here")
    assert (info.value.fmt, info.value.quant_algo, info.value.where) == (fmt, algo, "here")


def test_right_pairings_pass():
    for fmt, algo, method in [
        ("modelopt", "FP8", "modelopt"),
        ("modelopt", "w4a16_nvfp4", "modelopt_fp4"),
        ("modelopt", "MXFP8", "modelopt_mxfp8"),
    ]:
        check_method(fmt, algo, method, "here")


def _copy(tmp_path: Path, image: str, edit) -> Path:
    target = tmp_path / image
    target.mkdir()
    text = (IMAGES / image / "variant.toml").read_text()
    new = edit(text)
    assert new != text, "the edit must change the file"
    (target / "variant.toml").write_text(new)
    return target / "variant.toml"


@pytest.mark.parametrize(
    ("image", "old", "new", "message"),
    [
        ("glm53-flash-nvfp4-lab", 'quantization = "modelopt_mixed"', 'quantization = "modelopt"',
         r"\[vllm\], key 'quantization': 'modelopt' does not load .* needs 'modelopt_mixed'"),
        ("glm53-flash-nvfp4-lab", 'quant_algo = "MIXED_PRECISION"', 'quant_algo = "INT4_AWQ"',
         r"\[checkpoint\], key 'quant_algo': ModelOpt quant_algo 'INT4_AWQ' is not one vLLM 0.33 loads"),
        ("glm53-flash-nvfp4-redhat", "mtp_speculator = false", "mtp_speculator = true",
         r"\[expect\], key 'mtp_speculator': true while \[serve\] has no speculative"),
        ("glm53-flash-nvfp4-lab", 'mtp = "quantized"', 'mtp = "absent"',
         r"\[serve\], key 'speculative': MTP speculation needs MTP weights, and the checkpoint has none"),
        ("glm53-flash-nvfp4-redhat", 'mtp = "absent"', 'mtp = "bf16"',
         r"\[serve\]: missing key 'speculative': the checkpoint has MTP weights"),
        ("glm53-flash-nvfp4-lab", "kv_cache_memory_bytes = 10737418240", "kv_cache_memory_bytes = 1",
         r"\[serve\], key 'kv_cache_memory_bytes': the GLM-5.3 recipes pin kv_cache_memory_bytes=10737418240, got 1"),
        ("glm53-flash-nvfp4-lab", '"--enforce-eager",', '"--enforce-eager", "--quantization", "fp8",',
         r"\[serve\], key 'args': '--quantization' is set by a structured field"),
        ("glm53-flash-nvfp4-lab", '"enable_flashinfer_autotune":false}', '"enable_flashinfer_autotune":false',
         r"\[serve\], key 'args': value of --kernel-config is not JSON"),
        ("glm53-flash-nvfp4-lab", 'HF_HUB_OFFLINE = "1"', "HF_HUB_OFFLINE = 1",
         r"\[serve.env\], key 'HF_HUB_OFFLINE': expected `str`, got `int`"),
        ("glm53-flash-nvfp4-lab", "exclude_mtp_from_quant = false", "exclude_mtp_from_quant = true",
         r"\[checkpoint\], key 'exclude_mtp_from_quant': applies only"),
        ("glm53-flash-nvfp4-lab", 'algo = "MXFP8"', 'algo = "MXFP9"',
         r"\[\[expect.quantprobe\]\] #1, key 'algo': invalid enum value 'MXFP9'; expected one of .*'W4A16_NVFP4'"),
        ("glm53-flash-nvfp4-lab", 'prefix = "model.layers.45.mlp.experts"',
         'prefix = "language_model.model.layers.3.mlp.experts"',
         r"\[\[expect.quantprobe\]\] #2, key 'prefix': 'language_model.model.layers.3.mlp.experts' is probed already"),
        ("glm53-flash-nvfp4-lab", "accept_length = [2.9, 3.5]", "accept_length = [3.5, 2.9]",
         r"\[expect\], key 'accept_length': must be \[low, high\] with low <= high"),
        ("glm53-flash-nvfp4-lab", 'status = "qualified"', 'status = "great"',
         r"key 'status': invalid enum value 'great'; expected one of 'fallback', 'qualified', 'research'"),
        ("glm53-flash-nvfp4-lab", "boot_timeout_s = 1800", "boot_timeout_s = true",
         r"\[expect\], key 'boot_timeout_s': expected `int`, got `bool`"),
        ("glm53-flash-nvfp4-lab", "port = 30000", "port = 0", r"\[serve\], key 'port': expected `int` >= 1"),
        ("glm53-flash-nvfp4-lab", 'image = "glm53-flash-nvfp4-lab"', 'image = "other"',
         r"key 'image': 'other' must equal the directory holding the file"),
        ("glm53-flash-nvfp4-lab", "pin_source =", "surprise = 1\npin_source =", r"\[checkpoint\]: unknown key `surprise`"),
        ("glm53-flash-nvidia-nvfp4", 'config_sha256 = "e23c', 'config_sha256 = "E23c',
         r"\[checkpoint\], key 'config_sha256': expected `str` matching regex"),
    ],
)
def test_invalid_definitions_are_refused(tmp_path, image, old, new, message):
    path = _copy(tmp_path, image, lambda t: t.replace(old, new, 1))
    with pytest.raises(PatchkitError, match=message) as refused:
        load_variant(path)
    assert str(refused.value).startswith(f"{path}: ")


def test_unknown_key_and_wrong_type_name_file_table_and_key(tmp_path):
    """The schema refuses both while decoding, in the one style every patchkit TOML file has."""
    path = _copy(tmp_path, "glm53-flash-nvfp4-lab", lambda t: t.replace("[serve.env]", "colour = \"red\"\n\n[serve.env]"))
    with pytest.raises(PatchkitError) as refused:
        load_variant(path)
    assert str(refused.value) == f"{path}: [serve]: unknown key `colour`"
    path.write_text(path.read_text().replace('colour = "red"\n', "").replace("tensor_parallel_size = 2", 'tensor_parallel_size = "2"'))
    with pytest.raises(PatchkitError) as refused:
        load_variant(path)
    assert str(refused.value) == f"{path}: [serve], key 'tensor_parallel_size': expected `int`, got `str`"


def test_duplicate_alias_across_variants_is_refused(tmp_path):
    for image in ("glm53-flash-nvfp4-lab", "glm53-flash-nvfp4-4p67"):
        shutil.copytree(IMAGES / image, tmp_path / image, ignore=shutil.ignore_patterns("image.toml"))
    text = (tmp_path / "glm53-flash-nvfp4-4p67" / "variant.toml").read_text()
    (tmp_path / "glm53-flash-nvfp4-4p67" / "variant.toml").write_text(
        text.replace("aliases = []", 'aliases = ["nvfp4-spark"]')
    )
    with pytest.raises(PatchkitError, match="'nvfp4-spark' already used by variant 4p67"):
        load_variants(tmp_path)


# ------------------------------------------------------------ pins


def test_unpinned_variant_refuses_identity_without_user_pins(variants):
    lab = variants["4p67"]
    with pytest.raises(Unpinned, match=r"no known SHA-256 pin for config\.json.*--pin-config") as config:
        resolve_pins(lab)
    assert (config.value.variant, config.value.label) == ("4p67", "config.json")
    with pytest.raises(Unpinned) as index:
        resolve_pins(lab, config_sha256=SHA_A)
    assert index.value.label == "model.safetensors.index.json"
    pins = resolve_pins(lab, config_sha256=SHA_A, index_sha256=SHA_B.upper())
    assert (pins.config_sha256, pins.index_sha256) == (SHA_A, SHA_B)


def test_user_pin_cannot_override_a_known_pin(variants):
    nvidia = variants["nvidia-nvfp4"]
    own = nvidia.checkpoint.pins
    assert resolve_pins(nvidia) == own
    assert resolve_pins(nvidia, config_sha256=own.config_sha256) == own
    with pytest.raises(PinContradicted, match=r"; the pin given .* contradicts it") as info:
        resolve_pins(nvidia, config_sha256=SHA_A)
    assert (info.value.variant, info.value.own, info.value.given) == ("nvidia-nvfp4", own.config_sha256, SHA_A)


def test_malformed_user_pin_is_refused(variants):
    with pytest.raises(InvalidPin) as info:
        resolve_pins(variants["4p67"], config_sha256="abc", index_sha256=SHA_B)
    assert (info.value.label, info.value.given) == ("config.json", "abc")


def test_variant_files_say_where_pins_stand(variants):
    for v in variants.values():
        if not v.pinned:
            assert re.search(r"unknown|--pin-config", v.checkpoint.pin_source)
        else:
            assert "not recomputed here" in v.checkpoint.pin_source
