"""Checkpoint variants: what a checkpoint is, how the pinned vLLM must load it, how it is served.

One `images/<image>/variant.toml` per checkpoint variant, beside the image that serves it. The file
states the checkpoint identity (repository, revision, SHA-256 pins of `config.json` and
`model.safetensors.index.json`), its quantization layout, the vLLM quantization method vLLM 0.33
resolves that layout to, the serve contract (served name, TP, pinned KV pool, MTP speculation) and the
boot markers a smoke test expects. `load_variant` validates all of it; nothing is defaulted silently.

A pin that is not known (no public record of it could be checked here) is written as an empty string.
Such a variant is *unpinned*: identity checks refuse it unless the user supplies the pins explicitly
(`resolve_pins(..., config_sha256=..., index_sha256=...)`, i.e. `--pin-config/--pin-index`).
"""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchkit import CHECKOUT
from patchkit.errors import PatchkitError

VARIANT_FILE = "variant.toml"

# Which vLLM 0.33 quantization method owns each checkpoint layout. Read from
# vllm/model_executor/layers/quantization/modelopt.py (LINEAR_ALGOS and each config's
# override_quantization_method) and vllm/config/model.py::_verify_quantization: vLLM replaces a
# user-given --quantization with the method the checkpoint's quant_algo routes to, so naming the wrong
# one hides the real loader from whoever reads the command line. We refuse the wrong pairing instead.
MODELOPT_METHODS: dict[str, str] = {
    "FP8": "modelopt",
    "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
    "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4",
    "W4A16_NVFP4": "modelopt_fp4",
    "MXFP8": "modelopt_mxfp8",
    "MIXED_PRECISION": "modelopt_mixed",
}
CHECKPOINT_FORMATS = ("modelopt", "compressed-tensors")
MTP_STATES = ("quantized", "bf16", "absent")
STATUSES = ("qualified", "fallback", "research")

# Algorithms a quantprobe row may name. "None" is what vLLM's probe prints when a layer gets no
# quantized method (left unquantized): right for BF16 weights, the broken-load signature otherwise.
PROBE_ALGOS = ("NVFP4", "W4A16_NVFP4", "MXFP8", "FP8", "None")
PROBE_LAYERS = ("RoutedExperts", "LinearBase")

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

# The pinned KV pool and cache layout every GLM-5.3 recipe uses (field records "Measured recipes"/002): 10 GiB pinned,
# 576-wide fp8 rows for the sparse MLA backend on compute capability 12.x.
PINNED_KV_BYTES = 10 * 1024**3
KV_CACHE_DTYPE = "fp8_ds_mla"
SERVED_NAME = "glm53"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_REVISION = re.compile(r"[0-9a-f]{40}")
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")


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


def expected_method(fmt: str, quant_algo: str) -> str:
    """The vLLM 0.33 method for a checkpoint layout; PatchkitError for a layout it cannot load."""
    if fmt == "compressed-tensors":
        return "compressed-tensors"
    if fmt == "modelopt":
        method = MODELOPT_METHODS.get(quant_algo.upper())
        if method is None:
            raise PatchkitError(
                f"ModelOpt quant_algo {quant_algo!r} is not one vLLM 0.33 loads "
                f"(known: {', '.join(sorted(MODELOPT_METHODS))})"
            )
        return method
    raise PatchkitError(f"checkpoint format {fmt!r} is not one of {', '.join(CHECKPOINT_FORMATS)}")


def check_method(fmt: str, quant_algo: str, method: str, where: str) -> None:
    """Refuse a quantization method that does not match the checkpoint layout, naming the right one."""
    right = expected_method(fmt, quant_algo)
    if method != right:
        detail = ""
        if method == "modelopt" and right != "modelopt":
            detail = (
                " (in vLLM 0.33 `modelopt` is the FP8 config; the day-0 fork's loader names do not carry "
                "over)"
            )
        raise PatchkitError(
            f"{where}: quantization {method!r} does not load a {fmt} {quant_algo} checkpoint in vLLM 0.33; "
            f"it needs {right!r}{detail}"
        )


def resolve_pins(
    variant: Variant, config_sha256: str | None = None, index_sha256: str | None = None
) -> Pins:
    """The pins an identity check uses: the variant's, or the user's where the variant has none.

    A user pin that contradicts a pin the variant carries is an error, never a silent override; a pin
    still unknown after both is an error too (fail closed: an unpinned checkpoint is never trusted).
    """
    chosen: dict[str, str] = {}
    for label, own, given in (
        ("config.json", variant.checkpoint.pins.config_sha256, config_sha256),
        ("model.safetensors.index.json", variant.checkpoint.pins.index_sha256, index_sha256),
    ):
        if given is not None:
            given = given.lower()
            if not _SHA256.fullmatch(given):
                raise PatchkitError(f"pin for {label} is not a SHA-256 (64 hex digits): {given!r}")
        if own and given and own != given:
            raise PatchkitError(
                f"variant {variant.name} pins {label} sha256 {own}; the pin given ({given}) contradicts it"
            )
        value = own or given
        if value is None:
            raise PatchkitError(
                f"variant {variant.name} has no known SHA-256 pin for {label} "
                f"({variant.checkpoint.pin_source}); identity checks refuse an unpinned checkpoint: "
                "supply the pins yourself (--pin-config SHA --pin-index SHA) from a source you trust"
            )
        chosen[label] = value
    return Pins(chosen["config.json"], chosen["model.safetensors.index.json"])


# ---------------------------------------------------------------- loading


class _Table:
    """Typed access to one TOML table, every error naming the file and the key."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        self.used: set[str] = set()

    def _get(self, key: str, kind: type | tuple[type, ...], required: bool) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required:
                raise PatchkitError(f"{self.where}: missing key {key!r}")
            return None
        value = self.data[key]
        # bool is an int subclass; a TOML `true` must not pass as a number
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise PatchkitError(f"{self.where}: {key!r} must be {kind}, got {type(value).__name__}")
        return value

    def str(self, key: str, required: bool = True) -> Any:
        return self._get(key, str, required)

    def int(self, key: str, required: bool = True) -> Any:
        return self._get(key, int, required)

    def bool(self, key: str, required: bool = True) -> Any:
        return self._get(key, bool, required)

    def float(self, key: str, required: bool = True) -> Any:
        value = self._get(key, (int, float), required)
        return None if value is None else float(value)

    def strings(self, key: str, required: bool = True) -> tuple[str, ...] | None:
        value = self._get(key, list, required)
        if value is None:
            return None
        if not all(isinstance(v, str) for v in value):
            raise PatchkitError(f"{self.where}: {key!r} must be a list of strings")
        return tuple(value)

    def table(self, key: str, required: bool = True) -> _Table | None:
        value = self._get(key, dict, required)
        return None if value is None else _Table(value, f"{self.where} [{key}]")

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise PatchkitError(f"{self.where}: unknown keys {unknown}")


def _sha_or_none(value: str, where: str) -> str | None:
    if value == "":
        return None
    if not _SHA256.fullmatch(value):
        raise PatchkitError(f"{where}: not a lowercase SHA-256 (64 hex digits) or \"\": {value!r}")
    return value


def _checkpoint(t: _Table) -> Checkpoint:
    where = t.where
    revision = t.str("revision")
    if revision and not _REVISION.fullmatch(revision):
        raise PatchkitError(f"{where}: revision must be a 40-hex commit or \"\", got {revision!r}")
    fmt = t.str("format")
    mtp = t.str("mtp")
    if mtp not in MTP_STATES:
        raise PatchkitError(f"{where}: mtp must be one of {MTP_STATES}, got {mtp!r}")
    ckpt = Checkpoint(
        repo=t.str("repo"),
        revision=revision or None,
        pins=Pins(
            _sha_or_none(t.str("config_sha256"), f"{where} config_sha256"),
            _sha_or_none(t.str("index_sha256"), f"{where} index_sha256"),
        ),
        pin_source=t.str("pin_source"),
        format=fmt,
        quant_algo=t.str("quant_algo"),
        mtp=mtp,
        exclude_mtp_from_quant=t.bool("exclude_mtp_from_quant"),
        assumptions=t.str("assumptions", required=False) or "",
    )
    t.done()
    if "/" not in ckpt.repo:
        raise PatchkitError(f"{where}: repo must be owner/name, got {ckpt.repo!r}")
    # The exclusion exists for one layout: a flat ModelOpt config whose BF16 predictor is not in
    # `ignore`. MIXED_PRECISION leaves unlisted layers unquantized already.
    if ckpt.exclude_mtp_from_quant and (
        ckpt.mtp != "bf16" or fmt != "modelopt" or ckpt.quant_algo.upper() == "MIXED_PRECISION"
    ):
        raise PatchkitError(
            f"{where}: exclude_mtp_from_quant applies only to a flat ModelOpt checkpoint with a BF16 "
            f"MTP predictor (mtp={ckpt.mtp!r}, format={fmt!r}, quant_algo={ckpt.quant_algo!r})"
        )
    return ckpt


def _serve(t: _Table, mtp: str) -> Serve:
    where = t.where
    spec_t = t.table("speculative", required=False)
    speculative = None
    if spec_t is not None:
        speculative = Speculative(spec_t.str("method"), spec_t.int("num_speculative_tokens"))
        spec_t.done()
        if speculative.method != "mtp" or not 1 <= speculative.num_speculative_tokens <= 8:
            raise PatchkitError(f"{where}: speculative must be method \"mtp\" with 1..8 tokens")
    # MTP speculation needs predictor weights; a checkpoint without them boots but never drafts.
    if speculative is not None and mtp == "absent":
        raise PatchkitError(f"{where}: speculative MTP configured but the checkpoint has no MTP weights")
    if speculative is None and mtp != "absent":
        raise PatchkitError(f"{where}: the checkpoint has MTP weights (mtp={mtp!r}) but no speculative config")
    args = t.strings("args")
    assert args is not None
    for arg in args:
        if arg.split("=", 1)[0] in MANAGED_FLAGS:
            raise PatchkitError(f"{where}: {arg!r} is set by a structured field, not in args")
    _check_json_args(args, where)
    env_t = t.table("env")
    assert env_t is not None
    for key, value in env_t.data.items():
        if not isinstance(value, str):
            raise PatchkitError(f"{where} [env]: {key} must be a string")
    env = dict(env_t.data)
    load_format = t.str("load_format", required=False)
    serve = Serve(
        served_model_name=t.str("served_model_name"),
        tensor_parallel_size=t.int("tensor_parallel_size"),
        kv_cache_memory_bytes=t.int("kv_cache_memory_bytes"),
        kv_cache_dtype=t.str("kv_cache_dtype"),
        host=t.str("host"),
        port=t.int("port"),
        load_format=load_format,
        speculative=speculative,
        args=args,
        env=env,
    )
    t.done()
    if serve.tensor_parallel_size < 1 or not 0 < serve.port < 65536:
        raise PatchkitError(f"{where}: tensor_parallel_size must be >= 1 and port 1..65535")
    if serve.kv_cache_memory_bytes != PINNED_KV_BYTES or serve.kv_cache_dtype != KV_CACHE_DTYPE:
        # Field records "Measured recipes": GMU sizing has no headroom at ~93 GiB of weights; the pool is pinned to the digit.
        raise PatchkitError(
            f"{where}: the GLM-5.3 recipes pin kv_cache_memory_bytes={PINNED_KV_BYTES} and "
            f"kv_cache_dtype={KV_CACHE_DTYPE!r}"
        )
    return serve


def _check_json_args(args: tuple[str, ...], where: str) -> None:
    """Values of JSON-taking flags must parse: a stray shell quote in a recipe breaks the boot late."""
    for flag, value in itertools.pairwise(args):
        if flag in ("--kernel-config", "--compilation-config", "--additional-config"):
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                raise PatchkitError(f"{where}: value of {flag} is not JSON ({exc}): {value!r}") from None


def _accept_length(t: _Table) -> tuple[float, float] | None:
    band = t._get("accept_length", list, False)
    if band is None:
        return None
    if len(band) != 2 or not all(isinstance(x, (int, float)) for x in band) or not 1 <= band[0] <= band[1]:
        raise PatchkitError(f"{t.where}: accept_length must be [low, high] with 1 <= low <= high: {band!r}")
    return float(band[0]), float(band[1])


def _expect(t: _Table) -> Expect:
    rows = []
    raw = t._get("quantprobe", list, True)
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise PatchkitError(f"{t.where}: quantprobe[{i}] must be a table")
        r = _Table(item, f"{t.where} quantprobe[{i}]")
        row = ProbeRow(r.str("layer"), r.str("prefix"), r.str("algo"))
        r.done()
        if row.layer not in PROBE_LAYERS or row.algo not in PROBE_ALGOS:
            raise PatchkitError(
                f"{r.where}: layer must be one of {PROBE_LAYERS} and algo one of {PROBE_ALGOS}: {row}"
            )
        rows.append(row)
    prefixes = [r.prefix for r in rows]
    if len(set(prefixes)) != len(prefixes):
        raise PatchkitError(f"{t.where}: duplicate quantprobe prefixes")
    expect = Expect(
        quantprobe=tuple(rows),
        kv_cache_tokens=t.int("kv_cache_tokens", required=False),
        weights_gib_per_rank=t.float("weights_gib_per_rank", required=False),
        mtp_speculator=t.bool("mtp_speculator"),
        boot_timeout_s=t.int("boot_timeout_s"),
        accept_length=_accept_length(t),
    )
    t.done()
    if expect.boot_timeout_s <= 0:
        raise PatchkitError(f"{t.where}: boot_timeout_s must be positive")
    return expect


def load_variant(path: Path) -> Variant:
    """Parse and validate one variant.toml; every problem is a PatchkitError naming file and key."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PatchkitError(f"{where}: no such variant file") from None
    except tomllib.TOMLDecodeError as exc:
        raise PatchkitError(f"{where}: not valid TOML: {exc}") from None
    top = _Table(data, where)
    if top.int("schema") != 1:
        raise PatchkitError(f"{where}: schema must be 1")
    name = top.str("name")
    image = top.str("image")
    for label, value in (("name", name), ("image", image)):
        if not _SLUG.fullmatch(value):
            raise PatchkitError(f"{where}: {label} must be a lowercase slug, got {value!r}")
    if path.parent.name != image:
        raise PatchkitError(f"{where}: image {image!r} must equal the directory holding the file")
    status = top.str("status")
    if status not in STATUSES:
        raise PatchkitError(f"{where}: status must be one of {STATUSES}")
    ckpt_t = top.table("checkpoint")
    vllm_t = top.table("vllm")
    serve_t = top.table("serve")
    expect_t = top.table("expect")
    assert ckpt_t and vllm_t and serve_t and expect_t
    checkpoint = _checkpoint(ckpt_t)
    quantization = vllm_t.str("quantization")
    patches = vllm_t.strings("patches")
    vllm_t.done()
    check_method(checkpoint.format, checkpoint.quant_algo, quantization, f"{where} [vllm]")
    assert patches is not None
    for patch in patches:
        if not _SLUG.fullmatch(patch):
            raise PatchkitError(f"{where} [vllm]: patch id {patch!r} is not a slug")
    serve = _serve(serve_t, checkpoint.mtp)
    expect = _expect(expect_t)
    if expect.mtp_speculator != (serve.speculative is not None):
        raise PatchkitError(f"{where} [expect]: mtp_speculator must match whether [serve.speculative] is set")
    variant = Variant(
        name=name,
        aliases=top.strings("aliases") or (),
        title=top.str("title"),
        status=status,
        image=image,
        path=path,
        checkpoint=checkpoint,
        quantization=quantization,
        patches=patches,
        serve=serve,
        expect=expect,
        notes=top.str("notes", required=False) or "",
    )
    top.done()
    return variant


def default_images_dir() -> Path:
    """The repository's images/ directory (patchkit runs from a checkout; images are not packaged)."""
    candidate = CHECKOUT / "images"
    if not candidate.is_dir():
        raise PatchkitError(f"no images directory at {candidate}; pass the images directory explicitly")
    return candidate


def load_variants(images_dir: Path | None = None) -> dict[str, Variant]:
    """Every images/*/variant.toml, keyed by name; names and aliases must be unique."""
    root = images_dir or default_images_dir()
    variants: dict[str, Variant] = {}
    names: dict[str, str] = {}
    for path in sorted(root.glob(f"*/{VARIANT_FILE}")):
        variant = load_variant(path)
        for key in (variant.name, *variant.aliases):
            if key in names:
                raise PatchkitError(f"{path}: name {key!r} already used by variant {names[key]}")
            names[key] = variant.name
        variants[variant.name] = variant
    if not variants:
        raise PatchkitError(f"no {VARIANT_FILE} under {root}")
    return variants


def find_variant(name: str, images_dir: Path | None = None) -> Variant:
    """A variant by name or alias (e.g. `lab` or `nvfp4-spark`)."""
    variants = load_variants(images_dir)
    for variant in variants.values():
        if name == variant.name or name in variant.aliases:
            return variant
    known = ", ".join(f"{v.name} ({', '.join(v.aliases)})" if v.aliases else v.name for v in variants.values())
    raise PatchkitError(f"unknown variant {name!r}; known: {known}")
