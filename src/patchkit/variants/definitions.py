"""Checkpoint variants: what a checkpoint is, how the pinned vLLM must load it, how it is served.

One `images/<image>/variant.toml` per checkpoint variant, beside the image that serves it. The file
states the checkpoint identity (repository, revision, SHA-256 pins of `config.json` and
`model.safetensors.index.json`), its quantization layout, the vLLM quantization method vLLM 0.33
resolves that layout to, the serve contract (served name, TP, pinned KV pool, MTP speculation) and the
boot markers a smoke test expects. Nothing is defaulted silently.

Its keys and types are schema.py's (`patchkit schemas` writes them for editors); `load_variant` decodes
through it, checks the rules between fields here, and returns the frozen `Variant` everything else
reads. A pin written as "" is not known: the variant is *unpinned* (pins.py says what that refuses).

```toml
schema = 1
name = "lab"                               # a slug; `aliases` are more names for it
aliases = ["nvfp4-spark"]
title = "one line"
status = "qualified"                       # qualified | fallback | research
image = "glm53-flash-nvfp4-lab"            # must equal the folder name

[checkpoint]
repo = "owner/name"
revision = "<40 hex>"                      # or "" if not known
config_sha256 = "<64 hex>"                 # or "" if not known; likewise index_sha256
index_sha256 = "<64 hex>"
pin_source = "where the pins come from, or why they are unknown"
format = "modelopt"                        # modelopt | compressed-tensors
quant_algo = "MIXED_PRECISION"
mtp = "quantized"                          # quantized | bf16 | absent
exclude_mtp_from_quant = false             # true only for flat ModelOpt with a BF16 MTP predictor
assumptions = "what was assumed, not seen" # optional

[vllm]
quantization = "modelopt_mixed"            # must be the method vLLM 0.33 routes the layout to
patches = ["modelopt-mtp-namespace"]       # checkpoint-driven patches the image must carry

[serve]                                    # the KV pool and its dtype are pinned (PINNED_KV_BYTES)
served_model_name = "glm53"
tensor_parallel_size = 2
kv_cache_memory_bytes = 10737418240
kv_cache_dtype = "fp8_ds_mla"
host = "0.0.0.0"
port = 30000
load_format = "safetensors"                # optional
speculative = { method = "mtp", num_speculative_tokens = 3 }   # exactly when the checkpoint has MTP
args = ["--trust-remote-code", ...]        # never a flag a field above sets (MANAGED_FLAGS)
[serve.env]
HF_HUB_OFFLINE = "1"

[expect]
mtp_speculator = true                      # must match whether [serve] has speculative
boot_timeout_s = 1800
kv_cache_tokens = 1164369                  # optional, like weights_gib_per_rank
accept_length = [2.9, 3.5]                 # optional: the measured mean acceptance length band
[[expect.quantprobe]]                      # one per probed layer; prefixes unique
layer = "RoutedExperts"                    # RoutedExperts | LinearBase
prefix = "model.layers.45.mlp.experts"
algo = "MXFP8"                             # NVFP4 | W4A16_NVFP4 | MXFP8 | FP8 | None
```
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from patchkit import tomlschema
from patchkit.errors import PatchkitError
from patchkit.tomlschema import InvalidDefinition, NoDefinitionFiles
from patchkit.variants.schema import CheckpointTable, ExpectTable, ServeTable, VariantFile
from patchkit.vllm_rules import UnloadableCheckpoint, check_method, expected_method

VARIANT_FILE = "variant.toml"
if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

# Flags the structured fields own. Listing one of them again in `args` would give two sources of truth.
MANAGED_FLAGS = frozenset(
    {
        "--model",
        "--revision",
        "--served-model-name",
        "--tensor-parallel-size",
        "-tp",
        "--quantization",
        "-q",
        "--speculative-config",
        "--hf-overrides",
        "--kv-cache-memory-bytes",
        "--kv-cache-dtype",
        "--load-format",
        "--host",
        "--port",
    }
)
# Flags whose value is JSON: a stray shell quote in a recipe would otherwise break the boot late.
JSON_FLAGS = ("--kernel-config", "--compilation-config", "--additional-config")

# The pinned KV pool and cache layout every GLM-5.3 recipe uses (field records "Measured recipes"/002): 10 GiB pinned,
# 576-wide fp8 rows for the sparse MLA backend on compute capability 12.x.
PINNED_KV_BYTES = 10 * 1024**3
KV_CACHE_DTYPE = "fp8_ds_mla"


@dataclass(frozen=True)
class Pins:
    """SHA-256 of config.json and model.safetensors.index.json; None = not known."""

    config_sha256: str | None
    index_sha256: str | None

    @property
    def complete(self) -> bool:
        return self.config_sha256 is not None and self.index_sha256 is not None


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    revision: str | None
    pins: Pins
    pin_source: str
    format: str  # quantization_config.quant_method: modelopt | compressed-tensors
    quant_algo: str  # modelopt quant_algo, or the compressed-tensors format string
    mtp: str  # quantized | bf16 | absent
    exclude_mtp_from_quant: bool
    assumptions: str


@dataclass(frozen=True)
class Speculative:
    method: str
    num_speculative_tokens: int

    def to_json(self) -> str:
        return json.dumps(
            {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens},
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class Serve:
    served_model_name: str
    tensor_parallel_size: int
    kv_cache_memory_bytes: int
    kv_cache_dtype: str
    host: str
    port: int
    load_format: str | None
    speculative: Speculative | None
    args: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class ProbeRow:
    """One quantprobe line: the layer class, its vLLM-side prefix, the algorithm it resolved to."""

    layer: str
    prefix: str
    algo: str

    def line(self) -> str:
        return f"[quantprobe] layer={self.layer} prefix={self.prefix} algo={self.algo}"


@dataclass(frozen=True)
class Expect:
    quantprobe: tuple[ProbeRow, ...]
    kv_cache_tokens: int | None
    weights_gib_per_rank: float | None
    mtp_speculator: bool
    boot_timeout_s: int  # how long the harness waits for /health before calling the boot failed
    # The mean SpecDecoding acceptance length the reference boots measured (low, high); None = no record.
    accept_length: tuple[float, float] | None = None


@dataclass(frozen=True)
class Variant:
    name: str
    aliases: tuple[str, ...]
    title: str
    status: str
    image: str
    path: Path
    checkpoint: Checkpoint
    quantization: str  # the vLLM --quantization method
    patches: tuple[str, ...]  # checkpoint-driven patches the image must carry
    serve: Serve
    expect: Expect
    notes: str = field(default="")

    @property
    def pinned(self) -> bool:
        return self.checkpoint.pins.complete


# ---------------------------------------------------------------- loading


class InvalidVariantFile(InvalidDefinition):
    """A variant.toml that reads as its schema but breaks a rule between fields or variants (exit 2). As for
    any definition: `path` the variant.toml, `at` the table and key ("[serve], key 'args'"), `detail` what
    was expected and what was found; `problem` one of "image-folder" (image is not the folder's name),
    "quant-algo" (a layout vLLM 0.33 has no loader for), "mtp-exclusion" (exclude_mtp_from_quant on a
    layout other than flat ModelOpt with a BF16 predictor), "speculative" (MTP speculation without MTP
    weights, or MTP weights without speculation), "mtp-speculator" ([expect] mtp_speculator disagrees with
    [serve] speculative), "args-structured" (args repeats a flag a structured field sets), "args-json" (a
    JSON flag's value does not parse), "recipe-pin" (the KV pool or its dtype is not the recipes' pinned
    value), "duplicate-probe" (a quantprobe prefix twice), "accept-length" (the band's low above its
    high), "duplicate-name" (a name or alias another variant has). The [vllm] quantization method
    against the layout is vllm_rules' WrongQuantMethod, which preflight and serve-args share."""


def load_variant(path: Path) -> Variant:
    """Parse and validate one variant.toml; every problem names file, table and key (InvalidDefinition,
    InvalidVariantFile, or vllm_rules' kinds for the quantization method)."""
    doc = tomlschema.load(path, VariantFile)
    if path.parent.name != doc.image:
        raise InvalidVariantFile(path, "key 'image'", "image-folder", f"{doc.image!r} must equal the directory "
                                 f"holding the file ({path.parent.name!r})")
    checkpoint = _checkpoint(doc.checkpoint, path)
    check_method(checkpoint.format, checkpoint.quant_algo, doc.vllm.quantization, f"{path}: [vllm], key 'quantization'")
    serve = _serve(doc.serve, checkpoint.mtp, path)
    expect = _expect(doc.expect, path)
    if expect.mtp_speculator != (serve.speculative is not None):
        raise InvalidVariantFile(path, "[expect], key 'mtp_speculator'", "mtp-speculator",
                                 f"{str(expect.mtp_speculator).lower()} while [serve] "
                                 f"{'sets' if serve.speculative else 'has no'} speculative; the two must agree")
    return _built(Variant, doc, aliases=tuple(doc.aliases), path=path, checkpoint=checkpoint,
                  quantization=doc.vllm.quantization, patches=tuple(doc.vllm.patches), serve=serve, expect=expect)


def _built(cls: type[T], table: msgspec.Struct, **given: Any) -> T:
    """A runtime `cls` from the same-named keys of its schema table; `given` for the fields shaped otherwise."""
    names = {f.name for f in fields(cls)}
    return cls(**{**{k: v for k, v in msgspec.structs.asdict(table).items() if k in names}, **given})


def _checkpoint(table: CheckpointTable, path: Path) -> Checkpoint:
    try:
        expected_method(table.format, table.quant_algo)
    except UnloadableCheckpoint as exc:
        raise InvalidVariantFile(path, "[checkpoint], key 'quant_algo'", "quant-algo", str(exc)) from None
    # The exclusion exists for one layout: a flat ModelOpt config whose BF16 predictor is not in
    # `ignore`. MIXED_PRECISION leaves unlisted layers unquantized already.
    if table.exclude_mtp_from_quant and (
        table.mtp != "bf16" or table.format != "modelopt" or table.quant_algo.upper() == "MIXED_PRECISION"
    ):
        raise InvalidVariantFile(path, "[checkpoint], key 'exclude_mtp_from_quant'", "mtp-exclusion",
                                 "applies only to a flat ModelOpt checkpoint with a BF16 MTP predictor "
                                 f"(mtp={table.mtp!r}, format={table.format!r}, quant_algo={table.quant_algo!r})")
    return _built(Checkpoint, table, revision=table.revision or None,
                  pins=Pins(table.config_sha256 or None, table.index_sha256 or None))


def _serve(table: ServeTable, mtp: str, path: Path) -> Serve:
    # MTP speculation needs predictor weights; a checkpoint without them boots but never drafts.
    if table.speculative is not None and mtp == "absent":
        raise InvalidVariantFile(path, "[serve], key 'speculative'", "speculative", "MTP speculation needs MTP "
                                 "weights, and the checkpoint has none ([checkpoint] mtp = \"absent\")")
    if table.speculative is None and mtp != "absent":
        raise InvalidVariantFile(path, "[serve]", "speculative", "missing key 'speculative': the checkpoint has MTP "
                                 f"weights ([checkpoint] mtp = {mtp!r}); speculative = {{ method = \"mtp\", "
                                 "num_speculative_tokens = N } uses them")
    for arg in table.args:
        if arg.split("=", 1)[0] in MANAGED_FLAGS:
            raise InvalidVariantFile(path, "[serve], key 'args'", "args-structured",
                                     f"{arg!r} is set by a structured field, not in args")
    for flag, value in itertools.pairwise(table.args):
        if flag in JSON_FLAGS:
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidVariantFile(path, "[serve], key 'args'", "args-json",
                                         f"value of {flag} is not JSON ({exc}): {value!r}") from None
    # Field records "Measured recipes": GMU sizing has no headroom at ~93 GiB of weights; the pool is pinned to the digit.
    pins: tuple[tuple[str, object, object], ...] = (
        ("kv_cache_memory_bytes", table.kv_cache_memory_bytes, PINNED_KV_BYTES),
        ("kv_cache_dtype", table.kv_cache_dtype, KV_CACHE_DTYPE))
    for key, found, pinned in pins:
        if found != pinned:
            raise InvalidVariantFile(path, f"[serve], key {key!r}", "recipe-pin",
                                     f"the GLM-5.3 recipes pin {key}={pinned!r}, got {found!r}")
    spec = table.speculative
    return _built(Serve, table, speculative=spec and Speculative(spec.method, spec.num_speculative_tokens),
                  args=tuple(table.args), env=dict(table.env))


def _expect(table: ExpectTable, path: Path) -> Expect:
    seen: set[str] = set()
    for i, row in enumerate(table.quantprobe, 1):
        if row.prefix in seen:
            raise InvalidVariantFile(path, f"[[expect.quantprobe]] #{i}, key 'prefix'", "duplicate-probe",
                                     f"{row.prefix!r} is probed already")
        seen.add(row.prefix)
    band = table.accept_length
    if band is not None and band[0] > band[1]:
        raise InvalidVariantFile(path, "[expect], key 'accept_length'", "accept-length",
                                 f"must be [low, high] with low <= high, got {list(band)}")
    return _built(Expect, table, quantprobe=tuple(ProbeRow(row.layer, row.prefix, row.algo) for row in table.quantprobe),
                  accept_length=band and (float(band[0]), float(band[1])))


def load_variants(images_dir: Path) -> dict[str, Variant]:
    """Every <images_dir>/*/variant.toml, keyed by name; names and aliases must be unique."""
    root = Path(images_dir)
    variants: dict[str, Variant] = {}
    names: dict[str, str] = {}
    for path in sorted(root.glob(f"*/{VARIANT_FILE}")):
        variant = load_variant(path)
        for key, at in ((variant.name, "key 'name'"), *((alias, "key 'aliases'") for alias in variant.aliases)):
            if key in names:
                raise InvalidVariantFile(path, at, "duplicate-name", f"name {key!r} already used by variant {names[key]}")
            names[key] = variant.name
        variants[variant.name] = variant
    if not variants:
        raise NoDefinitionFiles(root, VARIANT_FILE)
    return variants


class UnknownVariant(PatchkitError):
    """A variant name or alias no variant.toml defines (exit 2): the `name` asked for and the `known`
    variants, each with its aliases ("lab (nvfp4-spark)")."""

    def __init__(self, name: str, known: tuple[str, ...]):
        self.name, self.known = name, known
        super().__init__(f"unknown variant {name!r}; known: {', '.join(known)}")


def find_variant(name: str, images_dir: Path) -> Variant:
    """A variant by name or alias (e.g. `lab` or `nvfp4-spark`)."""
    variants = load_variants(images_dir)
    for variant in variants.values():
        if name == variant.name or name in variant.aliases:
            return variant
    raise UnknownVariant(name, tuple(f"{v.name} ({', '.join(v.aliases)})" if v.aliases else v.name
                                     for v in variants.values()))
