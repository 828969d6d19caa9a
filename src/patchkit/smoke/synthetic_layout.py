"""A GLM-5.3-Flash checkpoint as stored, for each variant's quantization layout, at any size.

The real tensor names (`model.language_model.layers.N...`, HF spelling), dtypes and shapes: `REAL_DIMS`
reproduces the real model's ~147,000 tensors and ~204 GB, `TINY_DIMS` keeps the same names with widths
of a few dozen (what the CPU smoke packs). Standard library only: it also runs inside the ModelOpt and
vLLM environments as part of the smoke's workers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from patchkit.errors import PatchkitError


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
    quant_algo: str  # ModelOpt's quant_algo; compressed-tensors: the top-level format
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
    # The public record (synthetic_config.REDHAT_QUANTIZATION_CONFIG): NVFP4 W4A4 (compressed-tensors
    # packed, with input_global_scale) on the routed experts of layers 3-44 only, everything else BF16; no
    # MTP layer in what vLLM loads (its weights ship outside the index).
    "redhat": Layout(
        "redhat", "compressed-tensors", "mixed-precision",
        {"routed_expert": "NVFP4-CT"}, {},
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
        # The routed experts ship A4 input scales but are declared weight-only (field records "The 4p67 recipe").
        {"NVFP4": "W4A16_NVFP4", "NVFP4A16": "W4A16_NVFP4", "MXFP8": "MXFP8"},
        has_mtp=True, mtp_in_ignore=False, kv_fp8=False,
    ),
}


class NoSyntheticLayout(PatchkitError):
    """The CPU smoke was asked for `variant`, for which it has no tiny checkpoint layout; the `known` ones
    are LAYOUTS' (exit 2)."""

    def __init__(self, variant: str, known: tuple[str, ...]):
        self.variant, self.known = variant, known
        super().__init__(f"no synthetic layout for variant {variant!r}; known: {', '.join(known)}")


@dataclass(frozen=True)
class Linear:
    """A linear module (out, in) stored in `fmt`, or a plain parameter when `dtype` is set."""

    name: str
    kind: str
    mtp: bool
    shape: tuple[int, ...]
    fmt: str = "BF16"
    dtype: str | None = None  # set for non-linear parameters (norms, conv taps, biases ...)


def is_kda(layer: int) -> bool:
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
        if is_kda(layer) and not mtp:
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
    raise PatchkitError(f"no storage rule for format {module.fmt!r} ({n}) (a patchkit bug: please report it; the "
                        "synthetic layouts use only these)")
