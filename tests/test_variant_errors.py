"""Each rule between the fields of a variant.toml, on a hostile copy of a real one: the kind, the rule
broken (`problem`), the place (`at`) and the file (`path`) are fields, and the command line says them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit.cli.main import main
from patchkit.tomlschema import NoDefinitionFiles
from patchkit.variants.definitions import InvalidVariantFile, load_variant, load_variants

IMAGES = Path(__file__).resolve().parents[1] / "images"
LAB, P467, REDHAT = "glm53-flash-nvfp4-lab", "glm53-flash-nvfp4-4p67", "glm53-flash-nvfp4-redhat"


def hostile(tmp_path: Path, image: str, old: str, new: str, beside: tuple[str, ...] = ()) -> Path:
    """The real variant.toml of `image` copied under tmp_path with its first `old` made `new` (and the
    images `beside` copied whole); the broken file's path."""
    for name in (image, *beside):
        (tmp_path / name).mkdir()
        (tmp_path / name / "variant.toml").write_bytes((IMAGES / name / "variant.toml").read_bytes())
    text = (IMAGES / image / "variant.toml").read_text()
    assert old in text, old
    (tmp_path / image / "variant.toml").write_text(text.replace(old, new, 1))
    return tmp_path / image / "variant.toml"


@pytest.mark.parametrize("image, old, new, at, problem", [
    (LAB, f'image = "{LAB}"', 'image = "other"', "key 'image'", "image-folder"),
    (LAB, 'quant_algo = "MIXED_PRECISION"', 'quant_algo = "INT4_AWQ"', "[checkpoint], key 'quant_algo'", "quant-algo"),
    (LAB, "exclude_mtp_from_quant = false", "exclude_mtp_from_quant = true",
     "[checkpoint], key 'exclude_mtp_from_quant'", "mtp-exclusion"),
    (LAB, 'mtp = "quantized"', 'mtp = "absent"', "[serve], key 'speculative'", "speculative"),
    (REDHAT, 'mtp = "absent"', 'mtp = "bf16"', "[serve]", "speculative"),
    (REDHAT, "mtp_speculator = false", "mtp_speculator = true", "[expect], key 'mtp_speculator'", "mtp-speculator"),
    (LAB, '"--enforce-eager",', '"--enforce-eager", "--quantization", "fp8",', "[serve], key 'args'",
     "args-structured"),
    (LAB, '"enable_flashinfer_autotune":false}', '"enable_flashinfer_autotune":false', "[serve], key 'args'",
     "args-json"),
    (LAB, "kv_cache_memory_bytes = 10737418240", "kv_cache_memory_bytes = 1", "[serve], key 'kv_cache_memory_bytes'",
     "recipe-pin"),
    (LAB, 'prefix = "model.layers.45.mlp.experts"', 'prefix = "language_model.model.layers.3.mlp.experts"',
     "[[expect.quantprobe]] #2, key 'prefix'", "duplicate-probe"),
    (LAB, "accept_length = [2.9, 3.5]", "accept_length = [3.5, 2.9]", "[expect], key 'accept_length'",
     "accept-length"),
])
def test_each_rule_refuses_a_hostile_copy_of_a_real_variant(tmp_path, image, old, new, at, problem):
    broken = hostile(tmp_path, image, old, new)
    with pytest.raises(InvalidVariantFile) as info:
        load_variant(broken)
    assert (info.value.path, info.value.at, info.value.problem) == (str(broken), at, problem)
    assert str(info.value) == f"{broken}: {at}: {info.value.detail}"


@pytest.mark.parametrize("old, new, at, detail", [
    ("aliases = []", 'aliases = ["nvfp4-spark"]', "key 'aliases'", "name 'nvfp4-spark' already used by variant 4p67"),
    ('name = "4p67"', 'name = "lab"', "key 'name'", "name 'lab' already used by variant lab"),
])
def test_a_name_two_variants_claim_is_refused_in_the_second_file(tmp_path, old, new, at, detail):
    """4p67's folder sorts first, so the lab's file is the one that claims a name again."""
    hostile(tmp_path, P467, old, new, beside=(LAB,))
    with pytest.raises(InvalidVariantFile) as info:
        load_variants(tmp_path)
    assert (info.value.path, info.value.at, info.value.problem) == (
        str(tmp_path / LAB / "variant.toml"), at, "duplicate-name")
    assert info.value.detail == detail


def test_a_folder_without_variants_is_typed(tmp_path):
    with pytest.raises(NoDefinitionFiles) as info:
        load_variants(tmp_path)
    assert (info.value.folder, info.value.file) == (str(tmp_path), "variant.toml")


def test_the_cli_refuses_a_hostile_variant_with_exit_2_and_the_place(tmp_path):
    broken = hostile(tmp_path, LAB, "kv_cache_memory_bytes = 10737418240", "kv_cache_memory_bytes = 1")
    r = CliRunner().invoke(main, ["serve-args", "lab", "--images", str(tmp_path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert (f"{broken}: [serve], key 'kv_cache_memory_bytes': the GLM-5.3 recipes pin "
            "kv_cache_memory_bytes=10737418240, got 1") in r.stderr
