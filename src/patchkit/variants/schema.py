"""The schema of `images/<name>/variant.toml` (definitions.py documents the format and owns the rules
between fields: the quantization method against the checkpoint layout, MTP against speculation, the
pinned KV pool, flags the structured fields own, the image against its folder).

Types, required keys, unknown keys and the fixed vocabularies are checked here while decoding
(patchkit.tomlschema); the vocabularies' tuples below are what the rest of patchkit reads them from.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import msgspec

CheckpointFormat = Literal["modelopt", "compressed-tensors"]  # quantization_config.quant_method
MtpState = Literal["quantized", "bf16", "absent"]             # the MTP predictor's weights
Status = Literal["qualified", "fallback", "research"]
# Algorithms a quantprobe row may name. "None" is what vLLM's probe prints when a layer gets no
# quantized method (left unquantized): right for BF16 weights, the broken-load signature otherwise.
ProbeAlgo = Literal["NVFP4", "W4A16_NVFP4", "MXFP8", "FP8", "None"]
ProbeLayer = Literal["RoutedExperts", "LinearBase"]

CHECKPOINT_FORMATS: tuple[str, ...] = get_args(CheckpointFormat)
MTP_STATES: tuple[str, ...] = get_args(MtpState)
STATUSES: tuple[str, ...] = get_args(Status)
PROBE_ALGOS: tuple[str, ...] = get_args(ProbeAlgo)
PROBE_LAYERS: tuple[str, ...] = get_args(ProbeLayer)

Slug = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]*$", description="a lowercase slug")]
# A pin that is not known is written as "": the variant is then unpinned (definitions.py).
Sha256OrEmpty = Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{64})?$",
                                            description='lowercase SHA-256 (64 hex digits), or "" if not known')]
RevisionOrEmpty = Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{40})?$",
                                              description='a 40-hex commit, or "" if not known')]
Repo = Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$", description="owner/name on the Hub")]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
AcceptLength = Annotated[float, msgspec.Meta(ge=1)]


class _Table(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class CheckpointTable(_Table):
    repo: Repo
    revision: RevisionOrEmpty
    config_sha256: Sha256OrEmpty
    index_sha256: Sha256OrEmpty
    pin_source: str                  # where the pins come from, or why they are unknown
    format: CheckpointFormat
    quant_algo: str                  # modelopt quant_algo, or the compressed-tensors format string
    mtp: MtpState
    exclude_mtp_from_quant: bool     # only a flat ModelOpt checkpoint with a BF16 MTP predictor
    assumptions: str = ""


class VllmTable(_Table):
    quantization: str                # the vLLM --quantization method the layout resolves to
    patches: list[Slug]              # checkpoint-driven patches the image must carry


class SpeculativeTable(_Table):
    method: Literal["mtp"]
    num_speculative_tokens: Annotated[int, msgspec.Meta(ge=1, le=8)]


class ServeTable(_Table):
    served_model_name: str
    tensor_parallel_size: Positive
    kv_cache_memory_bytes: int
    kv_cache_dtype: str
    host: str
    port: Port
    args: list[str]                  # further vLLM flags; never one a structured field sets
    env: dict[str, str]
    load_format: str | None = None
    speculative: SpeculativeTable | None = None


class ProbeTable(_Table):
    """One `[[expect.quantprobe]]`: the layer class, its vLLM-side prefix, the algorithm it resolves to."""

    layer: ProbeLayer
    prefix: str
    algo: ProbeAlgo


class ExpectTable(_Table):
    quantprobe: list[ProbeTable]
    mtp_speculator: bool
    boot_timeout_s: Positive         # how long the harness waits for /health before calling the boot failed
    kv_cache_tokens: int | None = None
    weights_gib_per_rank: float | None = None
    accept_length: tuple[AcceptLength, AcceptLength] | None = None   # [low, high], low <= high


class VariantFile(_Table):
    """images/<name>/variant.toml"""

    schema: Literal[1]
    name: Slug
    aliases: list[str]
    title: str
    status: Status
    image: Slug                      # must equal the folder holding the file
    checkpoint: CheckpointTable
    vllm: VllmTable
    serve: ServeTable
    expect: ExpectTable
    notes: str = ""
