"""patchkit.checkpoint.spelling: which tensor-name spelling a checkpoint's index holds, and which images load it.

The names are hand-written in the two spellings of one KDA decoder layer with hyper-connections and one
MLA layer (model.language_model.layers.N.*, the multimodal spelling the checkpoints use): the flat
ones are vLLM 0.30-0.33's parameter names (models/glm5next/*/model.py, kda.py), the nested ones the
left-hand side of the public lab image's model.patch rename table (amasu/glm53-flash-cluster
lab/build/model.patch, Apache-2.0). No real index of a nested export could be fetched here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patchkit.checkpoint.identity import INDEX, InvalidWeightMap, NotACheckpoint
from patchkit.checkpoint.spelling import nested_loaders, read_spelling, spelling_of
from patchkit.images.definitions import load_images
from patchkit.jsondata import MalformedJson
from patchkit.patching.patchset import load_patchset

ROOT = Path(__file__).resolve().parents[1]
PATCHES = load_patchset(ROOT / "patches")
LOADERS = nested_loaders(PATCHES.series())  # the patches whose [needed_when] names the nested spelling
P = "model.language_model.layers"


def kda_layer(i: int, nested: bool) -> list[str]:
    """The spelling-bearing tensors of one KDA layer with hyper-connections (mhc)."""
    if nested:
        hc = [f"{P}.{i}.{part}_hc.{p}" for part in ("attn", "ffn") for p in ("fn", "base", "scale")]
        gate = [f"{P}.{i}.self_attn.forget_gate.{n}" for n in ("A_log", "dt_bias", "f_a_proj.weight",
                                                                "f_b_proj.weight", "f_b_proj.weight_scale")]
        conv = [f"{P}.{i}.self_attn.conv1d.weight"]
    else:
        hc = [f"{P}.{i}.hc_{part}_{p}" for part in ("attn", "ffn") for p in ("fn", "base", "scale")]
        gate = [f"{P}.{i}.self_attn.{n}" for n in ("A_log", "dt_bias", "f_a_proj.weight", "f_b_proj.weight",
                                                   "f_b_proj.weight_scale")]
        conv = [f"{P}.{i}.self_attn.{c}_conv1d.weight" for c in "qkv"]
    return hc + gate + conv


# tensors both spellings share (MLA layer, experts, embeddings): they decide nothing
COMMON = [f"{P}.3.self_attn.kv_a_proj_with_mqa.weight", f"{P}.3.mlp.experts.0.down_proj.weight",
          f"{P}.0.self_attn.g_b_proj.weight", f"{P}.0.self_attn.q_proj.weight", "model.language_model.embed_tokens.weight",
          "lm_head.weight"]


@pytest.fixture(scope="module")
def series():
    images = load_images(ROOT / "images", PATCHES)
    return {name: image.series for name, image in images.items()}


def test_nested_export():
    s = spelling_of(kda_layer(0, nested=True) + kda_layer(1, nested=True) + COMMON)
    assert s.kind == "nested"
    assert s.nested == {"hyper-connections": 12, "forget gate": 10, "short conv": 2} and s.flat == {}
    assert s.example == f"{P}.0.attn_hc.fn"


def test_flat_export():
    s = spelling_of(kda_layer(0, nested=False) + COMMON)
    assert s.kind == "flat"
    assert s.flat == {"hyper-connections": 6, "forget gate": 5, "short conv": 3} and s.nested == {}


def test_mixed_and_unknown():
    assert spelling_of(kda_layer(0, nested=True) + kda_layer(1, nested=False)).kind == "mixed"
    unknown = spelling_of(COMMON)
    assert unknown.kind == "unknown" and unknown.handled_by(["quantprobe"], LOADERS) is None
    assert "not determined" in unknown.verdict(["quantprobe"], LOADERS)


def test_the_loader_of_the_nested_spelling_is_named_by_its_patch():
    assert LOADERS == ("naming-shim",)
    nested = spelling_of(kda_layer(0, nested=True))
    assert nested.handled_by(["naming-shim"], ()) is False  # a set without a loader loads nothing nested


def test_only_images_with_the_shim_load_the_nested_spelling(series):
    nested = spelling_of(kda_layer(0, nested=True))
    flat = spelling_of(kda_layer(0, nested=False))
    mixed = spelling_of(kda_layer(0, nested=True) + kda_layer(1, nested=False))
    loads_nested = {name for name, s in series.items() if nested.handled_by(s, LOADERS)}
    # the lab image carries the shim; 4p67 inherits it from lab; the other three do not
    assert loads_nested == {"glm53-flash-nvfp4-lab", "glm53-flash-nvfp4-4p67"}
    assert all(mixed.handled_by(s, LOADERS) == nested.handled_by(s, LOADERS) for s in series.values())
    assert all(flat.handled_by(s, LOADERS) for s in series.values())
    refused = nested.verdict(series["glm53-flash-nvidia-nvfp4"], LOADERS, "glm53-flash-nvidia-nvfp4")
    assert "lacks naming-shim" in refused and "KeyError" in refused and f"{P}.0.attn_hc.fn" in refused
    assert "through naming-shim" in nested.verdict(series["glm53-flash-nvfp4-lab"], LOADERS)


def test_every_nested_family_is_one_the_shim_renames():
    """The classifier and the patch agree on what "nested" is: each nested component it detects is the
    left-hand side of a rename in patches/naming-shim (or its fused-conv split)."""
    text = "".join(edit.text or "" for edit in PATCHES.patch(LOADERS[0]).edits)  # the renames and the conv split
    for component in ('".attn_hc.fn"', '".attn_hc.base"', '".attn_hc.scale"', '".ffn_hc.fn"', '".ffn_hc.base"',
                      '".ffn_hc.scale"', '".self_attn.forget_gate.A_log"', '".self_attn.forget_gate.dt_bias"',
                      '".self_attn.forget_gate.f_a_proj."', '".self_attn.forget_gate.f_b_proj."',
                      '".self_attn.conv1d.weight"'):
        assert component in text, component


@given(st.lists(st.tuples(st.integers(0, 44), st.booleans()), max_size=6),
       st.lists(st.sampled_from(COMMON), max_size=4))
def test_kind_follows_the_spellings_present(layers, common):
    names = [n for i, nested in layers for n in kda_layer(i, nested)] + common
    spellings = {nested for _, nested in layers}
    expected = {frozenset(): "unknown", frozenset({True}): "nested", frozenset({False}): "flat",
                frozenset({True, False}): "mixed"}[frozenset(spellings)]
    assert spelling_of(names).kind == expected


def test_read_from_a_checkpoint_index(tmp_path):
    weight_map = {name: "model-00001-of-00002.safetensors" for name in kda_layer(0, nested=True) + COMMON}
    (tmp_path / INDEX).write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    assert read_spelling(tmp_path).kind == "nested"


@pytest.mark.parametrize("content, kind, message", [
    (None, NotACheckpoint, f"checkpoint .* has no {INDEX}"),
    ("{not json", MalformedJson, "not valid JSON"),
    ("[1]", MalformedJson, "not a JSON object"),
    ('{"weight_map": {}}', InvalidWeightMap, "no weight_map"),
    ('{"metadata": {}}', InvalidWeightMap, "no weight_map"),
])
def test_unreadable_indexes_are_clear_errors(tmp_path, content, kind, message):
    if content is not None:
        (tmp_path / INDEX).write_text(content)
    with pytest.raises(kind, match=message):
        read_spelling(tmp_path)
