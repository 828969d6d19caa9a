"""naming-shim: the nested checkpoint spelling loads into the flat parameters through the real loader.

One probe per tree builds a real KDA decoder layer with hyper-connections (mhc) and feeds vLLM's own
`Glm5NextModel.load_weights` the same tensors under the two spellings GLM-5.3-Flash exports use: flat
(`hc_attn_fn`, `self_attn.q_conv1d.weight`, `self_attn.f_a_proj.weight`, `self_attn.dt_bias`, ...) and
nested (transformers' module tree: `attn_hc.fn`, `self_attn.forget_gate.*`, one fused
`self_attn.conv1d.weight` [3C, 1, 4]). Each spelling loads into a freshly zeroed copy of the layer's
parameters, so "bit-exact" means every parameter holds the same bytes after either load.

Stock vLLM: flat names load, every nested name fails (the lab checkpoint stops at its first tensor): a
KeyError in params_dict, or on 0.34 for the fused conv a TypeError (0.34's own fused `conv1d` parameter
exists, but its loader needs the shard id the plain path does not pass). Patched: both spellings give
identical parameters, the fused conv lands in the taps bit for bit (fp32 exactly, the lab's bf16
widened exactly), a pipeline stage's missing layer is skipped under either spelling, and a fused conv
that cannot split in three is a ValueError naming the tensor.

Release-agnostic: the loader lives in models/glm5next/nvidia/model.py on 0.30.0 and in
models/glm5next/common/model.py from 0.31.0; the probe imports it from whichever the installed vLLM has.
The taps are three parameters (q/k/v_conv1d) on 0.30-0.33 and one fused fp32 `conv1d` [3C, 1, K] from
0.34 (`_fused_qkv_conv1d`); the probe reads which one the tree builds and the tests hold it to the release.
"""

from __future__ import annotations

import pytest
from packaging.version import Version
from quant_configs import probe_prelude

from probes import plan_on_drifted_upstream, probe_fixtures

ENV = {"HF_HUB_OFFLINE": "1"}

PROBE = probe_prelude() + r'''
import importlib, importlib.util, json, tempfile
import torch
from quant_configs import *

# 0.30.0 keeps the GLM-5.3 model under glm5next/nvidia/, 0.31+ under glm5next/common/
layout = "common" if importlib.util.find_spec("vllm.models.glm5next.common") else "nvidia"
Glm5NextModel = importlib.import_module(f"vllm.models.glm5next.{layout}.model").Glm5NextModel
from vllm.model_executor.models.utils import PPMissingLayer

env = Glm5NextOnCpu(tempfile.mkdtemp())
env.checkpoint(None, text_config={"mhc": True})  # BF16 checkpoint with hyper-connections

model = env.text_model({0: env.target_layer(0), 1: PPMissingLayer()})  # layer 1 on another pipeline stage
params = dict(model.named_parameters())
g = torch.Generator().manual_seed(0)

def tensor(shape, dtype):
    return torch.randn(*shape, generator=g).to(dtype)

def load(pairs):
    """Zero every parameter, load `pairs` through the real loader: (status, loaded names, state)."""
    with torch.no_grad():
        for p in params.values():
            p.zero_()
    try:
        loaded = sorted(Glm5NextModel.load_weights(model, iter(pairs)))
    except (KeyError, ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}", [], None
    return "ok", loaded, {n: p.detach().clone() for n, p in params.items()}

proj, head_dim, heads = 256, 128, 2
CONV = "layers.0.self_attn.conv1d.weight"
taps_layout = "fused" if CONV in params else "three"  # 0.34: one conv1d; 0.30-0.33: q/k/v_conv1d

def held_taps(state):
    """The q|k|v taps a loaded state holds, [3C, 1, K], whichever parameters keep them."""
    if taps_layout == "fused":
        return state[CONV]
    return torch.cat([state[f"layers.0.self_attn.{c}_conv1d.weight"] for c in "qkv"], dim=0)
hc = params["layers.0.hc_attn_fn"].shape
# flat name -> (nested name, stored shape, stored dtype)
PAIRS = {
    "layers.0.hc_attn_fn": ("layers.0.attn_hc.fn", hc, torch.float32),
    "layers.0.hc_attn_base": ("layers.0.attn_hc.base", (24,), torch.float32),
    "layers.0.hc_attn_scale": ("layers.0.attn_hc.scale", (3,), torch.float32),
    "layers.0.hc_ffn_fn": ("layers.0.ffn_hc.fn", params["layers.0.hc_ffn_fn"].shape, torch.float32),
    "layers.0.hc_ffn_base": ("layers.0.ffn_hc.base", (24,), torch.float32),
    "layers.0.hc_ffn_scale": ("layers.0.ffn_hc.scale", (3,), torch.float32),
    "layers.0.self_attn.f_a_proj.weight": ("layers.0.self_attn.forget_gate.f_a_proj.weight", (head_dim, 256), torch.bfloat16),
    "layers.0.self_attn.f_b_proj.weight": ("layers.0.self_attn.forget_gate.f_b_proj.weight", (proj, head_dim), torch.bfloat16),
    "layers.0.self_attn.dt_bias": ("layers.0.self_attn.forget_gate.dt_bias", (proj,), torch.float32),
    "layers.0.self_attn.A_log": ("layers.0.self_attn.forget_gate.A_log", (heads,), torch.float32),
}
values = {flat: tensor(shape, dtype) for flat, (_, shape, dtype) in PAIRS.items()}
taps = {c: tensor((proj, 1, 4), torch.float32) for c in "qkv"}
fused = torch.cat([taps["q"], taps["k"], taps["v"]], dim=0)  # [3C, 1, 4], q|k|v as the export stores it

flat_pairs = list(values.items()) + [(f"layers.0.self_attn.{c}_conv1d.weight", t) for c, t in taps.items()]
nested_pairs = [(PAIRS[f][0], v) for f, v in values.items()] + [("layers.0.self_attn.conv1d.weight", fused)]

flat_status, flat_loaded, flat_state = load(flat_pairs)
nested_status, nested_loaded, nested_state = load(nested_pairs)
same = None
if flat_state is not None and nested_state is not None:
    same = {n: torch.equal(flat_state[n], nested_state[n]) for n in flat_state}
# the flat load itself is exact: each stored value sits in its parameter (f_a_proj as shard 4 rows)
exact = {}
if flat_state is not None:
    for flat, v in values.items():
        if flat.endswith("f_a_proj.weight"):
            held = flat_state["layers.0.self_attn.in_proj_qkvbfg_a.weight"][3 * proj + heads : 3 * proj + heads + head_dim]
        else:
            held = flat_state[flat]
        exact[flat] = torch.equal(held.reshape(-1), v.to(held.dtype).reshape(-1))
    for i, (c, t) in enumerate(taps.items()):
        exact[f"{c}_conv1d"] = torch.equal(held_taps(flat_state)[i * proj : (i + 1) * proj], t)
# the nested spelling's fused conv, as it sits in the taps after a load: fp32 bit for bit, and the lab
# export's bf16 conv widened exactly (every bf16 is an fp32)
fused_exact = None if nested_state is None else torch.equal(held_taps(nested_state), fused)
fused_bf16 = fused.to(torch.bfloat16)
bf16_status, bf16_loaded, bf16_state = load([(CONV, fused_bf16)])
lab_bf16 = {"status": bf16_status, "loaded": bf16_loaded,
            "dtype": None if bf16_state is None else str(held_taps(bf16_state).dtype),
            "exact": None if bf16_state is None else torch.equal(held_taps(bf16_state), fused_bf16.float())}

one_by_one = {name: load([(name, v)])[0] for name, v in nested_pairs}

# Layer 1 lives on another pipeline stage (PPMissingLayer): its tensors are skipped, under either spelling.
on_missing_stage = {
    spelling: load([(n.replace("layers.0.", "layers.1.", 1), v) for n, v in pairs])[:2]
    for spelling, pairs in (("flat", flat_pairs), ("nested", nested_pairs))
}

# A quantized forget gate (4p67's MXFP8 f_b_proj: weight and scale) under either spelling: on a tree
# that builds the KDA projections quantized (packed-modules-4p67), both land in the same parameters.
env.checkpoint(p4p67_quantization_config())
env.target()
model = env.text_model({0: env.target_layer(0), 1: PPMissingLayer()})  # layer 1 on another pipeline stage
params = dict(model.named_parameters())
gate = "layers.0.self_attn.f_b_proj."
stored = {}
for pname, p in params.items():
    if pname.startswith(gate):
        stored[pname] = (tensor(p.shape, torch.float32).to(p.dtype) if p.dtype.is_floating_point
                         else torch.randint(0, 255, p.shape, generator=g).to(p.dtype))
nested_gate = {n.replace(".self_attn.f_b_proj.", ".self_attn.forget_gate.f_b_proj."): v for n, v in stored.items()}
q_flat, q_nested = load(list(stored.items())), load(list(nested_gate.items()))
quantized = {
    "params": {n: str(v.dtype).removeprefix("torch.") for n, v in stored.items()},
    "flat": q_flat[:2], "nested": q_nested[:2],
    "same": None if q_flat[2] is None or q_nested[2] is None else all(
        torch.equal(q_flat[2][n].view(torch.uint8) if q_flat[2][n].element_size() == 1 else q_flat[2][n],
                    q_nested[2][n].view(torch.uint8) if q_nested[2][n].element_size() == 1 else q_nested[2][n])
        for n in q_flat[2]),
}
bad_fused = load([("layers.0.self_attn.conv1d.weight", tensor((3 * proj + 1, 1, 4), torch.float32))])[0]
print(json.dumps({
    "layout": layout, "taps_layout": taps_layout, "fused_exact": fused_exact, "lab_bf16": lab_bf16,
    "on_missing_stage": on_missing_stage,
    "flat": [flat_status, flat_loaded], "nested": [nested_status, nested_loaded],
    "same": same, "exact": exact, "one_by_one": one_by_one, "bad_fused": bad_fused, "quantized": quantized,
}))
'''


stock, patched = probe_fixtures(PROBE, ENV)
NESTED = ["layers.0.attn_hc.fn", "layers.0.attn_hc.base", "layers.0.attn_hc.scale", "layers.0.ffn_hc.fn",
          "layers.0.ffn_hc.base", "layers.0.ffn_hc.scale", "layers.0.self_attn.forget_gate.f_a_proj.weight",
          "layers.0.self_attn.forget_gate.f_b_proj.weight", "layers.0.self_attn.forget_gate.dt_bias",
          "layers.0.self_attn.forget_gate.A_log", "layers.0.self_attn.conv1d.weight"]
CONV = "layers.0.self_attn.conv1d.weight"
THREE_TAPS = {"layers.0.self_attn.q_conv1d.weight", "layers.0.self_attn.k_conv1d.weight",
              "layers.0.self_attn.v_conv1d.weight"}
# 0.34's fused conv1d loader (kimi_gdn_linear_attn.py) called without a shard id by the plain load path
NO_SHARD_ID = "missing 1 required positional argument: 'loaded_shard_id'"


def expected_taps_layout(release: Version) -> str:
    """0.34.0 fused the q|k|v taps into one fp32 conv1d parameter (kda.py `_fused_qkv_conv1d`)."""
    return "fused" if release >= Version("0.34") else "three"


@pytest.mark.vllm
def test_the_taps_are_the_parameters_this_release_builds(stock, patched, vllm_release):
    """The probe reads the tap layout off the tree; hold it to the release so no branch passes by accident."""
    assert stock["taps_layout"] == patched["taps_layout"] == expected_taps_layout(vllm_release)


@pytest.mark.vllm
def test_flat_names_load_exactly_on_stock_and_patched(stock, patched):
    for tree in (stock, patched):
        assert tree["flat"][0] == "ok"
        assert tree["exact"] and all(tree["exact"].values()), tree["exact"]
    # f_a_proj is a shard of the fused KDA projection, not a parameter of its own
    assert "layers.0.self_attn.in_proj_qkvbfg_a.weight" in stock["flat"][1]
    # the flat q/k/v_conv1d land in three parameters (0.30-0.33) or as shards 0/1/2 of conv1d (0.34)
    taps = {CONV} if stock["taps_layout"] == "fused" else THREE_TAPS
    assert taps <= set(stock["flat"][1])
    assert stock["flat"] == patched["flat"]


@pytest.mark.vllm
def test_stock_loader_refuses_every_nested_name(stock):
    assert sorted(stock["one_by_one"]) == sorted(NESTED)
    for name, status in stock["one_by_one"].items():
        if name == CONV and stock["taps_layout"] == "fused":
            # 0.34 has a parameter of that name, but its loader needs a shard id: the load stops here
            assert status.startswith("TypeError: ") and NO_SHARD_ID in status, status
            continue
        # the missing key is the nested name itself, or (forget_gate.f_a_proj, which the stacked mapping
        # rewrites first) its fused-shard rewrite under the nested module path: no parameter either way
        assert status in (f"KeyError: '{name}'",
                          f"KeyError: '{name.replace('.f_a_proj.', '.in_proj_qkvbfg_a.')}'"), status
    assert stock["nested"][0].startswith(("KeyError", "TypeError"))
    assert stock["lab_bf16"]["status"] != "ok"


@pytest.mark.vllm
def test_patched_loader_loads_the_nested_spelling_bit_exact(patched):
    assert patched["nested"][0] == "ok", patched["nested"][0]
    # the same parameters are reported loaded as for the flat spelling: the fused conv as the taps
    assert patched["nested"][1] == patched["flat"][1]
    taps = {CONV} if patched["taps_layout"] == "fused" else THREE_TAPS
    assert taps <= set(patched["nested"][1])
    # every parameter holds the same bytes after either load (the fused conv's q/k/v thirds included)
    assert patched["same"] and all(patched["same"].values()), [n for n, ok in patched["same"].items() if not ok]
    assert patched["fused_exact"] is True
    assert all(status == "ok" for status in patched["one_by_one"].values()), patched["one_by_one"]


@pytest.mark.vllm
def test_the_lab_bf16_fused_conv_widens_exactly_into_fp32_taps(patched):
    """The lab export stores the fused conv bf16; the taps are fp32 and hold its exact widening."""
    lab = patched["lab_bf16"]
    taps = [CONV] if patched["taps_layout"] == "fused" else sorted(THREE_TAPS)
    assert lab == {"status": "ok", "loaded": taps, "dtype": "torch.float32", "exact": True}, lab


@pytest.mark.vllm
def test_a_missing_pipeline_stage_skips_either_spelling(stock, patched):
    """A layer on another pipeline stage (PPMissingLayer) is skipped, as the flat spelling is by stock vLLM."""
    assert stock["on_missing_stage"]["flat"] == ["ok", []]
    assert patched["on_missing_stage"] == {"flat": ["ok", []], "nested": ["ok", []]}, patched["on_missing_stage"]


@pytest.mark.vllm
def test_a_fused_conv_that_cannot_split_in_three_is_named(stock, patched):
    if stock["taps_layout"] == "fused":
        assert stock["bad_fused"].startswith("TypeError: ") and NO_SHARD_ID in stock["bad_fused"]
    else:
        assert stock["bad_fused"] == "KeyError: 'layers.0.self_attn.conv1d.weight'"
    assert patched["bad_fused"].startswith("ValueError: naming-shim: layers.0.self_attn.conv1d.weight has shape (769, 1, 4)")


@pytest.mark.vllm
def test_a_quantized_nested_forget_gate_loads_like_the_flat_one(stock, patched):
    """4p67 quantizes f_b_proj (MXFP8 weight + scale); an export naming it under forget_gate loads the same
    bytes into the same parameters. Stock builds the KDA projections unquantized: no scale to load."""
    q = patched["quantized"]
    assert "layers.0.self_attn.f_b_proj.weight_scale" in q["params"], q["params"]
    assert q["flat"][0] == q["nested"][0] == "ok" and q["flat"][1] == q["nested"][1]
    assert q["same"] is True
    assert "layers.0.self_attn.f_b_proj.weight_scale" not in stock["quantized"]["params"]


@pytest.mark.vllm
def test_an_upstream_rename_of_a_flat_parameter_fails_loudly(tmp_path):
    """The renames land in the flat parameters; the patch asserts they still exist."""
    result = plan_on_drifted_upstream("naming-shim", "self.hc_attn_fn = nn.Parameter(",
                                      "self.attn_hc_fn = nn.Parameter(", tmp_path)
    assert result.state == "broken"
    (broken,) = [e for e in result.edits if e.state == "broken"]
    assert "hc_attn_fn" in broken.edit.anchor and broken.nearest is not None


@pytest.mark.vllm
def test_an_upstream_change_of_the_tap_parameters_fails_loudly(tmp_path, vllm_release):
    """The fused conv's split relies on the taps' parameters: three named q/k/v_conv1d (0.30-0.33), or one
    conv1d in three equal shards (0.34). A rename of them fails the plan instead of a weight load."""
    if expected_taps_layout(vllm_release) == "fused":
        old, new = 'prefix=f"{prefix}.conv1d",', 'prefix=f"{prefix}.qkv_conv1d",'
    else:
        old, new = 'prefix=f"{prefix}.q_conv1d",', 'prefix=f"{prefix}.q_conv",'
    result = plan_on_drifted_upstream("naming-shim", old, new, tmp_path)
    assert result.state == "broken"
    (broken,) = [e for e in result.edits if e.state == "broken"]
    assert old in broken.edit.anchor and broken.nearest is not None
