"""naming-shim: GLM-5.3 checkpoints' flat tensor names load into vLLM 0.30+ as they are.

The patch is assert-only (its `why` has the finding). This test holds the finding to the real loader:
one probe per tree builds a real KDA decoder layer with hyper-connections (mhc) and feeds
`Glm5NextModel.load_weights` the tensors under the names the checkpoints store (flat: `hc_attn_fn`,
`self_attn.q_conv1d.weight`, `self_attn.f_a_proj.weight`, `self_attn.dt_bias`, ...) and, separately,
under the nested names of transformers' module tree (`attn_hc.fn`, `self_attn.forget_gate.*`, a
fused `self_attn.conv1d`). Flat names land bit-exact; each nested name is a KeyError, i.e. only a
checkpoint written with nested names would need a shim. Stock and patched must agree (the patch
changes nothing), and the patch must stay in the default series, where it guards these names.
"""

from __future__ import annotations

import pytest
from probes import guard_in_series, plan_on_drifted_upstream, probe_fixtures
from quant_configs import probe_prelude

ENV = {"HF_HUB_OFFLINE": "1"}

PROBE = probe_prelude() + r'''
import json, tempfile
import torch
from quant_configs import *
from vllm.models.glm5next.common.model import Glm5NextModel

env = Glm5NextOnCpu(tempfile.mkdtemp())
env.checkpoint(None, text_config={"mhc": True})  # BF16 checkpoint with hyper-connections

class TextModel(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.config = env.text_config
        self.is_fused_shared_expert_enabled = False
        self.layers = torch.nn.ModuleDict({"0": layer})

model = TextModel(env.target_layer(0))
params = dict(model.named_parameters())
g = torch.Generator().manual_seed(0)

def tensor(shape, dtype):
    return torch.randn(*shape, generator=g).to(dtype)

def try_load(name, value):
    try:
        loaded = Glm5NextModel.load_weights(model, iter([(name, value)]))
        return "ok", sorted(loaded)
    except KeyError as e:
        return f"KeyError: {e}", []

proj, head_dim, heads = 256, 128, 2
# checkpoint name -> (parameter, stored shape, stored dtype, rows of the parameter it fills)
FLAT = {
    "layers.0.hc_attn_fn": ("layers.0.hc_attn_fn", params["layers.0.hc_attn_fn"].shape, torch.float32, None),
    "layers.0.hc_attn_base": ("layers.0.hc_attn_base", (24,), torch.float32, None),
    "layers.0.hc_attn_scale": ("layers.0.hc_attn_scale", (3,), torch.float32, None),
    "layers.0.hc_ffn_fn": ("layers.0.hc_ffn_fn", params["layers.0.hc_ffn_fn"].shape, torch.float32, None),
    "layers.0.hc_ffn_base": ("layers.0.hc_ffn_base", (24,), torch.float32, None),
    "layers.0.hc_ffn_scale": ("layers.0.hc_ffn_scale", (3,), torch.float32, None),
    "layers.0.self_attn.q_conv1d.weight": ("layers.0.self_attn.q_conv1d.weight", (proj, 1, 4), torch.float32, None),
    "layers.0.self_attn.k_conv1d.weight": ("layers.0.self_attn.k_conv1d.weight", (proj, 1, 4), torch.float32, None),
    "layers.0.self_attn.v_conv1d.weight": ("layers.0.self_attn.v_conv1d.weight", (proj, 1, 4), torch.float32, None),
    "layers.0.self_attn.f_a_proj.weight": ("layers.0.self_attn.in_proj_qkvbfg_a.weight", (head_dim, 256), torch.bfloat16,
                                           (3 * proj + heads, 3 * proj + heads + head_dim)),
    "layers.0.self_attn.f_b_proj.weight": ("layers.0.self_attn.f_b_proj.weight", (proj, head_dim), torch.bfloat16, None),
    "layers.0.self_attn.dt_bias": ("layers.0.self_attn.dt_bias", (proj,), torch.float32, None),
    "layers.0.self_attn.A_log": ("layers.0.self_attn.A_log", (heads,), torch.float32, None),
}
flat = {}
for name, (param, shape, dtype, rows) in FLAT.items():
    value = tensor(shape, dtype)
    status, loaded = try_load(name, value)
    held = params[param].data if rows is None else params[param].data[rows[0]:rows[1]]
    flat[name] = [status, loaded, status == "ok" and torch.equal(held.reshape(-1), value.to(held.dtype).reshape(-1))]

NESTED = {
    "layers.0.attn_hc.fn": params["layers.0.hc_attn_fn"].shape,
    "layers.0.ffn_hc.scale": (3,),
    "layers.0.self_attn.forget_gate.f_b_proj.weight": (proj, head_dim),
    "layers.0.self_attn.forget_gate.A_log": (heads,),
    "layers.0.self_attn.conv1d.weight": (3 * proj, 1, 4),
}
nested = {name: try_load(name, tensor(shape, torch.float32))[0] for name, shape in NESTED.items()}
print(json.dumps({"flat": flat, "nested": nested}))
'''


stock, patched = probe_fixtures(PROBE, ENV)


@pytest.mark.vllm
def test_flat_checkpoint_names_load_into_their_parameters(stock):
    for name, (status, loaded, exact) in stock["flat"].items():
        assert status == "ok", name
        assert exact, f"{name}: stored values did not land bit-exact"
    # f_a_proj is a shard of the fused KDA projection, not a parameter of its own
    assert stock["flat"]["layers.0.self_attn.f_a_proj.weight"][1] == ["layers.0.self_attn.in_proj_qkvbfg_a.weight"]


@pytest.mark.vllm
def test_nested_module_tree_names_have_no_parameter(stock):
    assert stock["nested"] == {name: f"KeyError: '{name}'" for name in stock["nested"]}


@pytest.mark.vllm
def test_the_assert_only_patch_changes_nothing(stock, patched):
    assert stock == patched


def test_naming_shim_guards_the_default_series(patched_vllm):
    guard_in_series("naming-shim", patched_vllm.root)


@pytest.mark.vllm
def test_an_upstream_rename_of_a_checkpoint_name_fails_loudly(tmp_path):
    result = plan_on_drifted_upstream("naming-shim", "self.hc_attn_fn = nn.Parameter(",
                                      "self.attn_hc_fn = nn.Parameter(", tmp_path)
    assert result.state == "broken"
    (broken,) = [e for e in result.edits if e.state == "broken"]
    assert "hc_attn_fn" in broken.edit.anchor and broken.nearest is not None
