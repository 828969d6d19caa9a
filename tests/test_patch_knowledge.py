"""Everything about a patch is in its patch.toml: the environment an image carrying it sets (`[image]`),
when a checkpoint needs it (`[needed_when]`) and what a smoke switches on for it (`[smoke]`). Each test
edits a copy of the real patch set and shows the behaviour follows the file, with no Python table to
update."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest

from patchkit.bootlog.markers import MARKER
from patchkit.checkpoint.identity import sha256_bytes
from patchkit.checkpoint.inventory import KINDS
from patchkit.checkpoint.preflight import preflight
from patchkit.images.definitions import PatchEnvMismatch, load_images, series_named
from patchkit.patching.patchset import InvalidPatchFile, load_patchset
from patchkit.smoke.hardware import Switches, switches_of
from patchkit.smoke.synthetic_config import write_header_set
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS
from patchkit.variants.definitions import Pins, Serve, find_variant

REPO = Path(__file__).resolve().parents[1]
IMAGES, PATCHES = REPO / "images", REPO / "patches"
LAB = "glm53-flash-nvfp4-lab"


def patches_copy(tmp_path: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of the real patch set with one exact text replacement in each named patch.toml."""
    folder = tmp_path / "patches"
    shutil.copytree(PATCHES, folder)
    for patch, (old, new) in edits.items():
        path = folder / patch / "patch.toml"
        text = path.read_text()
        assert text.count(old) == 1, (patch, old)
        path.write_text(text.replace(old, new))
    return folder


def lab_checkpoint(tmp_path: Path):
    root = tmp_path / "lab"
    write_header_set(root, LAYOUTS["lab"], TINY_DIMS, shards=2)
    variant = find_variant("lab", IMAGES)
    pins = {"pin_config": sha256_bytes((root / "config.json").read_bytes()),
            "pin_index": sha256_bytes((root / "model.safetensors.index.json").read_bytes())}
    return root, replace(variant, checkpoint=replace(variant.checkpoint, pins=Pins(None, None))), pins


def test_the_rules_name_what_exists():
    """Each rule's keys are what the code that judges them knows: [serve] fields, module kinds, markers."""
    patchset = load_patchset(PATCHES)
    serve = {f.name for f in fields(Serve)}
    rules = [p.needed_when for p in patchset.series() if p.needed_when]
    assert len(rules) == 6
    for rule in rules:
        assert set(rule.serve) <= serve and (rule.quantized is None or set(rule.quantized.kinds) <= set(KINDS))
    assert {p.id: p.smoke_markers for p in patchset.series() if p.smoke_markers} == {"quantprobe": ("quantprobe",)}
    assert all(m in MARKER for p in patchset.series() for m in p.smoke_markers)
    assert {p.id: p.image_env for p in patchset.series() if p.image_env} == {"nope-mla-pad": {"VLLM_MLA_NOPE_PAD_ROPE": "1"}}


def test_an_images_environment_follows_its_patches_image_table(tmp_path):
    """A switch in a patch's [image] env must be set by every image carrying the patch: added to
    quantprobe's (in every image), the real images are refused naming it. An image without nope-mla-pad's
    switch is refused while the patch's [image] table claims it, and loads once the table is gone."""
    added = patches_copy(tmp_path / "a", {"quantprobe": ("[smoke]\n", '[image]\nenv = { PATCHKIT_PROBE_DEFAULT = "1" }\n\n[smoke]\n')})
    with pytest.raises(PatchEnvMismatch, match="the series has quantprobe, whose code reads PATCHKIT_PROBE") as info:
        load_images(IMAGES, load_patchset(added))
    assert (info.value.patch, info.value.key, info.value.wanted) == ("quantprobe", "PATCHKIT_PROBE_DEFAULT", "1")
    images = tmp_path / "images"
    shutil.copytree(IMAGES, images)
    definition = images / "glm53-flash-nvfp4" / "image.toml"
    definition.write_text(definition.read_text().replace(', VLLM_MLA_NOPE_PAD_ROPE = "1" }', " }"))
    with pytest.raises(PatchEnvMismatch) as unset:
        load_images(images, load_patchset(PATCHES))
    assert (unset.value.patch, unset.value.key, unset.value.wanted) == ("nope-mla-pad", "VLLM_MLA_NOPE_PAD_ROPE", "1")
    removed = patches_copy(tmp_path / "b", {"nope-mla-pad": ('[image]\nenv = { VLLM_MLA_NOPE_PAD_ROPE = "1" }', "")})
    assert "VLLM_MLA_NOPE_PAD_ROPE" not in load_images(images, load_patchset(removed))[LAB].env


def test_when_a_checkpoint_needs_a_patch_is_the_patchs_rule(tmp_path):
    """The lab image without pool-topk-init is refused for a sparse-indexer checkpoint because the patch's
    [needed_when] says so: with that table gone from the patch set, the same image passes."""
    root, variant, pins = lab_checkpoint(tmp_path)
    series = [p.id for p in series_named(LAB, IMAGES, load_patchset(PATCHES)) if p.id != "pool-topk-init"]
    refused = preflight(root, variant, series=series, patchset=load_patchset(PATCHES), **pins)
    assert [m["patch"] for m in refused.patches["missing"]] == ["pool-topk-init"]
    rule = load_patchset(PATCHES).patch("pool-topk-init").needed_when
    without = patches_copy(tmp_path, {"pool-topk-init": ("[needed_when]\nwhy = " + json.dumps(rule.why) + '\nconfig_set = ["index_topk"]\n', "")})
    passed = preflight(root, variant, series=series, patchset=load_patchset(without), **pins)
    assert passed.ok and passed.patches["missing"] == [], passed.problems


def refusal(call) -> InvalidPatchFile:
    with pytest.raises(InvalidPatchFile) as info:
        call()
    return info.value


def test_a_rule_is_checked_against_the_fields_it_names(tmp_path):
    """A rule naming what does not exist is the patch file's error, never a condition quietly unmet."""
    root, variant, pins = lab_checkpoint(tmp_path)
    typo = patches_copy(tmp_path / "a", {"nope-mla-pad": ('serve = { kv_cache_dtype = "fp8_ds_mla" }', 'serve = { kv_dtype = "fp8_ds_mla" }')})
    err = refusal(lambda: preflight(root, variant, series=[], patchset=load_patchset(typo), **pins))
    assert (Path(err.path).parent.name, err.at, err.problem) == ("nope-mla-pad", "[needed_when], key 'serve'", "unknown-field")
    assert "'kv_dtype'" in err.detail
    kind = patches_copy(tmp_path / "b", {"packed-modules-4p67": ('kinds = ["attention", "indexer"]', 'kinds = ["attn"]')})
    err = refusal(lambda: preflight(root, variant, series=[], patchset=load_patchset(kind), **pins))
    assert (Path(err.path).parent.name, err.problem) == ("packed-modules-4p67", "unknown-kind") and "'attn'" in err.detail
    empty = patches_copy(tmp_path / "c", {"pool-topk-init": ('config_set = ["index_topk"]\n', "")})
    err = refusal(lambda: load_patchset(empty))
    assert (Path(err.path).parent.name, err.at, err.problem) == ("pool-topk-init", "[needed_when]", "no-condition")


def test_what_a_smoke_switches_on_is_the_patchs(tmp_path):
    lab = series_named(LAB, IMAGES, load_patchset(PATCHES))
    assert switches_of(lab) == Switches({"PATCHKIT_QUANTPROBE": "1"}, frozenset({"quantprobe"}))
    assert switches_of(lab).quantprobe
    table = (PATCHES / "quantprobe" / "patch.toml").read_text().split("[smoke]\n")[1].split("\n\n")[0]
    gone = patches_copy(tmp_path / "a", {"quantprobe": ("[smoke]\n" + table + "\n\n", "")})
    assert switches_of(series_named(LAB, IMAGES, load_patchset(gone))) == Switches({}, frozenset())
    bad = patches_copy(tmp_path / "b", {"quantprobe": ('markers = ["quantprobe"]', 'markers = ["quantprobes"]')})
    err = refusal(lambda: switches_of(series_named(LAB, IMAGES, load_patchset(bad))))
    assert (Path(err.path).parent.name, err.at, err.problem) == ("quantprobe", "[smoke], key 'markers'", "unknown-marker")
