"""A checkpoint as stored: identity pins, safetensors headers, and what the tensors are.

Order matters. `verify_identity` hashes `config.json` and `model.safetensors.index.json` and parses the
very bytes it hashed, only after both match their pins: nothing unverified is ever parsed, and a file
swapped between hashing and reading cannot slip through. Shard headers are read only for the shards the
verified index names, and every tensor the index lists must be in its shard (and nothing else).

Headers are parsed by hand, not through `safetensors.safe_open`: a header is an 8-byte little-endian
length and that much JSON, and reading exactly those bytes never touches tensor data. `safe_open`
mmaps the whole shard and refuses a file shorter than its offsets claim, which is exactly the
header-only dump (just the 8 + N bytes of each shard) that lets a user preflight a 200 GB checkpoint
they have not downloaded. The parse is as strict as the library's: offsets contiguous from 0, each
tensor's byte length equal to its dtype times its shape, no holes.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import msgspec

from patchkit.errors import PatchkitError
from patchkit.jsondata import MalformedJson, decode, load_json_object
from patchkit.untrusted import InputTooLarge, limit_of, open_regular, read_file
from patchkit.variants.definitions import Pins
from patchkit.checkpoint.shapes import TensorEntry, conform

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# Where each file's bytes are bounded (patchkit.untrusted.LIMITS).
KINDS = {CONFIG: "config", INDEX: "checkpoint-index"}

# Bits per element of every dtype safetensors 0.8 writes (F4 is e2m1, stored two to a byte).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def scalar(self) -> bool:
        return math.prod(self.shape) == 1


@dataclass(frozen=True)
class ShardHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    data_bytes: int
    header_only: bool  # the file holds the header and no tensor data (a header dump)


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """config.json and the index, parsed from the exact bytes whose SHA-256 matched the pins."""

    root: Path
    config: dict
    index: dict
    config_sha256: str
    index_sha256: str


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_checkpoint_file(root: Path, name: str) -> bytes:
    """The bytes of config.json or the index: a regular file within its kind's limit, never a FIFO's wait."""
    path = root / name
    if not path.exists() and not path.is_symlink():
        raise PatchkitError(f"checkpoint {root} has no {name}")
    return read_file(path, KINDS[name])


def verify_identity(root: Path, pins: Pins) -> VerifiedCheckpoint:
    """Hash, compare, then parse config.json and the index; PatchkitError on any mismatch."""
    if not pins.complete:
        raise PatchkitError("identity check needs both pins (config.json and index); refusing an unpinned check")
    if not root.is_dir():
        raise PatchkitError(f"checkpoint {root} is not a directory")
    parsed = {}
    digests = {}
    for name, pin in ((CONFIG, pins.config_sha256), (INDEX, pins.index_sha256)):
        data = read_checkpoint_file(root, name)
        digest = sha256_bytes(data)
        if digest != pin:
            raise PatchkitError(f"{root / name}: sha256 {digest} does not match the pin {pin}; refusing to read it")
        digests[name] = digest
        parsed[name] = data
    config = load_json_object(parsed[CONFIG], str(root / CONFIG))
    index = load_json_object(parsed[INDEX], str(root / INDEX))
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PatchkitError(f"{root / INDEX}: no weight_map")
    conform(weight_map, dict[str, str], str(root / INDEX), "$.weight_map")
    for tensor, shard in weight_map.items():
        if "/" in shard or not shard.endswith(".safetensors"):
            raise PatchkitError(f"{root / INDEX}: tensor {tensor!r} maps to an invalid shard name {shard!r}")
    return VerifiedCheckpoint(root, config, index, digests[CONFIG], digests[INDEX])


def _header_bytes(path: Path) -> tuple[int, bytes, int]:
    """(N, the N header bytes, the file's size): the 8-byte prefix is checked against the header limit and
    the file's own size before a byte of the header is read."""
    what = f"shard {path}"
    if not path.exists() and not path.is_symlink():
        raise PatchkitError(f"shard {path} is missing")
    with open_regular(path, "safetensors-shard", what) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) != 8:
                raise PatchkitError(f"{path}: shorter than the 8-byte safetensors length prefix")
            (length,) = struct.unpack("<Q", prefix)
            limit = limit_of("safetensors-header")
            if length > limit:
                raise InputTooLarge(f"{path}: header length prefix", "safetensors-header", limit, length)
            if 8 + length > size:
                raise PatchkitError(f"{path}: header truncated: the prefix says {length:,} B, the file holds "
                                    f"{size - 8:,} after it")
            raw = fh.read(length)
        except OSError as exc:
            raise PatchkitError(f"{what}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) != length:
        raise PatchkitError(f"{path}: header truncated ({len(raw)} of {length} bytes)")
    return length, raw, size


def _entry(raw: msgspec.Raw, path: Path, name: str) -> TensorEntry:
    try:
        return decode(raw, TensorEntry, str(path))
    except MalformedJson as exc:
        what = "malformed entry" if exc.at == "$" else "invalid shape or offsets"
        raise MalformedJson(str(path), f"tensor {name!r} has a {what}: {exc.problem}", exc.at) from None


def read_header(path: Path) -> ShardHeader:
    """Parse one safetensors header (8 + N bytes read, nothing more) and validate its layout."""
    length, raw, size = _header_bytes(path)
    header = decode(raw, dict[str, msgspec.Raw], f"{path}: header")
    header.pop("__metadata__", None)
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, raw_entry in header.items():
        entry = _entry(raw_entry, path, name)
        dtype, shape, (begin, end) = entry.dtype, tuple(entry.shape), entry.data_offsets
        bits = DTYPE_BITS.get(dtype)
        if bits is None:
            raise PatchkitError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        if begin > end:
            raise PatchkitError(f"{path}: tensor {name!r} has an invalid shape or offsets: {begin} > {end}")
        nbytes = (math.prod(shape) * bits + 7) // 8
        if end - begin != nbytes:
            raise PatchkitError(
                f"{path}: tensor {name!r} spans {end - begin} bytes but {dtype} {list(shape)} needs {nbytes}"
            )
        tensors[name] = TensorInfo(dtype, shape, nbytes)
        spans.append((begin, end, name))
    spans.sort()
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise PatchkitError(f"{path}: tensor {name!r} starts at {begin}, expected {cursor} (hole or overlap)")
        cursor = end
    expected = 8 + length + cursor
    if size == expected:
        header_only = False
    elif size == 8 + length and cursor > 0:
        header_only = True
    else:
        raise PatchkitError(
            f"{path}: file is {size} bytes; the header describes {expected} (or {8 + length} for a header dump)"
        )
    return ShardHeader(path, tensors, cursor, header_only)


def read_headers(checkpoint: VerifiedCheckpoint) -> dict[str, ShardHeader]:
    """Headers of every shard the verified index names, cross-checked against the index both ways."""
    by_shard: dict[str, set[str]] = defaultdict(set)
    for tensor, shard in checkpoint.index["weight_map"].items():
        by_shard[shard].add(tensor)
    headers = {}
    for shard in sorted(by_shard):
        header = read_header(checkpoint.root / shard)
        listed, present = by_shard[shard], set(header.tensors)
        if listed != present:
            missing, extra = sorted(listed - present), sorted(present - listed)
            raise PatchkitError(
                f"{header.path}: disagrees with the index: {len(missing)} listed tensors missing "
                f"{missing[:3]}, {len(extra)} unlisted tensors present {extra[:3]}"
            )
        headers[shard] = header
    return headers


# ---------------------------------------------------------------- inventory

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


# ---------------------------------------------------------------- per-rank memory

# Modules vLLM 0.33 builds replicated on every TP rank (the rest is split TP ways): the router
# (GateLinear is a ReplicatedLinear), MLA's fused q_a/kv_a projection (DeepSeekV2FusedQkvAProjLinear,
# disable_tp=True), the whole sparse indexer (ReplicatedLinear wq_b, wk_weights_proj disable_tp=True),
# KDA's f_a/g_a shards (replicated_shard_ids=(4, 5)), the MTP eh_proj (a plain nn.Linear), norms and
# hyper-connection parameters. Read from vllm/models/glm5next/common/{model,attention,kda,mtp}.py.
_REPLICATED_KINDS = frozenset({"router", "indexer", "norm", "hyper_connection", "mtp_head"})
_REPLICATED_ATTN = ("q_a_proj", "kv_a_proj_with_mqa", "f_a_proj", "g_a_proj", "q_a_layernorm", "kv_a_layernorm", "o_norm")


def per_rank_bytes(inv: Inventory, tp: int, language_model_only: bool) -> int:
    """Estimated weight bytes one rank holds at tensor parallel size `tp` (the vision tower is skipped
    when vLLM runs --language-model-only)."""
    if tp < 1:
        raise PatchkitError(f"tensor parallel size must be >= 1, got {tp}")
    total = 0
    for m in inv.modules.values():
        if m.kind == "vision" and language_model_only:
            continue
        last = m.name.rsplit(".", 1)[-1]
        replicated = m.kind in _REPLICATED_KINDS or (m.kind == "attention" and last in _REPLICATED_ATTN)
        total += m.nbytes if replicated else -(-m.nbytes // tp)
    return total
