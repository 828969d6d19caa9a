"""The synthetic checkpoint's config.json (the quantization_config each producer writes) and header-only
safetensors shards at any size: what `preflight` tests read and what the CPU smoke's packer writes
beside its real tensors."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.smoke.synthetic_layout import (
    PREFIX,
    Dims,
    Layout,
    Linear,
    modules,
    tensor_headers,
)


def _ignore_list(layout: Layout, d: Dims, mods: list[Linear]) -> list[str]:
    """ModelOpt-style `x*` wildcards for the BF16 parts vLLM would otherwise quantize (HF spelling)."""
    ignore = ["lm_head", "model.visual*"]
    layers = d.layers + (d.mtp_layers if layout.has_mtp and layout.mtp_in_ignore else 0)
    bf16_kinds = {m.kind for m in mods if m.dtype is None and m.fmt == "BF16" and not m.mtp}
    for layer in range(layers):
        p = f"{PREFIX}.layers.{layer}"
        ignore.append(f"{p}.self_attn*")
        if layer >= d.dense_layers:
            ignore.append(f"{p}.mlp.gate*")
            if "shared_expert" in bf16_kinds:
                ignore.append(f"{p}.mlp.shared_experts*")
    return ignore


def hf_quant_config(layout: Layout, d: Dims, mods: list[Linear]) -> dict:
    """The ModelOpt export's hf_quant_config.json content (`quantization` form)."""
    q: dict = {"quant_algo": layout.quant_algo, "kv_cache_quant_algo": "FP8" if layout.kv_fp8 else None}
    if layout.quant_algo == "MIXED_PRECISION":
        q["quantized_layers"] = {
            m.name: {"quant_algo": layout.mixed_algos[m.fmt], "group_size": 32 if m.fmt == "MXFP8" else 16}
            for m in mods
            if m.dtype is None and m.fmt != "BF16"
        }
        q["exclude_modules"] = ["lm_head", "model.visual*"]
    else:
        q["group_size"] = 16
        q["exclude_modules"] = _ignore_list(layout, d, mods)
    return {"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": q}


def modelopt_config_json(hf_quant: dict) -> dict:
    """config.json's quantization_config as ModelOpt 0.47's convert_hf_quant_config_format writes it,
    for the layouts used here (a test in the ModelOpt environment checks this against the real one)."""
    q = hf_quant["quantization"]
    algo = q["quant_algo"]
    weights = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    acts = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    out: dict = {}
    if algo == "NVFP4":
        out["config_groups"] = {"group_0": {"input_activations": acts, "weights": weights, "targets": ["Linear"]}}
    elif algo == "W4A16_NVFP4":
        out["config_groups"] = {"group_0": {"weights": weights, "targets": ["Linear"]}}
    elif algo == "MIXED_PRECISION":
        groups: dict[tuple, list[str]] = {}
        for name, cfg in q["quantized_layers"].items():
            groups.setdefault(tuple(sorted(cfg.items())), []).append(name)
        out["config_groups"] = {}
        for idx, (key, names) in enumerate(groups.items()):
            cfg = dict(key)
            gs = cfg.get("group_size")
            group: dict[str, object]  # the scheme's tables, then its targets
            if cfg["quant_algo"] == "MXFP8":
                gs = gs or 32
                group = {
                    "input_activations": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": gs},
                    "weights": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": gs},
                }
            elif cfg["quant_algo"] == "W4A16_NVFP4":
                group = {"weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": gs or 16}}
            elif cfg["quant_algo"] == "NVFP4":
                a = dict(acts, group_size=gs or 16)
                group = {"input_activations": a, "weights": dict(weights, group_size=gs or 16)}
            else:
                raise PatchkitError(f"no config rule for {cfg['quant_algo']} (a patchkit bug: please report it; "
                                    "the synthetic layouts use only these)")
            group["targets"] = sorted(names)
            out["config_groups"][f"group_{idx}"] = group
        out["quantized_layers"] = q["quantized_layers"]
    else:
        raise PatchkitError(f"no config rule for quant_algo {algo} (a patchkit bug: please report it; the "
                            "synthetic layouts use only these)")
    out["ignore"] = q.get("exclude_modules") or []
    out["quant_algo"] = algo
    if q.get("kv_cache_quant_algo") == "FP8":
        out["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
    out["producer"] = hf_quant["producer"]
    out["quant_method"] = "modelopt"
    return out


# RedHatAI/GLM-5.3-Flash-NVFP4's quantization_config as the public records describe it (the published
# config.json was not read here): the same dict as tests/data/quant-configs/redhat-quantization_config.json,
# whose provenance tests/data/README.md gives and which a test keeps equal to this one. Top-level format
# "mixed-precision"; group_0 NVFP4 on the routed experts of layers 3-44 only, group_1 8-bit float on the
# MTP layer 45's experts; everything else (dense MLP 0-2, attention, indexer, shared experts, routers,
# vision) is in no group, i.e. BF16. group_0's activations are contested: W4A4 dynamic "local" group 16
# (model card, two records, llm-compressor's NVFP4 preset, the index's tensor count) was chosen over a
# field report's `input_activations: None` (docs/field-records.md "Decision on group_0's activations").
_NVFP4 = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}
REDHAT_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mixed-precision",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "format": "nvfp4-pack-quantized",
            "targets": [r"re:.*\.layers\.(?:[3-9]|[1-3][0-9]|4[0-4])\.mlp\.experts\..*(gate|up|down)_proj$"],
            "weights": dict(_NVFP4, dynamic=False, scale_dtype="float8_e4m3fn"),
            "input_activations": dict(_NVFP4, dynamic="local", scale_dtype="float8_e4m3fn"),
            "output_activations": None,
        },
        "group_1": {
            "format": "float-quantized",
            "targets": [r"re:.*\.layers\.45\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)$"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": None,
            "output_activations": None,
        },
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "version": "0.17.2.dev32+g46196ce",
}


def compressed_tensors_config() -> dict:
    """The redhat layout's quantization_config (a fresh copy of REDHAT_QUANTIZATION_CONFIG)."""
    return copy.deepcopy(REDHAT_QUANTIZATION_CONFIG)


def config_json(layout: Layout, d: Dims, mods: list[Linear]) -> dict:
    """A Glm5NextForConditionalGeneration config.json with the variant's quantization_config."""
    text = {
        "model_type": "glm5_next_text", "hidden_size": d.hidden, "intermediate_size": d.dense_inter,
        "moe_intermediate_size": d.moe_inter, "vocab_size": d.vocab, "num_hidden_layers": d.layers,
        "num_nextn_predict_layers": d.mtp_layers if layout.has_mtp else 0,
        "num_attention_heads": d.heads, "num_key_value_heads": d.heads, "q_lora_rank": d.q_lora,
        "kv_lora_rank": d.kv_lora, "qk_nope_head_dim": d.qk_nope, "qk_rope_head_dim": 0,
        "v_head_dim": d.v_head, "n_routed_experts": d.experts, "n_shared_experts": 1,
        "num_experts_per_tok": min(8, d.experts), "linear_num_heads": d.lin_heads,
        "linear_head_dim": d.lin_head_dim, "linear_conv_kernel_dim": d.conv, "index_n_heads": d.idx_heads,
        "index_head_dim": d.idx_head_dim, "index_kpool": d.kpool, "index_topk": 4 * d.kpool * 32,
        "hc_mult": d.hc_mult, "torch_dtype": "bfloat16",
    }
    if layout.fmt == "modelopt":
        quant = modelopt_config_json(hf_quant_config(layout, d, mods))
    else:
        quant = compressed_tensors_config()
    return {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text,
        "vision_config": {"hidden_size": d.vision_hidden, "depth": d.vision_blocks},
        "quantization_config": quant,
        "torch_dtype": "bfloat16",
    }


def _header_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[bytes, int]:
    from patchkit.checkpoint.headers import DTYPE_BITS

    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 1
        for dim in shape:
            size *= dim
        nbytes = (size * DTYPE_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw, offset


def write_header_set(root: Path, layout: Layout, d: Dims, shards: int) -> dict:
    """config.json, the index and header-only shards (no tensor data) for the variant at size `d`.

    Returns the config dict. Modules are never split across shards, as real exports do."""
    mods = modules(layout, d)
    root.mkdir(parents=True, exist_ok=True)
    config = config_json(layout, d, mods)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    per_shard = -(-len(mods) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        for module in mods[s * per_shard : (s + 1) * per_shard]:
            tensors.update(tensor_headers(module))
        header, data_bytes = _header_bytes(tensors)
        (root / name).write_bytes(header)
        total += data_bytes
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return config
