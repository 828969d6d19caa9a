"""nope-mla-pad: GLM-5.3 NoPE MLA on the 576-wide sparse-MLA layout behind VLLM_MLA_NOPE_PAD_ROPE=1.

One probe per tree builds a tiny real GLM-5.3 checkpoint config (multimodal, like the real one) and,
for each scenario, the real ModelConfig (get_config: the gate), the real MTP SpeculativeConfig (the
draft config), and the real target and MTP models through vLLM's initialize_model, then loads
checkpoint-shaped MLA tensors through their real load_weights. Scenarios: the gate set, the gate
unset, and the naive alternative (a text_config qk_rope_head_dim=64 override, gate unset).

What cannot run on CPU, and what stands in: the SM120 sparse-MLA kernels (FlashInfer, GPU only) never
run. The probe selects the FLASHINFER_MLA_SPARSE_SM120 backend the way platforms/cuda.py does on
compute capability 12.x and reports FlashInfer's sparse decode API as present, so the real SM120 impl
class is constructed with the layer's real head size, rope dim and scale. The attention logits are
computed from the layer's loaded projections (F.linear on its weights, its RMSNorms, kv_b_proj's W_UK)
and its own scale, in the latent (MQA) form the SM120 decode kernel evaluates.
"""

from __future__ import annotations

import ast
import functools
import os
import random
from typing import TYPE_CHECKING

import pytest

from probes import CPU_SILU_AND_MUL, probe_fixtures

if TYPE_CHECKING:
    import torch

pytestmark = pytest.mark.vllm

H, NOPE = 4, 256
# CUDA_VISIBLE_DEVICES empty: vLLM's "driver not up yet" case, which keeps the installed Triton on
# without a GPU driver; from 0.34.0 the x86 CPU platform refuses to build a config without Triton
# (platforms/cpu.py:241-243), and this probe builds one.
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}

PROBE = CPU_SILU_AND_MUL + r'''
import json, os, tempfile
from dataclasses import replace

import torch

H, NOPE, KV_LORA, Q_LORA, HIDDEN, V = 4, 256, 512, 32, 64, 256
text = dict(
    model_type="glm5_next_text", hidden_size=HIDDEN, num_attention_heads=H, num_key_value_heads=H,
    q_lora_rank=Q_LORA, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=0,
    v_head_dim=V, index_topk=2048, index_kpool=4, index_n_heads=4, index_head_dim=128,
    num_hidden_layers=2, num_nextn_predict_layers=1, mla_use_nope=True,
    indexer_rope_interleave=False, vocab_size=128, intermediate_size=128, moe_intermediate_size=32,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    # "full_attention": a name every release's config validator accepts (transformers 5.17, used by 0.31,
    # lists no "indexed_attention"); anything but "linear_attention" is an MLA layer in every release
    layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
    mhc=False, pad_token_id=0, linear_num_heads=2, linear_head_dim=32, max_position_embeddings=8192,
)
ckpt = tempfile.mkdtemp()
with open(os.path.join(ckpt, "config.json"), "w") as f:
    json.dump({"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
               "text_config": text, "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2,
               "out_hidden_size": HIDDEN, "intermediate_size": 64,
               # 0.30's nvidia/multimodal.py asserts the vision tower has one (here or in text_config)
               "swiglu_limit": 7.0}}, f)

import vllm.platforms.cpu as cpu_platform
import vllm.utils.flashinfer as vllm_flashinfer
from vllm.config import (CacheConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig,
                         get_current_vllm_config, set_current_vllm_config)
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.v1.attention.backends.registry import AttentionBackendEnum

# What only a GB10 has: the SM120 sparse backend as platforms/cuda.py selects it on 12.x, and
# FlashInfer's sparse decode API (probed, never called: no kernel runs here).
cpu_platform.CpuPlatform.get_attn_backend_cls = classmethod(
    lambda cls, *a, **k: AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120.get_path())
vllm_flashinfer.has_flashinfer_sparse_mla_sm120 = lambda: True

gen = torch.Generator().manual_seed(0)
q_a, kv_a = torch.randn(Q_LORA, HIDDEN, generator=gen), torch.randn(KV_LORA, HIDDEN, generator=gen)
q_b = torch.randn(H * NOPE, Q_LORA, generator=gen)
kv_b = torch.randn(H * (NOPE + V), KV_LORA, generator=gen)
x = torch.randn(3, HIDDEN, generator=gen)


def mla_weights(prefix):
    return [(f"{prefix}.q_a_proj.weight", q_a), (f"{prefix}.kv_a_proj_with_mqa.weight", kv_a),
            (f"{prefix}.q_b_proj.weight", q_b), (f"{prefix}.kv_b_proj.weight", kv_b)]


def logits(attn):
    """Latent-form MLA decode logits from the layer's loaded projections and its own scale."""
    rope = attn.qk_rope_head_dim
    linear = torch.nn.functional.linear
    q_c, kv = linear(x, attn.fused_qkv_a_proj.weight).split([Q_LORA, KV_LORA + rope], dim=-1)
    q = linear(attn.q_a_layernorm.forward_native(q_c), attn.q_b_proj.weight).view(-1, H, NOPE + rope)
    kv_c, k_pe = kv.split([KV_LORA, rope], dim=-1)
    kv_c = attn.kv_a_layernorm.forward_native(kv_c)
    w_uk = attn.kv_b_proj.weight.view(H, NOPE + V, KV_LORA)[:, :NOPE]
    ql = torch.einsum("thp,hpl->thl", q[..., :NOPE], w_uk)
    qk = torch.einsum("thl,sl->ths", ql, kv_c) + torch.einsum("thr,sr->ths", q[..., NOPE:], k_pe)
    return (qk * attn.scaling).tolist()


def kv_row_bytes(mla):
    """The bytes a token's fp8_ds_mla cache row takes: the layer's own KV cache spec (0.34.0's SM120
    impl chooses 528 for a rope-free head, earlier releases always 656)."""
    try:
        return mla.get_kv_cache_spec(get_current_vllm_config()).state_content_bytes
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def describe(attn):
    mla = attn.mla_attn.mla_attn
    rope = attn.qk_rope_head_dim
    q_b_rows = attn.q_b_proj.weight.detach().view(H, NOPE + rope, Q_LORA)
    kv_a_rows = attn.fused_qkv_a_proj.weight.detach()[Q_LORA:]
    return {
        "rope": rope, "scaling": attn.scaling, "impl": type(mla.impl).__name__,
        "impl_scale": mla.impl.scale, "impl_rope": mla.impl.qk_rope_head_dim,
        "head_size": mla.head_size, "indexer_rope_dim": attn.indexer.rope_dim,
        "indexer_rotary_dim": attn.indexer_rope_emb.rotary_dim,
        "q_b_shape": list(attn.q_b_proj.weight.shape), "kv_a_rows": kv_a_rows.shape[0],
        "q_b_nope_rows_equal": torch.equal(q_b_rows[:, :NOPE], q_b.view(H, NOPE, Q_LORA)),
        "q_b_rope_rows": q_b_rows[:, NOPE:].abs().sum().item() if rope else None,
        "kv_a_latent_rows_equal": torch.equal(kv_a_rows[:KV_LORA], kv_a),
        "kv_a_rope_rows": kv_a_rows[KV_LORA:].abs().sum().item() if rope else None,
        "kv_row_bytes": kv_row_bytes(mla),
    }


def load(model, weights):
    # Parameters a failed load leaves unwritten hold a fixed value, not uninitialised memory.
    for param in model.parameters():
        if param.is_floating_point():
            param.data.fill_(7.0)
    try:
        model.load_weights(weights)
        return None
    except Exception as e:  # the outcome is the result: stock fails here on the naive override
        return f"{type(e).__name__}: {e}"


def scenario(gate, hf_overrides=None):
    os.environ["VLLM_MLA_NOPE_PAD_ROPE"] = gate
    mc = ModelConfig(model=ckpt, skip_tokenizer_init=True, dtype="float32", max_model_len=4096,
                     limit_mm_per_prompt={"image": 0, "video": 0}, hf_overrides=hf_overrides or {})
    pc = ParallelConfig()
    sc = SpeculativeConfig(method="mtp", num_speculative_tokens=1, target_model_config=mc,
                           target_parallel_config=pc)
    dm = sc.draft_model_config
    vc = VllmConfig(model_config=mc, parallel_config=pc, speculative_config=sc,
                    cache_config=CacheConfig(enable_prefix_caching=False, cache_dtype="fp8_ds_mla"))
    out = {"config": {
        "target": [mc.hf_text_config.qk_rope_head_dim, mc.get_head_size()],
        "draft": [dm.hf_config.model_type, dm.hf_text_config.qk_rope_head_dim, dm.get_head_size()],
    }}
    with set_current_vllm_config(vc):
        target = initialize_model(vc)
        prefix = "model.language_model.layers.1.self_attn"
        # A 0-d scale on kv_a_proj_with_mqa enters the loader the weight takes.
        out["target_scalar_load"] = load(
            target, [(f"{prefix}.kv_a_proj_with_mqa.input_scale", torch.tensor(0.5))])
        out["target_load"] = load(target, mla_weights(prefix))
        attn = target.language_model.model.layers[1].self_attn
        out["target"] = describe(attn)
        with torch.no_grad():
            out["logits"] = logits(attn)
        draft_vc = replace(vc, model_config=dm)
        with set_current_vllm_config(draft_vc):
            draft = initialize_model(draft_vc, model_config=dm)
        out["draft_load"] = load(draft, mla_weights("model.layers.2.self_attn"))
        out["draft"] = describe(draft.model.layers["2"].mtp_block.self_attn)
    return out


def direct_hook():
    """The config hook on configs transformers' Glm5NextTextConfig cannot express (index_topk is
    typed int there): a dense one and one whose rope was set by other means."""
    from transformers import PretrainedConfig
    import vllm.transformers_utils.config as tu_config

    hook = getattr(tu_config, "_patchkit_pad_nope_mla_rope", None)
    if hook is None:
        return None
    os.environ["VLLM_MLA_NOPE_PAD_ROPE"] = "1"
    results = {}
    for name, topk, rope in (("sparse", 2048, 0), ("dense", None, 0), ("preset", 2048, 64)):
        cfg = PretrainedConfig()
        cfg.model_type, cfg.mla_use_nope, cfg.index_topk, cfg.qk_rope_head_dim = (
            "glm5_next_text", True, topk, rope)
        try:
            hook(cfg)
            results[name] = cfg.qk_rope_head_dim
        except ValueError as e:
            results[name] = f"ValueError: {e}"
    return results


def pad_helper():
    """The patched row padding on a 0-d scale, a row scale, codes, and an already-padded tensor."""
    import importlib
    import vllm.models.glm5next as glm

    # 0.30 keeps GLM's layer in models/glm5next/nvidia/, 0.31+ in common/: read the installed layout.
    layout = "common" if os.path.exists(os.path.join(glm.__path__[0], "common", "attention.py")) else "nvidia"
    attention = importlib.import_module(f"vllm.models.glm5next.{layout}.attention")

    pad_rows = getattr(attention, "_zero_pad_rows", None)
    if pad_rows is None:
        return None
    scalar = torch.tensor(0.25)
    codes = torch.randint(1, 255, (H * NOPE, 8), dtype=torch.uint8, generator=gen)
    row_scale = torch.rand(H * NOPE, generator=gen) + 1
    done = torch.ones(H * (NOPE + 64), 8)
    padded_codes = pad_rows(codes, H, NOPE, 64)
    padded_scale = pad_rows(row_scale, H, NOPE, 64)
    return {
        "scalar_same_object": pad_rows(scalar, H, NOPE, 64) is scalar,
        "codes": [list(padded_codes.shape), str(padded_codes.dtype),
                  torch.equal(padded_codes.view(H, NOPE + 64, 8)[:, :NOPE], codes.view(H, NOPE, 8)),
                  int(padded_codes.view(H, NOPE + 64, 8)[:, NOPE:].abs().sum())],
        "row_scale": [list(padded_scale.shape),
                      torch.equal(padded_scale.view(H, -1)[:, :NOPE], row_scale.view(H, NOPE)),
                      float(padded_scale.view(H, -1)[:, NOPE:].abs().sum())],
        "already_padded_same_object": pad_rows(done, H, NOPE, 64) is done,
    }


with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp()}")
    initialize_model_parallel(1, 1)
result = {
    "gate_on": scenario("1"),
    "gate_off": scenario("0"),
    "override": scenario("0", {"text_config": {"qk_rope_head_dim": 64}}),
    "direct_hook": direct_hook(),
    "pad_helper": pad_helper(),
}
print(json.dumps(result))
'''


stock_run, patched_run = probe_fixtures(PROBE, ENV)


def _patch():
    from probes import patches_under_test

    return patches_under_test().patch("nope-mla-pad")


@pytest.fixture(scope="module")
def in_range(vllm_release):
    """The pad's own behaviour is asked only where it is carried: from 0.34.0 its range has ended
    (retired: the native 528-byte NoPE row, test_native_nope_rows_retire_the_pad)."""
    if not _patch().ranges["vllm"].contains(vllm_release):
        pytest.skip(f"nope-mla-pad is retired on vLLM {vllm_release} (out of its range "
                    f"{_patch().ranges['vllm']}; patch.toml says why)")


@pytest.fixture(scope="module")
def stock(in_range, stock_run):
    return stock_run


@pytest.fixture(scope="module")
def patched(in_range, patched_run):
    return patched_run


def _layers(run):
    return {"target": run["target"], "draft": run["draft"]}


def test_native_nope_rows_retire_the_pad(stock_run, patched_run, vllm_release):
    """Why the range ends before 0.34.0, from each release's own KV cache spec (the SM120 impl as
    selected on 12.x, fp8_ds_mla). Up to 0.33.0 stock gives a rope-free layer the padded 656-byte row
    anyway, so the pad costs no KV memory there; 0.34.0 gives it the native 528-byte row
    (FlashInferMLASparseSM120Impl.get_fp8_ds_mla_row_bytes), which the pad would grow back to 656
    and whose unpadded q_b/kv_a shapes are what the SM121 skinny-GEMM plans are written for. There
    the patch is not carried: the recipes' VLLM_MLA_NOPE_PAD_ROPE=1 changes nothing."""
    for run in (stock_run["gate_off"], patched_run["gate_off"]):
        for name, layer in _layers(run).items():
            assert (layer["impl"], layer["head_size"], layer["impl_rope"]) == (
                "FlashInferMLASparseSM120Impl", 512, 0), name
    rows = {name: layer["kv_row_bytes"] for name, layer in _layers(stock_run["gate_off"]).items()}
    if _patch().ranges["vllm"].contains(vllm_release):
        assert rows == {"target": 656, "draft": 656}
        assert {n: la["kv_row_bytes"] for n, la in _layers(patched_run["gate_on"]).items()} == rows
        return
    assert rows == {"target": 528, "draft": 528}
    gated = patched_run["gate_on"]
    assert gated["config"] == {"target": [0, 512], "draft": ["glm5_next_mtp", 0, 512]}
    assert gated == stock_run["gate_on"] and patched_run["direct_hook"] is None


def test_gate_pads_target_and_draft_config(stock, patched):
    """Stock reads nothing of the VLLM_MLA_NOPE_PAD_ROPE=1 the recipes set; patched, the target and
    the MTP draft config both declare the 64 rope dims and the KV head is 576."""
    assert stock["gate_on"] == stock["gate_off"]
    assert stock["gate_on"]["config"] == {"target": [0, 512], "draft": ["glm5_next_mtp", 0, 512]}
    for layer in _layers(stock["gate_on"]).values():
        assert (layer["head_size"], layer["impl_rope"], layer["q_b_shape"]) == (512, 0, [H * NOPE, 32])
    assert patched["gate_on"]["config"] == {"target": [64, 576], "draft": ["glm5_next_mtp", 64, 576]}


def test_gate_fixes_what_a_rope_override_breaks(stock, patched):
    """The way to 576 without this patch (--hf-overrides text_config.qk_rope_head_dim=64) on stock:
    the draft keeps 512 (dict overrides are target-only), the softmax scale moves to 320**-0.5, the
    indexer gets a 64-dim rope, the checkpoint's q_b_proj no longer loads and upstream's kv_a pad
    raises on a 0-d scale. Patched with the gate, none of these."""
    naive = stock["override"]
    assert naive["config"] == {"target": [64, 576], "draft": ["glm5_next_mtp", 0, 512]}
    assert naive["target"]["scaling"] == pytest.approx((NOPE + 64) ** -0.5)
    assert naive["target"]["indexer_rope_dim"] == 64
    assert "exceeds dimension size (1024)" in naive["target_load"]  # q_b_proj: 1024 rows, 1280 wanted
    assert "zero-dimensional" in naive["target_scalar_load"]
    gated = patched["gate_on"]
    assert gated["config"]["draft"] == ["glm5_next_mtp", 64, 576]
    assert gated["target"]["scaling"] == NOPE**-0.5 and gated["target"]["indexer_rope_dim"] == 0
    assert gated["target_load"] is None
    assert gated["target_scalar_load"].startswith("KeyError")


def test_padded_layers_keep_scale_and_rope_free_indexer(patched):
    for name, layer in _layers(patched["gate_on"]).items():
        assert layer["impl"] == "FlashInferMLASparseSM120Impl", name
        assert (layer["rope"], layer["head_size"], layer["impl_rope"]) == (64, 576, 64), name
        # The softmax scale stays on the unpadded head dim, in the layer and in the SM120 impl.
        assert layer["scaling"] == layer["impl_scale"] == NOPE**-0.5, name
        assert (layer["indexer_rope_dim"], layer["indexer_rotary_dim"]) == (0, 0), name


def test_real_loaders_pad_with_zero_rows(patched):
    """Target (Glm5NextModel.load_weights) and MTP draft (Glm5NextMTP.load_weights, its BF16 path)."""
    run = patched["gate_on"]
    assert run["target_load"] is None and run["draft_load"] is None
    for name, layer in _layers(run).items():
        assert layer["q_b_shape"] == [H * (NOPE + 64), 32], name
        assert layer["kv_a_rows"] == 512 + 64, name
        assert layer["q_b_nope_rows_equal"] and layer["kv_a_latent_rows_equal"], name
        assert layer["q_b_rope_rows"] == 0 and layer["kv_a_rope_rows"] == 0, name


def test_padded_logits_equal_unpadded(stock, patched):
    """Same checkpoint tensors, same input: the padded layer (576-wide q/k, its own scale) gives the
    stock NoPE layer's logits."""
    assert patched["gate_on"]["target"]["rope"] == 64  # the layer the logits come from is padded
    padded, unpadded = patched["gate_on"]["logits"], stock["gate_off"]["logits"]
    assert len(padded) == 3 and len(padded[0]) == H
    flat_p = [v for t in padded for h in t for v in h]
    flat_u = [v for t in unpadded for h in t for v in h]
    assert flat_p == pytest.approx(flat_u, rel=1e-6, abs=1e-6)


def test_scalar_scales_are_never_padded(stock, patched):
    # Through the real loader: upstream's kv_a pad no longer concatenates rows to a 0-d scale (stock
    # raises there, see test_gate_fixes_what_a_rope_override_breaks); the scale reaches the parameter
    # lookup and fails as any tensor a BF16 layer has no parameter for.
    scalar_load = patched["gate_on"]["target_scalar_load"]
    assert scalar_load.startswith("KeyError") and "kv_a_proj_with_mqa.input_scale" in scalar_load
    helper = patched["pad_helper"]
    assert helper["scalar_same_object"] and helper["already_padded_same_object"]
    assert helper["codes"] == [[H * (NOPE + 64), 8], "torch.uint8", True, 0]
    assert helper["row_scale"] == [[H * (NOPE + 64)], True, 0.0]
    assert stock["pad_helper"] is None


def test_gate_unset_is_stock(stock, patched):
    """With the gate in the tree (its hook present) but unset, every scenario matches stock exactly:
    configs, parameters, scales, load outcomes and logits."""
    assert patched["direct_hook"] is not None
    assert patched["gate_off"] == stock["gate_off"]
    assert patched["override"] == stock["override"]


def test_hook_only_pads_sparse_nope_configs(stock, patched):
    assert stock["direct_hook"] is None
    hook = patched["direct_hook"]
    assert hook["sparse"] == 64 and hook["dense"] == 0
    assert hook["preset"].startswith("ValueError") and "qk_rope_head_dim" in hook["preset"]


# ---- FlashInfer 0.6.x: the (heads, 2176) decode allowlist and the 2176 -> 2048 top-k fit ----
# Run on the real flashinfer-python 0.6.17 (the pinned base's) and 0.6.18.post1 (vLLM 0.30.0's pin) sdists:
# its mla/_sparse_mla_sm120.py, stock and as this patch leaves it, executed on CPU. Importing the
# package would build its CUDA JIT modules, so the module's top-level definitions run from its own
# text (ast); nothing is re-implemented. The tables come from vLLM's own pool expansion
# (expand_pools_to_tokens + append_tail_to_topk, the torch twins of the Triton kernel GLM decodes with).

FLASHINFER_06 = ("0.6.17", "0.6.18.post1")  # the pinned base's; vLLM 0.30.0's pin
GLM_HEADS = (8, 16, 32, 64)  # GLM-5.3-Flash's 64 heads at TP 8, 4, 2, 1
INDEX_TOPK, KPOOL = 2048, 4  # GLM-5.3-Flash's index_topk and index_kpool
WIDTH = -(-(INDEX_TOPK + KPOOL - 1) // 128) * 128  # the SM120 top-k buffer: round_up(2051, 128)


def _run_definitions(text: str, names: set[str], namespace: dict) -> dict:
    """Execute the top-level assignments and functions of `text` that bind `names`, in file order."""
    for node in ast.parse(text).body:
        bound = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.AnnAssign)):
            bound = {node.name} if isinstance(node, ast.FunctionDef) else {node.target.id}
        if bound & names:
            exec(compile(ast.Module([node], []), "<flashinfer>", "exec"), namespace)
    return namespace


@functools.cache
def _flashinfer_06_texts(version: str = FLASHINFER_06[-1]) -> tuple[str, str]:
    """mla/_sparse_mla_sm120.py of a FlashInfer 0.6.x release, stock and with this patch applied."""
    from patchkit.patching.patchset import load_patchset
    from patchkit.patching.planner import plan
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.release import open_release

    source = open_release("flashinfer-python", version, cache=ArchiveCache(), progress=False)
    path = "mla/_sparse_mla_sm120.py"
    if "nope-mla-pad" in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(","):  # nox -s patch-necessity
        stock = source.read("flashinfer", path).decode()
        return stock, stock
    result = plan([load_patchset(REPO_PATCHES).patch("nope-mla-pad")], source)
    result.raise_for_errors()
    change = next(c for c in result.changes if (c.package, c.path) == ("flashinfer", path))
    return source.read("flashinfer", path).decode(), change.new.decode()


def _flashinfer_module(text: str) -> dict:
    from typing import Optional

    import torch

    names = {"_DECODE_MAX_TOKENS", "_DECODE_DSV3_2_DISPATCH", "_DECODE_DSV3_2_PAGE_BLOCK_SIZE",
             "_decode_dsv3_2_dispatchable", "_PATCHKIT_GLM_TOPK_WIDTH", "_PATCHKIT_V32_KERNEL_TOPK",
             "_patchkit_fit_topk_width"}
    return _run_definitions(text, names, {"torch": torch, "Optional": Optional})


def _kpool_tables(seq_lens: list[int], generator) -> torch.Tensor:
    """GLM decode top-k tables as vLLM builds them: pools chosen, expanded, tail appended, buffer -1."""
    import torch
    import vllm.models.glm5next as glm

    with open(f"{glm.__path__[0]}/nvidia/ops/kpool_compress.py", encoding="utf-8") as f:
        text = f.read()
    ops = _run_definitions(text, {"history_group_budget_for_topk", "expand_pools_to_tokens",
                                  "append_tail_to_topk"}, {"torch": torch})
    pools = INDEX_TOPK // KPOOL
    ids, valid = [], []
    for n in seq_lens:  # the top-k kernel's choice among the row's complete pools, -1 past them
        chosen = torch.randperm(max(n // KPOOL, 1), generator=generator)[:pools]
        row = torch.full((pools,), -1, dtype=torch.int32)
        row[: min(pools, n // KPOOL)] = chosen[: min(pools, n // KPOOL)].to(torch.int32)
        ids.append(row)
        valid.append(row >= 0)
    history = ops["expand_pools_to_tokens"](torch.stack(ids), torch.stack(valid), INDEX_TOPK, KPOOL)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    table = ops["append_tail_to_topk"](history, lens, lens // KPOOL, KPOOL)
    buffer = torch.full((len(seq_lens), WIDTH), -1, dtype=torch.int32)
    buffer[:, : table.shape[1]] = table
    return buffer


REPO_PATCHES = __import__("pathlib").Path(__file__).resolve().parents[2] / "patches"


@pytest.mark.network
@pytest.mark.parametrize("version", FLASHINFER_06)
def test_flashinfer_06_decode_takes_the_padded_width(version):
    """Stock 0.6.x has no decode kernel for (heads, 2176) (0.6.18.post1 raises "no decode kernel for this
    shape", 0.6.17 aborts in the prefill kernel); patched, every GLM head count routes to the V32/GLM_NSA
    decode at that width."""
    stock_text, patched_text = _flashinfer_06_texts(version)
    stock, patched = _flashinfer_module(stock_text), _flashinfer_module(patched_text)
    assert WIDTH == 2176
    for heads in GLM_HEADS:
        for module, expected in ((stock, False), (patched, True)):
            assert module["_decode_dsv3_2_dispatchable"](1, heads, WIDTH, 576, 64) is expected, heads
        assert patched["_decode_dsv3_2_dispatchable"](1, heads, 2048, 576, 64)
    assert not patched["_decode_dsv3_2_dispatchable"](65, 64, WIDTH, 576, 64)  # prefill stays prefill


@pytest.mark.network
def test_flashinfer_06_fit_keeps_ranked_entries_tail_and_padding():
    """The fit to the 2048-wide kernel: valid entries keep their order, the -1 padding stays -1 at the
    end, the always-selected tail is kept, and only a full history row with a tail loses entries."""
    import torch

    fit = _flashinfer_module(_flashinfer_06_texts()[1])["_patchkit_fit_topk_width"]
    gen = torch.Generator().manual_seed(0)
    seq_lens = [1, 3, 4, 5, 2047, 2048, 2049, 2050, 2051, 9000, 9001, 9003, 123457]
    tables = _kpool_tables(seq_lens, gen)
    fitted, lengths = fit(tables, None, INDEX_TOPK)
    assert fitted.shape == (len(seq_lens), INDEX_TOPK) and lengths is None
    for n, row, out in zip(seq_lens, tables.tolist(), fitted.tolist(), strict=True):
        entries = [i for i in row if i >= 0]
        tail = [i for i in row[INDEX_TOPK:] if i >= 0]
        assert tail == list(range(n - n % KPOOL, n))  # the newest tokens, appended by vLLM
        kept = [i for i in out if i >= 0]
        assert out == kept + [-1] * (INDEX_TOPK - len(kept))  # padding intact, at the end
        dropped = len(entries) - INDEX_TOPK
        if dropped <= 0:
            assert kept == entries  # nothing lost
        else:  # the last history columns make room for the tail, order kept
            history = [i for i in row[:INDEX_TOPK] if i >= 0]
            assert n >= INDEX_TOPK and dropped == n % KPOOL
            assert kept == history[: INDEX_TOPK - len(tail)] + tail
    # With topk_length, entries past it count as absent and the new lengths say what is kept.
    lengths_in = torch.full((len(seq_lens),), WIDTH, dtype=torch.int32)
    lengths_in[0] = 0
    again, lengths_out = fit(tables.unsqueeze(1), lengths_in, INDEX_TOPK)
    assert again.shape == (len(seq_lens), 1, INDEX_TOPK) and lengths_out[0] == 0
    assert torch.equal(again[1:, 0], fitted[1:]) and torch.equal(lengths_out[1:], (fitted[1:] >= 0).sum(-1).int())


@pytest.mark.network
def test_flashinfer_06_fit_drops_entries_only_on_long_rows_with_a_tail():
    """Which entries the fit drops, measured on vLLM's own tables over uniform decode lengths: a row
    has valid entries past column 2048 whenever seq_len % 4 != 0 (3 in 4 rows); it loses entries only
    when its history is full too (seq_len >= 2048): then seq_len % 4 of its 2048 history entries
    (<= 0.15%), never a tail token. The numbers are in the patch's evidence."""
    import torch

    fit = _flashinfer_module(_flashinfer_06_texts()[1])["_patchkit_fit_topk_width"]
    rng = random.Random(0)
    seq_lens = [rng.randrange(1, 131072) for _ in range(2000)]
    tables = _kpool_tables(seq_lens, torch.Generator().manual_seed(1))
    fitted, _ = fit(tables, None, INDEX_TOPK)
    past = (tables[:, INDEX_TOPK:] >= 0).any(-1)
    lost = (tables >= 0).sum(-1) - (fitted >= 0).sum(-1)
    lens = torch.tensor(seq_lens)
    assert torch.equal(past, lens % KPOOL != 0)
    assert torch.equal(lost, torch.where(lens >= INDEX_TOPK, lens % KPOOL, 0))
    share_past, share_lossy = past.float().mean().item(), (lost > 0).float().mean().item()
    assert 0.70 < share_past < 0.80 and 0.68 < share_lossy < 0.78, (share_past, share_lossy)


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.6.17", "0.6.18.post1", "0.7.0.post1", "0.7.2.post1"])
def test_flashinfer_edits_split_by_flashinfer_release(version):
    """One patch, two FlashInfer code lines (edit-level `versions` on package flashinfer): a 0.6.x
    source gets the allowlist and the fit (edits pending, then applied), a 0.7.x source only the
    runtime-top-k asserts (holding); no 0.7 assert is evaluated on 0.6 nor any 0.6 edit on 0.7."""
    from packaging.version import Version

    from patchkit.patching.patchset import load_patchset
    from patchkit.patching.planner import plan
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.release import open_release

    patch = load_patchset(REPO_PATCHES).patch("nope-mla-pad")
    source = open_release("flashinfer-python", version, cache=ArchiveCache(), progress=False)
    result = plan([patch], source).result("nope-mla-pad")
    evaluated = {e.edit.index: e.state for e in result.edits}
    mine = {e.index for e in patch.edits if e.package == "flashinfer" and e.versions.contains(Version(version))}
    assert set(evaluated) == mine and mine
    if Version(version) < Version("0.7"):
        assert sorted(evaluated.values()) == ["holds", "pending", "pending", "pending"]
    else:
        assert set(evaluated.values()) == {"holds"}
