"""CPU load smoke: a synthetic checkpoint per variant, resolved through the real vLLM quantization code.

Part 1 (this file's top half) describes a GLM-5.3-Flash checkpoint as stored: the real tensor names
(`model.language_model.layers.N...`, HF spelling), dtypes and shapes, for each variant's quantization
layout, at any size (`REAL_DIMS` reproduces the real model's ~147,000 tensors and ~204 GB; `TINY_DIMS`
keeps the same names with widths of a few dozen). `write_header_set` writes config, index and
header-only shards at any size with no tensor data: what `preflight` tests read.

Part 2 packs the tiny checkpoint's quantized tensors with the reference code (ModelOpt's NVFP4/MXFP8
quantizers, compressed-tensors' NVFP4 compressor) in their own environment, and Part 3 resolves every
quantizable layer of it through the (stock or patched) vLLM quantization config in the vLLM test
environment, giving the quantprobe table compared with the variant's expected rows.

Only the standard library and patchkit's stdlib-only modules are imported at the top: this file also
runs as the worker (`python -m patchkit.variants.smoke.cpu ...`) inside those other environments.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from patchkit.errors import PatchkitError

# ---------------------------------------------------------------- Part 1: layout


@dataclass(frozen=True)
class Dims:
    hidden: int
    moe_inter: int
    dense_inter: int
    vocab: int
    heads: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    v_head: int
    lin_heads: int
    lin_head_dim: int
    conv: int
    idx_heads: int
    idx_head_dim: int
    kpool: int
    experts: int
    layers: int
    dense_layers: int
    mtp_layers: int
    hc_mult: int
    vision_blocks: int
    vision_hidden: int


# transformers' Glm5NextTextConfig defaults (the released model) and a vision tower of the size that
# brings the total to the real checkpoint's ~147,000 tensors and ~204 GB (nvidia revision 423acf37 has
# 147,661 tensors and 204,439,103,396 bytes of tensor data).
REAL_DIMS = Dims(
    hidden=4096, moe_inter=2048, dense_inter=12288, vocab=154880, heads=64, q_lora=1536, kv_lora=512,
    qk_nope=256, v_head=256, lin_heads=64, lin_head_dim=128, conv=4, idx_heads=32, idx_head_dim=128,
    kpool=16, experts=288, layers=45, dense_layers=3, mtp_layers=1, hc_mult=4, vision_blocks=24,
    vision_hidden=1536,
)
# Same names and layer indices (MTP stays layer 45); widths divisible by 32 so MXFP8 and NVFP4 blocks fit.
TINY_DIMS = replace(
    REAL_DIMS, hidden=64, moe_inter=32, dense_inter=64, vocab=512, heads=2, q_lora=64, kv_lora=64,
    qk_nope=32, v_head=32, lin_heads=2, lin_head_dim=32, idx_heads=2, idx_head_dim=32, kpool=4,
    experts=4, hc_mult=2, vision_blocks=1, vision_hidden=32,
)

KDA_LINEARS = ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj", "f_b_proj", "g_b_proj", "o_proj")
MLA_LINEARS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
INDEXER_LINEARS = ("wq_b", "wk", "weights_proj")
PREFIX = "model.language_model"


@dataclass(frozen=True)
class Layout:
    """How one variant stores each kind of linear module; every other tensor is as released."""

    variant: str
    fmt: str  # modelopt | compressed-tensors
    quant_algo: str
    storage: dict[str, str]  # "kind" or "mtp:kind" -> NVFP4 | NVFP4A16 | NVFP4-CT | MXFP8; default BF16
    mixed_algos: dict[str, str]  # MIXED_PRECISION: storage -> declared quant_algo
    has_mtp: bool
    mtp_in_ignore: bool  # flat configs: does `ignore` list the predictor layer (HF spelling)?
    kv_fp8: bool

    def format_for(self, kind: str, mtp: bool) -> str:
        if mtp and f"mtp:{kind}" in self.storage:
            return self.storage[f"mtp:{kind}"]
        return self.storage.get(kind, "BF16")


# Storage per variant, from the specification (see each variant.toml's `assumptions`). NVFP4 carries
# an input_scale (A4 calibration); NVFP4A16 is weight-only.
LAYOUTS = {
    "nvidia-nvfp4": Layout(
        "nvidia-nvfp4", "modelopt", "NVFP4",
        {"routed_expert": "NVFP4", "dense_mlp": "NVFP4", "mtp:routed_expert": "BF16"}, {},
        has_mtp=True, mtp_in_ignore=False, kv_fp8=True,
    ),
    "libertai": Layout(
        "libertai", "modelopt", "W4A16_NVFP4",
        {"routed_expert": "NVFP4A16", "shared_expert": "NVFP4A16", "dense_mlp": "NVFP4A16"}, {},
        has_mtp=True, mtp_in_ignore=True, kv_fp8=False,
    ),
    "redhat": Layout(
        "redhat", "compressed-tensors", "nvfp4-pack-quantized",
        {"routed_expert": "NVFP4-CT", "dense_mlp": "NVFP4-CT"}, {},
        has_mtp=False, mtp_in_ignore=False, kv_fp8=False,
    ),
    "lab": Layout(
        "lab", "modelopt", "MIXED_PRECISION",
        {"routed_expert": "NVFP4", "mtp:routed_expert": "MXFP8"},
        {"NVFP4": "NVFP4", "MXFP8": "MXFP8"},
        has_mtp=True, mtp_in_ignore=False, kv_fp8=False,
    ),
    "4p67": Layout(
        "4p67", "modelopt", "MIXED_PRECISION",
        {
            "routed_expert": "NVFP4", "mtp:routed_expert": "NVFP4A16", "attention": "MXFP8",
            "indexer": "MXFP8", "shared_expert": "MXFP8",
        },
        # The routed experts ship A4 input scales but are declared weight-only (seed 002).
        {"NVFP4": "W4A16_NVFP4", "NVFP4A16": "W4A16_NVFP4", "MXFP8": "MXFP8"},
        has_mtp=True, mtp_in_ignore=False, kv_fp8=False,
    ),
}


@dataclass(frozen=True)
class Linear:
    """A linear module (out, in) stored in `fmt`, or a plain parameter when `dtype` is set."""

    name: str
    kind: str
    mtp: bool
    shape: tuple[int, ...]
    fmt: str = "BF16"
    dtype: str | None = None  # set for non-linear parameters (norms, conv taps, biases ...)


def _is_kda(layer: int) -> bool:
    return layer % 4 != 3  # Glm5NextTextConfig: layer_types default, every fourth layer is MLA


def modules(layout: Layout, d: Dims) -> list[Linear]:
    """Every stored module of the variant's checkpoint, in index order."""
    out: list[Linear] = []

    def lin(name: str, kind: str, mtp: bool, o: int, i: int) -> None:
        out.append(Linear(name, kind, mtp, (o, i), layout.format_for(kind, mtp)))

    def par(name: str, kind: str, mtp: bool, shape: tuple[int, ...], dtype: str) -> None:
        out.append(Linear(name, kind, mtp, shape, dtype=dtype))

    H, lin_proj = d.hidden, d.lin_heads * d.lin_head_dim
    par(f"{PREFIX}.embed_tokens.weight", "embedding", False, (d.vocab, H), "BF16")
    last = d.layers + (d.mtp_layers if layout.has_mtp else 0)
    for layer in range(last):
        mtp = layer >= d.layers
        p = f"{PREFIX}.layers.{layer}"
        par(f"{p}.input_layernorm.weight", "norm", mtp, (H,), "BF16")
        par(f"{p}.post_attention_layernorm.weight", "norm", mtp, (H,), "BF16")
        if not mtp:
            mix = (2 + d.hc_mult) * d.hc_mult
            for which in ("attn", "ffn"):
                par(f"{p}.hc_{which}_fn", "hyper_connection", mtp, (mix, d.hc_mult * H), "F32")
                par(f"{p}.hc_{which}_base", "hyper_connection", mtp, (mix,), "F32")
                par(f"{p}.hc_{which}_scale", "hyper_connection", mtp, (3,), "F32")
        a = f"{p}.self_attn"
        if _is_kda(layer) and not mtp:
            shapes = {
                "q_proj": (lin_proj, H), "k_proj": (lin_proj, H), "v_proj": (lin_proj, H),
                "b_proj": (d.lin_heads, H), "f_a_proj": (d.lin_head_dim, H), "g_a_proj": (d.lin_head_dim, H),
                "f_b_proj": (lin_proj, d.lin_head_dim), "g_b_proj": (lin_proj, d.lin_head_dim),
                "o_proj": (H, lin_proj),
            }
            for proj in KDA_LINEARS:
                lin(f"{a}.{proj}", "attention", mtp, *shapes[proj])
            for tap in ("q_conv1d", "k_conv1d", "v_conv1d"):
                par(f"{a}.{tap}.weight", "attention", mtp, (lin_proj, d.conv), "F32")  # fp32 taps
            par(f"{a}.dt_bias", "attention", mtp, (lin_proj,), "F32")
            par(f"{a}.A_log", "attention", mtp, (d.lin_heads,), "F32")
            par(f"{a}.o_norm.weight", "attention", mtp, (d.lin_head_dim,), "BF16")
        else:
            shapes = {
                "q_a_proj": (d.q_lora, H), "q_b_proj": (d.heads * d.qk_nope, d.q_lora),
                "kv_a_proj_with_mqa": (d.kv_lora, H), "kv_b_proj": (d.heads * (d.qk_nope + d.v_head), d.kv_lora),
                "o_proj": (H, d.heads * d.v_head),
            }
            for proj in MLA_LINEARS:
                lin(f"{a}.{proj}", "attention", mtp, *shapes[proj])
            par(f"{a}.q_a_layernorm.weight", "attention", mtp, (d.q_lora,), "BF16")
            par(f"{a}.kv_a_layernorm.weight", "attention", mtp, (d.kv_lora,), "BF16")
            x = f"{a}.indexer"
            lin(f"{x}.wq_b", "indexer", mtp, d.idx_heads * d.idx_head_dim, d.q_lora)
            lin(f"{x}.wk", "indexer", mtp, d.idx_head_dim, H)
            lin(f"{x}.weights_proj", "indexer", mtp, d.idx_heads, H)
            par(f"{x}.k_norm.weight", "indexer", mtp, (d.idx_head_dim,), "F32")
            par(f"{x}.k_norm.bias", "indexer", mtp, (d.idx_head_dim,), "F32")
            par(f"{x}.index_kpool_compress_ape", "indexer", mtp, (d.kpool, d.idx_head_dim), "F32")
            par(f"{x}.index_kpool_compress_gate", "indexer", mtp, (d.idx_head_dim, H), "BF16")
        m = f"{p}.mlp"
        if layer < d.dense_layers:
            for proj, shape in (("gate_proj", (d.dense_inter, H)), ("up_proj", (d.dense_inter, H)),
                                ("down_proj", (H, d.dense_inter))):
                lin(f"{m}.{proj}", "dense_mlp", mtp, *shape)
        else:
            par(f"{m}.gate.weight", "router", mtp, (d.experts, H), "BF16")
            par(f"{m}.gate.e_score_correction_bias", "router", mtp, (d.experts,), "F32")
            for proj, shape in (("gate_proj", (d.moe_inter, H)), ("up_proj", (d.moe_inter, H)),
                                ("down_proj", (H, d.moe_inter))):
                lin(f"{m}.shared_experts.{proj}", "shared_expert", mtp, *shape)
            for e in range(d.experts):
                for proj, shape in (("gate_proj", (d.moe_inter, H)), ("up_proj", (d.moe_inter, H)),
                                    ("down_proj", (H, d.moe_inter))):
                    lin(f"{m}.experts.{e}.{proj}", "routed_expert", mtp, *shape)
        if mtp:
            out.append(Linear(f"{p}.eh_proj", "mtp_head", mtp, (H, 2 * H)))  # nn.Linear: never quantized
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                par(f"{p}.{norm}.weight", "mtp_head", mtp, (H,), "BF16")
    par(f"{PREFIX}.norm.weight", "norm", False, (H,), "BF16")
    par("lm_head.weight", "lm_head", False, (d.vocab, H), "BF16")
    v = d.vision_hidden
    par("model.visual.patch_embed.proj.weight", "vision", False, (v, 3 * 2 * 14 * 14), "BF16")
    for b in range(d.vision_blocks):
        q = f"model.visual.blocks.{b}"
        for norm in ("norm1", "norm2"):
            par(f"{q}.{norm}.weight", "vision", False, (v,), "BF16")
        for name, shape in (("attn.qkv", (3 * v, v)), ("attn.proj", (v, v)), ("mlp.gate_proj", (4 * v, v)),
                            ("mlp.up_proj", (4 * v, v)), ("mlp.down_proj", (v, 4 * v))):
            par(f"{q}.{name}.weight", "vision", False, shape, "BF16")
    par("model.visual.merger.proj.weight", "vision", False, (H, v), "BF16")
    return out


def tensor_headers(module: Linear) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype, shape) of one stored module."""
    if module.dtype is not None:
        return {module.name: (module.dtype, module.shape)}
    o, i = module.shape
    n = module.name
    if module.fmt == "BF16":
        return {f"{n}.weight": ("BF16", (o, i))}
    if module.fmt in ("NVFP4", "NVFP4A16"):
        out = {
            f"{n}.weight": ("U8", (o, i // 2)),
            f"{n}.weight_scale": ("F8_E4M3", (o, i // 16)),
            f"{n}.weight_scale_2": ("F32", ()),
        }
        if module.fmt == "NVFP4":
            out[f"{n}.input_scale"] = ("F32", ())
        return out
    if module.fmt == "NVFP4-CT":
        return {
            f"{n}.weight_packed": ("U8", (o, i // 2)),
            f"{n}.weight_scale": ("F8_E4M3", (o, i // 16)),
            f"{n}.weight_global_scale": ("F32", (1,)),
            f"{n}.input_global_scale": ("F32", (1,)),
        }
    if module.fmt == "MXFP8":
        return {f"{n}.weight": ("F8_E4M3", (o, i)), f"{n}.weight_scale": ("U8", (o, i // 32))}
    raise PatchkitError(f"no storage rule for format {module.fmt!r} ({n})")


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
                raise PatchkitError(f"no config rule for {cfg['quant_algo']}")
            group["targets"] = sorted(names)
            out["config_groups"][f"group_{idx}"] = group
        out["quantized_layers"] = q["quantized_layers"]
    else:
        raise PatchkitError(f"no config rule for quant_algo {algo}")
    out["ignore"] = q.get("exclude_modules") or []
    out["quant_algo"] = algo
    if q.get("kv_cache_quant_algo") == "FP8":
        out["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"}
    out["producer"] = hf_quant["producer"]
    out["quant_method"] = "modelopt"
    return out


def compressed_tensors_config() -> dict:
    """An NVFP4 W4A4 compressed-tensors quantization_config (as compressed-tensors 0.17 serializes it):
    Linear layers quantized except the BF16 parts named in `ignore`."""
    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": dict(scheme, dynamic=False, observer="minmax"),
                "input_activations": dict(scheme, dynamic="local", observer="minmax"),
                "format": "nvfp4-pack-quantized",
            }
        },
        "ignore": ["lm_head", "re:.*mlp\\.gate$", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*visual.*",
                   "re:.*eh_proj$"],
    }


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
    from patchkit.variants.checkpoint import DTYPE_BITS

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


# ---------------------------------------------------------------- Part 2: packing (reference code)


SRC = Path(__file__).resolve().parents[3]  # the directory holding the patchkit package
INPUT_SCALE = 0.5 / (6 * 448)  # a calibrated static activation scale: amax 0.5 over e2m1 max x e4m3 max


def _pack(variant: str, out: Path) -> None:
    """Worker, in the ModelOpt environment: write the tiny checkpoint with really packed tensors.

    NVFP4 and MXFP8 come from ModelOpt's NVFP4QTensor / MXFP8QTensor, config.json's quantization_config
    from ModelOpt's convert_hf_quant_config_format; the RedHat format from compressed-tensors'
    NVFP4PackedCompressor and QuantizationConfig."""
    import torch
    from safetensors.torch import save_file

    layout = LAYOUTS[variant]
    mods = modules(layout, TINY_DIMS)
    gen = torch.Generator().manual_seed(0)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    tensors: dict[str, torch.Tensor] = {}
    for m in mods:
        if m.dtype is not None:
            tensors[m.name] = torch.randn(m.shape, generator=gen).to(dtypes[m.dtype])
            continue
        w = (torch.randn(m.shape, generator=gen) * 0.02).to(torch.bfloat16)
        tensors.update(_quantize(m, w))
    out.mkdir(parents=True, exist_ok=True)
    # Two shards, modules kept whole, as real exports do.
    names = list(tensors)
    half = len(names) // 2
    while half < len(names) and names[half].rsplit(".", 1)[0] == names[half - 1].rsplit(".", 1)[0]:
        half += 1
    weight_map = {}
    for i, chunk in enumerate((names[:half], names[half:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in chunk}, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = config_json(layout, TINY_DIMS, mods)
    if layout.fmt == "modelopt":
        from modelopt.torch.export.convert_hf_config import (
            convert_hf_quant_config_format,
        )

        hf_quant = hf_quant_config(layout, TINY_DIMS, mods)
        config["quantization_config"] = convert_hf_quant_config_format(hf_quant)
        (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2))
    else:
        from compressed_tensors.quantization import QuantizationConfig

        # Validated and re-serialized by the library itself.
        config["quantization_config"] = QuantizationConfig.model_validate(compressed_tensors_config()).model_dump(
            mode="json", exclude_none=True
        ) | {"quant_method": "compressed-tensors"}
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _quantize(m: Linear, w):
    import torch

    n = m.name
    if m.fmt == "BF16":
        return {f"{n}.weight": w}
    if m.fmt in ("NVFP4", "NVFP4A16"):
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

        q, scale, scale2 = NVFP4QTensor.quantize(w, block_size=16)
        out = {f"{n}.weight": q._quantized_data, f"{n}.weight_scale": scale, f"{n}.weight_scale_2": scale2.reshape(())}
        if m.fmt == "NVFP4":
            out[f"{n}.input_scale"] = torch.tensor(INPUT_SCALE, dtype=torch.float32)
        return out
    if m.fmt == "MXFP8":
        from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor

        q, scale = MXFP8QTensor.quantize(w)
        return {f"{n}.weight": q._quantized_data, f"{n}.weight_scale": scale}
    if m.fmt == "NVFP4-CT":
        from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
        from compressed_tensors.quantization import preset_name_to_scheme

        scheme = preset_name_to_scheme("NVFP4", ["Linear"])
        wf = w.float()
        global_scale = (448.0 * 6.0) / wf.abs().max()  # compressed-tensors' convention: the reciprocal
        block_amax = wf.view(wf.shape[0], -1, 16).abs().amax(-1)
        scale = (block_amax / 6.0 * global_scale).clamp(min=2**-9).to(torch.float8_e4m3fn).float() / global_scale
        state = {"weight": wf, "weight_scale": scale, "weight_global_scale": global_scale.reshape(1),
                 "input_global_scale": torch.tensor([1.0 / INPUT_SCALE])}
        packed = NVFP4PackedCompressor.compress(state, scheme)
        return {f"{n}.{k}": v for k, v in packed.items()}
    raise PatchkitError(f"no packing for format {m.fmt!r}")


def _run_worker(python: str, args: list[str], pythonpath: list[Path], timeout: int) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath), VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run([python, "-m", "patchkit.variants.smoke.cpu", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise PatchkitError(f"smoke worker {args[0]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


# ---------------------------------------------------------------- Part 3: resolution through vLLM


def probe_prefixes(layout: Layout, d: Dims) -> list[tuple[str, str, str, str]]:
    """(layer class, vLLM prefix, checkpoint module whose storage it loads, how vLLM builds it) for every
    quantizable layer. `built`: "model" = constructed with the model's quant config; "attention" = a
    KDA/MLA/indexer projection, constructed with whatever config the tree passes those constructors;
    "none" = the indexer's fused wk_weights_proj, constructed with quant_config=None in every tree."""
    rows = []
    last = d.layers + (d.mtp_layers if layout.has_mtp else 0)
    for layer in range(last):
        mtp = layer >= d.layers
        vp = f"model.layers.{layer}" if mtp else f"language_model.model.layers.{layer}"
        hp = f"{PREFIX}.layers.{layer}"
        a = "attention"
        if _is_kda(layer) and not mtp:
            rows += [("LinearBase", f"{vp}.self_attn.in_proj_qkvbfg_a", f"{hp}.self_attn.q_proj", a)]
            rows += [("LinearBase", f"{vp}.self_attn.{p}", f"{hp}.self_attn.{p}", a) for p in ("f_b_proj", "g_b_proj", "o_proj")]
        else:
            rows += [("LinearBase", f"{vp}.self_attn.fused_qkv_a_proj", f"{hp}.self_attn.q_a_proj", a)]
            rows += [("LinearBase", f"{vp}.self_attn.{p}", f"{hp}.self_attn.{p}", a) for p in ("q_b_proj", "kv_b_proj", "o_proj")]
            rows += [("LinearBase", f"{vp}.self_attn.indexer.wq_b", f"{hp}.self_attn.indexer.wq_b", a),
                     ("LinearBase", f"{vp}.self_attn.indexer.wk_weights_proj", f"{hp}.self_attn.indexer.wk", "none")]
        if layer < d.dense_layers:
            rows += [("LinearBase", f"{vp}.mlp.gate_up_proj", f"{hp}.mlp.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.down_proj", f"{hp}.mlp.down_proj", "model")]
        else:
            rows += [("RoutedExperts", f"{vp}.mlp.experts", f"{hp}.mlp.experts.0.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.shared_experts.gate_up_proj", f"{hp}.mlp.shared_experts.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.shared_experts.down_proj", f"{hp}.mlp.shared_experts.down_proj", "model")]
    rows.append(("LinearBase", "language_model.lm_head", "lm_head", "model"))
    return rows


def _probe(jobs: list[dict]) -> list[list[dict]]:
    """Worker, in the vLLM environment (stock or patched tree first on sys.path): resolve every prefix.

    Runs vLLM's own code: the method vLLM's override rule picks for this quantization_config
    (`override_quantization_method`, as ModelConfig._verify_quantization does), the config class's
    `from_config`, `configure_quant_config` with the real model classes in the order the loader
    builds them (Glm5NextForConditionalGeneration, its inner Glm5NextForCausalLM, then the Glm5NextMTP
    draft, which reuses the target's config object), the config the tree hands the KDA/MLA constructors
    (the patched tree's `glm5next_layer_quant_config`; upstream passes None, kda.py ~213, model.py
    ~408), then the exclusion and per-layer resolution `get_quant_method` applies. It stops there:
    layers are not constructed (their MoE kernels need CUDA), so no weight loader runs."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.models.glm5next import (
        Glm5NextForCausalLM,
        Glm5NextForConditionalGeneration,
        Glm5NextMTP,
    )
    from vllm.models.glm5next.common import model as glm

    results = []
    for job in jobs:
        config = json.loads((Path(job["checkpoint"]) / "config.json").read_text())
        # A dict-valued --hf-overrides replaces the attribute whole (ModelConfig._apply_dict_overrides).
        config.update(job["overrides"])
        quant, method = config["quantization_config"], job["method"]
        cls = get_quantization_config(method)
        chosen = cls.override_quantization_method(quant, method) or quant["quant_method"]
        if chosen != method:
            raise PatchkitError(f"vLLM resolves {job['checkpoint']} to {chosen!r}, not {method!r}")
        qc = cls.from_config(quant)
        classes = (Glm5NextForConditionalGeneration, Glm5NextForCausalLM) + ((Glm5NextMTP,) if job["speculative"] else ())
        for model_class in classes:
            configure_quant_config(qc, model_class)
        layer_qc = glm.glm5next_layer_quant_config(qc) if hasattr(glm, "glm5next_layer_quant_config") else None
        rows = []
        for layer, prefix, module, built in job["prefixes"]:
            given = {"model": qc, "attention": layer_qc, "none": None}[built]
            algo = "None" if given is None else _algo(given, method, layer, prefix)
            rows.append({"layer": layer, "prefix": prefix, "module": module, "built": built, "algo": algo})
        results.append(rows)
    return results


def _algo(qc, method: str, layer: str, prefix: str) -> str:
    """The algorithm get_quant_method would build `prefix` with, or "None" (unquantized)."""
    if method == "compressed-tensors":
        from vllm.model_executor.layers.linear import RowParallelLinear
        from vllm.model_executor.layers.quantization.compressed_tensors.utils import (
            find_matched_target,
            should_ignore_layer,
        )
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        if should_ignore_layer(prefix, ignore=qc.ignore, fused_mapping=qc.packed_modules_mapping):
            return "None"
        # Targets match by layer name or by the module's class name ("Linear" is contained in every
        # LinearBase subclass's name, not in ParallelLMHead's); routed experts are Linear modules in the
        # checkpoint. Only the class name is read, so an uninitialised instance stands for the layer.
        cls = ParallelLMHead if prefix.endswith("lm_head") else RowParallelLinear
        target = find_matched_target(prefix, object.__new__(cls), qc.target_scheme_map, qc.packed_modules_mapping)
        if target is None:
            return "None"
        return "NVFP4" if qc.quant_format == "nvfp4-pack-quantized" else str(qc.quant_format)
    if qc.is_layer_excluded(prefix):
        return "None"
    if method == "modelopt_mixed":
        algo = qc._resolve_quant_algo(prefix)
        return "None" if algo is None else algo
    return qc.quant_method


def quantprobe(jobs: list[dict], python: str, vllm_root: Path | None = None, timeout: int = 900) -> list[list[dict]]:
    """Quantprobe tables for several checkpoints in one interpreter of the vLLM tree at `vllm_root`
    (None: `python`'s own vLLM). A job: checkpoint, method, speculative, overrides, prefixes."""
    import tempfile

    path = [p for p in (vllm_root, SRC) if p is not None]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:  # too long for a command line
        json.dump(jobs, fh)
        fh.flush()
        out = _run_worker(python, ["probe", fh.name], path, timeout)
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------- the smoke


# Resolved algorithm -> storage formats its loader reads (the same table preflight uses).
LOADS = {"NVFP4": {"NVFP4", "NVFP4-CT"}, "W4A16_NVFP4": {"NVFP4", "NVFP4A16"}, "MXFP8": {"MXFP8"}, "None": {"BF16"}}


@dataclass
class SmokeReport:
    variant: str
    vllm: str
    rows: list[dict]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        return json.dumps({"variant": self.variant, "vllm": self.vllm, "ok": self.ok, "problems": self.problems,
                           "rows": self.rows}, indent=2)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"quantprobe {self.variant} on {self.vllm}")
        for col in ("layer", "prefix", "algo", "stored", "expected"):
            table.add_column(col)
        for r in self.rows:
            if r.get("expected") or r["algo"] != "None" or r["stored"] != "BF16":
                mark = "" if r.get("verdict", "ok") == "ok" else "[red]"
                table.add_row(r["layer"], r["prefix"], f"{mark}{r['algo']}", r["stored"], r.get("expected") or "")
        lines = [f"[red]✗ {p}[/red]" for p in self.problems] or ["[green]every layer resolves to what its weights need[/green]"]
        return Group(table, *lines)


def _job(variant, workdir: Path, exclude_mtp: bool | None = None) -> tuple[dict, dict[str, str]]:
    """Identity, then the serve override from the verified config, then the stored formats: the same
    path serve-args takes. `exclude_mtp=False` withholds the override (to show what it fixes)."""
    from patchkit.variants.checkpoint import (
        inventory,
        read_headers,
        sha256_bytes,
        verify_identity,
    )
    from patchkit.variants.definitions import Pins
    from patchkit.variants.mtp_ignore import hf_overrides

    ckpt = workdir / variant.name
    pins = Pins(sha256_bytes((ckpt / "config.json").read_bytes()), sha256_bytes((ckpt / "model.safetensors.index.json").read_bytes()))
    verified = verify_identity(ckpt, pins)
    exclude = variant.checkpoint.exclude_mtp_from_quant if exclude_mtp is None else exclude_mtp
    overrides = (hf_overrides(verified.config) or {}) if exclude else {}
    stored = {m.name: m.format for m in inventory(read_headers(verified), TINY_DIMS.layers).modules.values()}
    job = {
        "checkpoint": str(ckpt), "method": variant.quantization, "speculative": variant.serve.speculative is not None,
        "overrides": overrides, "prefixes": probe_prefixes(LAYOUTS[variant.name], TINY_DIMS),
    }
    return job, stored


def build_checkpoints(names: list[str], workdir: Path, modelopt_python: str, timeout: int = 1800) -> None:
    """Pack every named variant's tiny checkpoint not yet in `workdir`, in one ModelOpt interpreter."""
    missing = [n for n in names if not (workdir / n / "config.json").exists()]
    for name in missing:
        if name not in LAYOUTS:
            raise PatchkitError(f"no synthetic layout for variant {name!r}; known: {', '.join(LAYOUTS)}")
    if missing:
        _run_worker(modelopt_python, ["pack", str(workdir), *missing], [SRC], timeout)


def judge(variant, rows: list[dict], stored: dict[str, str], label: str) -> SmokeReport:
    """Compare the resolved table with the variant's expected rows and with what the weights need."""
    expected = {r.prefix: r for r in variant.expect.quantprobe}
    problems = []
    for row in rows:
        row["stored"] = stored.get(row["module"], "absent")
        want = expected.pop(row["prefix"], None)
        row["expected"] = want.algo if want else None
        verdicts = []
        if want and (want.layer, want.algo) != (row["layer"], row["algo"]):
            verdicts.append(f"expected {want.algo}")
        # The indexer's fused wk_weights_proj is always built BF16; its loader (not run here) decides
        # whether quantized wk/weights_proj tensors are dequantized into it (patched) or not (stock).
        if row["built"] != "none" and row["stored"] not in LOADS.get(row["algo"], set()):
            verdicts.append(f"weights stored {row['stored']} cannot load as {row['algo']}")
        row["verdict"] = "; ".join(verdicts) or "ok"
        if verdicts:
            problems.append(f"{row['prefix']}: resolves to {row['algo']}: {row['verdict']}")
    for prefix in expected:
        problems.append(f"{prefix}: expected by the variant but not a layer of the checkpoint")
    return SmokeReport(variant.name, label, rows, problems)


def smoke_cpu(
    variants: list, workdir: Path, modelopt_python: str, vllm_python: str, vllm_root: Path | None = None,
    label: str = "",
) -> list[SmokeReport]:
    """`patchkit smoke --cpu`: tiny checkpoints packed by the reference code, resolved through the vLLM
    tree at `vllm_root` (None: `vllm_python`'s own), each judged against its variant."""
    build_checkpoints([v.name for v in variants], workdir, modelopt_python)
    jobs = [_job(v, workdir) for v in variants]
    tables = quantprobe([job for job, _ in jobs], vllm_python, vllm_root)
    name = label or str(vllm_root or vllm_python)
    return [judge(v, rows, stored, name) for v, rows, (_, stored) in zip(variants, tables, jobs)]


def _main(argv: list[str]) -> int:
    if argv[:1] == ["pack"] and len(argv) >= 3:
        for name in argv[2:]:
            _pack(name, Path(argv[1]) / name)
        return 0
    if argv[:1] == ["probe"] and len(argv) == 2:
        print(json.dumps(_probe(json.loads(Path(argv[1]).read_text()))))
        return 0
    print("usage: python -m patchkit.variants.smoke.cpu pack WORKDIR VARIANT... | probe JOBS.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
