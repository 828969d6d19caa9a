"""ModelOpt quantization configs shaped like the real GLM-5.3-Flash checkpoints, and a CPU harness
that builds vLLM's real GLM-5.3 layers from them.

Imported two ways: by the tests (pure data, no vLLM import) and inside probe subprocesses, where
`probe_prelude()` puts this folder on sys.path so the probe can call `Glm5NextOnCpu`.

The configs follow the layouts the checkpoints document (field notes, recipes 001/002, the 004 issue):
flat `config.json` `quantization_config`, module-level entries in the multimodal spelling
(`model.language_model.layers.N.*`), 45 text layers (KDA everywhere but every fourth layer from 3, which
is MLA with the sparse indexer), dense MLP on 0-2, MoE from 3, the MTP predictor at layer 45.
"""

from __future__ import annotations

import json
from pathlib import Path

NUM_HIDDEN_LAYERS = 45
MTP_LAYER = NUM_HIDDEN_LAYERS  # num_nextn_predict_layers = 1
MLA_LAYERS = tuple(range(3, NUM_HIDDEN_LAYERS, 4))
KDA_LAYERS = tuple(i for i in range(NUM_HIDDEN_LAYERS) if i not in MLA_LAYERS)
MOE_LAYERS = tuple(range(3, NUM_HIDDEN_LAYERS))

KDA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj", "f_b_proj", "g_b_proj", "o_proj")
MLA_PROJECTIONS = ("q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "o_proj")
INDEXER_PROJECTIONS = ("indexer.wq_b", "indexer.wk", "indexer.weights_proj")
SHARED_EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _hf(layer: int, module: str) -> str:
    return f"model.language_model.layers.{layer}.{module}"


def lab_quantization_config() -> dict:
    """local-inference-lab/GLM-5.3-Flash-NVFP4: routed experts NVFP4, the MTP's routed experts MXFP8,
    everything else BF16 (unlisted)."""
    layers = {_hf(i, "mlp.experts"): {"quant_algo": "NVFP4", "group_size": 16} for i in MOE_LAYERS}
    layers[_hf(MTP_LAYER, "mlp.experts")] = {"quant_algo": "MXFP8"}
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "ignore": ["lm_head", "model.visual*"],
        "quantized_layers": layers,
    }


def p4p67_quantization_config() -> dict:
    """local-inference-lab/GLM-5.3-Flash-NVFP4-4p67: routed experts W4A16_NVFP4 (MTP too), attention
    (KDA and MLA), indexer and shared experts MXFP8 (MTP attention and shared experts too), dense MLP,
    embeddings and lm_head BF16."""
    layers: dict[str, dict] = {}
    for i in MOE_LAYERS + (MTP_LAYER,):
        layers[_hf(i, "mlp.experts")] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        for p in SHARED_EXPERT_PROJECTIONS:
            layers[_hf(i, f"mlp.shared_experts.{p}")] = {"quant_algo": "MXFP8"}
    for i in KDA_LAYERS:
        for p in KDA_PROJECTIONS:
            layers[_hf(i, f"self_attn.{p}")] = {"quant_algo": "MXFP8"}
    for i in MLA_LAYERS + (MTP_LAYER,):
        for p in MLA_PROJECTIONS + INDEXER_PROJECTIONS:
            layers[_hf(i, f"self_attn.{p}")] = {"quant_algo": "MXFP8"}
    return {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "ignore": ["lm_head", "model.visual*"],
        "quantized_layers": layers,
    }


def nvidia_quantization_config() -> dict:
    """nvidia/GLM-5.3-Flash-NVFP4 @ 423acf37: plain NVFP4 with an ignore list (BF16 attention, shared
    experts, routers, embeddings, lm_head, vision tower); the BF16 MTP layer 45 is NOT in it."""
    ignore = ["lm_head", "model.visual*", "model.language_model.embed_tokens"]
    for i in range(NUM_HIDDEN_LAYERS):
        ignore.append(f"model.language_model.layers.{i}.self_attn*")
        if i in MOE_LAYERS:
            ignore.append(f"model.language_model.layers.{i}.mlp.gate")
            ignore.append(f"model.language_model.layers.{i}.mlp.shared_experts*")
    return {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "ignore": ignore,
    }


# Small dimensions, real structure: the layer counts, layer kinds, NoPE MLA and kpool indexer of the
# real text config; only widths shrink so CPU construction takes a second.
TINY_TEXT_CONFIG = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "linear_num_heads": 2,
    "linear_head_dim": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "intermediate_size": 128,
    "n_shared_experts": 1,
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 0,
    "v_head_dim": 32,
    "index_n_heads": 2,
    "index_head_dim": 128,
    "vocab_size": 512,
    "pad_token_id": 0,
    # present in the checkpoints' config.json, not declared by transformers' Glm5NextTextConfig
    "mhc": False,
    "mla_use_nope": True,
    "indexer_rope_interleave": False,
    "num_nextn_predict_layers": 1,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
}


def probe_prelude() -> str:
    """Code that makes this module importable inside a probe subprocess, before vLLM is imported.

    CUDA_VISIBLE_DEVICES empty (unless set): vLLM's "driver not up yet" case, which keeps the installed
    Triton on without a GPU driver. From 0.34.0 the x86 CPU platform refuses to build a VllmConfig
    without Triton (platforms/cpu.py:241-243; 0.33.0 only warned), and Glm5NextOnCpu builds several."""
    return ("import os, sys\nos.environ.setdefault('CUDA_VISIBLE_DEVICES', '')\n"
            f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n")


def glm_module(name: str):
    """A module of the installed release's GLM-5.3 model package (`model`, `attention`, `kda`, `mtp`):
    models/glm5next/common/ from 0.31.0, models/glm5next/nvidia/ on 0.30.0 (the default base's layout).
    Found through the class vLLM's registry exports, so a probe never names either layout."""
    import importlib

    from vllm.models import glm5next

    package = glm5next.Glm5NextForCausalLM.__module__.rsplit(".", 1)[0]
    return importlib.import_module(f"{package}.{name}")


def as_literal(value: object) -> str:
    """A JSON value as a Python expression for probe code."""
    return f"json.loads({json.dumps(json.dumps(value))})"


class Glm5NextOnCpu:
    """vLLM's real GLM-5.3 config, quant config and layers on a CPU, single-rank.

    What is replaced, and why (each is a GPU-only choice made at construction, irrelevant to which
    quant method and parameters a layer gets): the linear GEMM kernel selector and the MoE backend
    oracles of the ModelOpt, FP8 and unquantized methods (no CPU kernel exists), and the MLA attention
    wrapper of glm5next's attention module (it selects a GPU attention backend). Everything else --
    the model classes, `configure_quant_config`, the ModelOpt configs and methods, parameter
    creation, the weight loaders -- is vLLM's own code.
    """

    def __init__(self, tmp_dir: str):
        import socket

        import torch
        from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import (
            ensure_model_parallel_initialized,
            init_distributed_environment,
        )
        from vllm.v1.worker.workspace import init_workspace_manager

        self.torch = torch
        self.tmp_dir = Path(tmp_dir)
        self._checkpoints = 0
        self._context = None
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo"
            )
            ensure_model_parallel_initialized(1, 1)
        init_workspace_manager(torch.device("cpu"))
        self._replace_gpu_only_choices()
        torch.set_default_dtype(torch.bfloat16)  # as vLLM's loader does for a bfloat16 model

    def checkpoint(
        self, quantization_config: dict | None, hf_overrides: dict | None = None, text_config: dict | None = None
    ) -> Glm5NextOnCpu:
        """Write a config.json carrying `quantization_config` and let vLLM build its configs from it,
        the way `vllm serve` does: ModelConfig (with --hf-overrides), then the quant config."""
        from transformers import Glm5NextConfig
        from vllm.config import (
            DeviceConfig,
            LoadConfig,
            ModelConfig,
            VllmConfig,
            set_current_vllm_config,
        )

        self._checkpoints += 1
        folder = self.tmp_dir / f"checkpoint-{self._checkpoints}"
        config = Glm5NextConfig(text_config={**TINY_TEXT_CONFIG, **(text_config or {})})
        config.architectures = ["Glm5NextForConditionalGeneration"]
        if quantization_config is not None:
            config.quantization_config = quantization_config
        config.save_pretrained(folder)
        self.model_config = ModelConfig(
            model=str(folder), skip_tokenizer_init=True, dtype="bfloat16", hf_overrides=hf_overrides or {}
        )
        self.text_config = self.model_config.hf_text_config
        self.quant_config = VllmConfig.get_quantization_config(self.model_config, LoadConfig())
        self.vllm_config = VllmConfig(model_config=self.model_config, device_config=DeviceConfig(device="cpu"))
        self.vllm_config.quant_config = self.quant_config
        # the mHC kernels' JIT warmup needs TileLang (GPU builds); vLLM's own knob turns it off
        self.vllm_config.kernel_config.enable_jit_warmup = False
        if self._context is not None:
            self._context.__exit__(None, None, None)
        self._context = set_current_vllm_config(self.vllm_config)
        self._context.__enter__()
        return self

    @staticmethod
    def _replace_gpu_only_choices() -> None:
        import torch
        import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method as unquantized_moe
        from vllm.model_executor.layers.quantization import fp8, modelopt
        attention = glm_module("attention")

        modelopt.select_linear_kernel = lambda *args, **kwargs: None
        modelopt.expose_input_quant_key = lambda *args, **kwargs: None
        modelopt.select_nvfp4_moe_backend = lambda **kwargs: (None, None)
        modelopt.select_mxfp8_moe_backend = lambda **kwargs: (None, None)
        unquantized_moe.select_unquantized_moe_backend = lambda *args, **kwargs: (None, None)
        fp8.init_fp8_linear_kernel = lambda *args, **kwargs: None
        fp8.select_fp8_moe_backend = lambda *args, **kwargs: (None, None)

        class NoKernelMLA(torch.nn.Module):
            def __init__(self, *args, **kwargs):
                super().__init__()

        attention.MultiHeadLatentAttentionWrapper = NoKernelMLA

    def configure(self, *class_names: str) -> None:
        """What `initialize_model` does for each class, in the order vLLM builds them."""
        from vllm.model_executor.model_loader.utils import configure_quant_config
        from vllm.models import glm5next

        if self.quant_config is None:  # initialize_model skips it too
            return
        for name in class_names:
            configure_quant_config(self.quant_config, getattr(glm5next, name))

    def target(self) -> None:
        """Target: the multimodal wrapper, then its inner text model."""
        self.configure("Glm5NextForConditionalGeneration", "Glm5NextForCausalLM")

    def decoder_layer(self, index: int, prefix: str):
        Glm5NextDecoderLayer = glm_module("model").Glm5NextDecoderLayer
        is_mtp = index >= NUM_HIDDEN_LAYERS
        buffer = self.torch.empty(16, 2048 + 64, dtype=self.torch.int32)
        return Glm5NextDecoderLayer(
            vllm_config=self.vllm_config,
            config=self.text_config,
            layer_idx=index,
            prefix=prefix,
            topk_indices_buffer=buffer,
            is_mtp_layer=is_mtp,
        )

    def target_layer(self, index: int):
        return self.decoder_layer(index, f"language_model.model.layers.{index}")

    def mtp_layer(self):
        """The draft's decoder block, named as Glm5NextMTP names it (prefix "" -> model.layers.45)."""
        self.configure("Glm5NextMTP")
        return self.decoder_layer(MTP_LAYER, f"model.layers.{MTP_LAYER}")

    def text_model(self, layers: dict):
        """A module holding real decoder layers ({index: layer}) with what `Glm5NextModel.load_weights`
        reads of its model besides them, as the real constructor sets it on a CPU: no fused shared
        experts (0.30-0.33: is_fused_shared_expert_enabled; 0.34: fused_shared_expert_layers) and no
        MegaMoE (0.34: on SM100 only). load_weights then runs unbound on it."""
        torch, config = self.torch, self.text_config

        class TextModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.config = config
                self.is_fused_shared_expert_enabled = False
                self.use_mega_moe = False
                self.fused_shared_expert_layers = frozenset()
                self.layers = torch.nn.ModuleDict({str(i): layer for i, layer in layers.items()})

        return TextModel()


def describe_quant(module) -> dict:
    """{submodule: {"method": class name, "params": {name: dtype}}} for every module holding a quant
    method; routed experts also report the ModelOpt algorithm their method was built for."""
    out = {}
    for name, sub in module.named_modules():
        method = getattr(sub, "quant_method", None)
        if method is None:
            continue
        entry = {
            "method": type(method).__name__,
            "params": {n: str(p.dtype).removeprefix("torch.") for n, p in sub.named_parameters(recurse=False)},
        }
        sub_config = getattr(method, "quant_config", None)
        if sub_config is not None and hasattr(sub_config, "quant_method"):
            entry["algo"] = sub_config.quant_method
        out[name] = entry
    return out
