"""What a checkpoint's tensors are: each module's kind (by its GLM-5.3 name) and storage format (by its
tensors' dtypes and shapes), from the shard headers alone."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from patchkit.checkpoint.headers import ShardHeader, TensorInfo

# A module's tensors share its name up to one of these suffixes. ModelOpt NVFP4: weight (U8 codes),
# weight_scale (E4M3 per 16 inputs), weight_scale_2 and input_scale (F32 0-d). compressed-tensors
# NVFP4: weight_packed, weight_scale, weight_global_scale, input_global_scale. MXFP8: weight (E4M3),
# weight_scale (U8 e8m0 per 32 inputs). Block FP8: weight_scale_inv. KV scales: k_scale, v_scale.
_SUFFIXES = (
    "weight", "weight_scale", "weight_scale_2", "input_scale", "weight_packed", "weight_global_scale",
    "input_global_scale", "weight_scale_inv", "k_scale", "v_scale", "bias",
)
# At most 9 digits: no model has 10^9 layers, and int() of a hostile 5,000-digit index is a ValueError.
_LAYER = re.compile(r"^(?:model\.language_model\.|language_model\.model\.|model\.)?layers\.(\d{1,9})\.(.+)$")
# What kind_of calls a module (a [needed_when] quantized rule names these).
KINDS = ("routed_expert", "shared_expert", "router", "dense_mlp", "indexer", "attention", "mtp_head",
         "hyper_connection", "norm", "lm_head", "embedding", "vision", "other")
# NVFP4 carries an input_scale (static A4 activations); NVFP4A16 is the weight-only form without one.
FORMATS = ("NVFP4", "NVFP4A16", "NVFP4-CT", "MXFP8", "FP8", "FP8-BLOCK", "BF16", "F16", "F32", "other")


@dataclass(frozen=True)
class Module:
    name: str
    kind: str
    layer: int | None
    format: str
    nbytes: int
    tensors: tuple[str, ...]


@dataclass
class Inventory:
    """Every module of the checkpoint with its storage format, from the headers alone."""

    modules: dict[str, Module]
    tensor_count: int
    total_bytes: int
    num_hidden_layers: int
    header_only_shards: int

    def formats(self, mtp: bool | None = None) -> Counter:
        """(kind, format) -> module count; mtp=True/False restricts to predictor/main layers."""
        return Counter(
            (m.kind, m.format) for m in self.modules.values() if mtp is None or self.is_mtp(m) == mtp
        )

    def is_mtp(self, module: Module) -> bool:
        return module.layer is not None and module.layer >= self.num_hidden_layers

    @property
    def mtp_layers(self) -> list[int]:
        return sorted({m.layer for m in self.modules.values() if m.layer is not None and self.is_mtp(m)})


def _split(name: str) -> tuple[str, str]:
    module, _, last = name.rpartition(".")
    if module and last in _SUFFIXES:
        return module, last
    return name, ""  # a bare parameter (A_log, dt_bias, hc_attn_fn, e_score_correction_bias ...)


def kind_of(module: str) -> tuple[str, int | None]:
    """What a checkpoint module is, by its name (GLM-5.3 naming, HF and text-only spellings)."""
    if module.startswith(("model.visual.", "visual.")):
        return "vision", None
    if module.endswith("lm_head") or ".shared_head.head" in module:
        return "lm_head", None
    if module.endswith("embed_tokens"):
        return "embedding", None
    match = _LAYER.match(module)
    if not match:
        return ("norm" if module.endswith("norm") else "other"), None
    layer, rest = int(match.group(1)), match.group(2)
    if rest.startswith("mlp.experts."):
        kind = "routed_expert"
    elif rest.startswith("mlp.shared_experts."):
        kind = "shared_expert"
    elif rest.startswith("mlp.gate"):
        kind = "router" if rest.split(".")[1] == "gate" else "dense_mlp"
    elif rest.startswith("mlp."):
        kind = "dense_mlp"
    elif rest.startswith("self_attn.indexer."):
        kind = "indexer"
    elif rest.startswith("self_attn."):
        kind = "attention"
    elif rest.startswith(("eh_proj", "enorm", "hnorm", "shared_head")):
        kind = "mtp_head"
    elif rest.startswith("hc_"):
        kind = "hyper_connection"
    elif rest.endswith("norm"):
        kind = "norm"
    else:
        kind = "other"
    return kind, layer


def format_of(parts: dict[str, TensorInfo]) -> str:
    """The storage format of one module from its tensors' dtypes and shapes."""
    weight, scale = parts.get("weight"), parts.get("weight_scale")
    if "weight_packed" in parts:
        packed = parts["weight_packed"]
        if (
            packed.dtype == "U8" and scale is not None and scale.dtype == "F8_E4M3"
            and "weight_global_scale" in parts and _groups(packed, scale, 8)
        ):
            return "NVFP4-CT"
        return "other"
    if weight is None:
        return "other"
    if weight.dtype == "U8" and scale is not None and scale.dtype == "F8_E4M3":
        # U8 codes hold two e2m1 values a byte; one e4m3 scale per 16 inputs = per 8 code bytes.
        scale2 = parts.get("weight_scale_2")
        if scale2 is not None and scale2.dtype == "F32" and scale2.scalar and _groups(weight, scale, 8):
            act = parts.get("input_scale")
            if act is None:
                return "NVFP4A16"
            return "NVFP4" if act.dtype == "F32" and act.scalar else "other"
        return "other"
    if weight.dtype == "F8_E4M3":
        if scale is not None and scale.dtype == "U8" and _groups(weight, scale, 32):
            return "MXFP8"
        if "weight_scale_inv" in parts:
            return "FP8-BLOCK"
        if scale is not None and scale.dtype == "F32":
            return "FP8"
        return "other"
    if scale is None and weight.dtype in ("BF16", "F16", "F32"):
        return weight.dtype
    return "other"


def _groups(weight: TensorInfo, scale: TensorInfo, per_scale: int) -> bool:
    """Does one scale cover `per_scale` stored elements of the weight's last axis?"""
    return (
        len(weight.shape) >= 2
        and weight.shape[:-1] == scale.shape[:-1]
        and scale.shape[-1] * per_scale == weight.shape[-1]
    )


def inventory(headers: dict[str, ShardHeader], num_hidden_layers: int) -> Inventory:
    """Group tensors into modules and classify each; fast enough for ~150,000 tensors (one pass)."""
    grouped: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    names: dict[str, list[str]] = defaultdict(list)
    count = total = 0
    for header in headers.values():
        for name, info in header.tensors.items():
            module, suffix = _split(name)
            grouped[module][suffix] = info
            names[module].append(name)
            count += 1
            total += info.nbytes
    modules = {}
    for module, parts in grouped.items():
        kind, layer = kind_of(module)
        if "" in parts:  # a bare parameter: its format is its dtype
            fmt = parts[""].dtype if parts[""].dtype in FORMATS else "other"
        else:
            fmt = format_of(parts)
        modules[module] = Module(
            module, kind, layer, fmt, sum(p.nbytes for p in parts.values()), tuple(sorted(names[module]))
        )
    return Inventory(
        modules=modules,
        tensor_count=count,
        total_bytes=total,
        num_hidden_layers=num_hidden_layers,
        header_only_shards=sum(h.header_only for h in headers.values()),
    )
