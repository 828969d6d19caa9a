"""`patchkit preflight PATH`: will this checkpoint load with this variant, before a 10-minute boot?

In order: the identity pins (fail closed, nothing parsed before they match); the config's declared
layout against the variant; the safetensors headers of every indexed shard (no tensor data read); an
inventory of every module's storage format; the storage checked against what the pinned vLLM 0.33 will
build for each module (a mirror of its exclusion and per-layer resolution rules, cited below); the MTP
predictor; the patches this checkpoint needs; and the weight memory one GB10 rank holds at TP=N beside
the pinned KV pool. The mirror is a fast offline check; `smoke --cpu` runs vLLM's own code.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.checkpoint.headers import (
    CONFIG,
    INDEX,
    Inventory,
    Module,
    inventory,
    per_rank_bytes,
    read_checkpoint_file,
    read_headers,
    sha256_bytes,
    verify_identity,
)
from patchkit.variants.definitions import Variant, load_variants
from patchkit.checkpoint.mtp_ignore import extended_quantization_config
from patchkit.variants.pins import resolve_pins
from patchkit.checkpoint.quant_config import CompressedTensors, ct_algo, read_declared
from patchkit.checkpoint.spelling import spelling_of, weight_map_names

GIB = 1024**3
GB10_MEMORY_GIB = 121.63  # unified memory per DGX Spark node
GB10_FREE_AT_BOOT_GIB = 108.5  # field records "The 4p67 recipe": driver reserve + page cache routinely leave about this much
# Activations at --max-num-batched-tokens 4096, CUDA/NCCL context and the sampler: a margin, not a
# measurement (field records "The 4p67 recipe" lists "weights ~93 + pinned KV 10 + activations" as the whole allocation).
ACTIVATION_RESERVE_GIB = 6.0

# Modules vLLM 0.33 builds with the checkpoint's quant config (glm5next/common/model.py): routed experts
# (FusedMoE), shared experts and the dense MLP (Glm5NextMLP linears), the LM head (ParallelLMHead).
# KDA, MLA and the indexer get quant_config=None (kda.py ~210, model.py ~408, attention.py ~242), as do
# the vision tower and the embeddings; the MTP eh_proj is a plain nn.Linear.
QUANTIZED_KINDS = frozenset({"routed_expert", "shared_expert", "dense_mlp", "lm_head"})
# packed-modules-4p67 passes the real config to attention/indexer projections for modelopt_mixed.
PACKED_KINDS = frozenset({"attention", "indexer"})
LINEAR_PARAMS = frozenset({"weight", "weight_packed"})

# Declared algorithm -> storage formats it loads (checkpoint.format_of names).
ACCEPTS = {
    "NVFP4": {"NVFP4"},
    "W4A16_NVFP4": {"NVFP4", "NVFP4A16"},  # the input_scale, if stored, is not read
    "MXFP8": {"MXFP8"},
    "FP8": {"FP8"},
    "FP8_PB_WO": {"FP8-BLOCK"},
    "nvfp4-pack-quantized": {"NVFP4-CT"},
    "float-quantized": {"FP8"},  # compressed-tensors FP8 (a weight and its F32 scale)
}
# The vLLM module class a checkpoint module loads into, for compressed-tensors' class-name targets.
_CT_CLASS = {"gate_proj": "MergedColumnParallelLinear", "up_proj": "MergedColumnParallelLinear",
             "down_proj": "RowParallelLinear", "lm_head": "ParallelLMHead"}


@dataclass
class PreflightReport:
    variant: str
    root: str
    tp: int
    identity: dict
    declared: dict
    tensors: int
    total_gib: float
    header_only_shards: int
    formats: list[dict]
    mtp: dict
    patches: dict
    memory: dict
    spelling: dict = field(default_factory=dict)  # tensor-name spelling (nested/flat) and whether the image loads it
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        return json.dumps(dict(asdict(self), ok=self.ok), indent=2)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        head = Table(title=f"preflight {self.variant}: {self.root}", show_header=False)
        head.add_row("identity", f"config {self.identity['config_sha256'][:16]}… index {self.identity['index_sha256'][:16]}… ✓")
        head.add_row("declared", f"{self.declared['format']} {self.declared['quant_algo']} → vLLM --quantization {self.declared['vllm_method']}")
        head.add_row("tensors", f"{self.tensors:,} ({self.total_gib:.2f} GiB){'; header-only shards: ' + str(self.header_only_shards) if self.header_only_shards else ''}")
        head.add_row("MTP", f"layers {self.mtp['layers'] or 'none'}; routed experts {self.mtp['routed_expert_formats'] or '-'}")
        head.add_row("spelling", self.spelling.get("verdict", "-"))
        head.add_row("patches", f"needed {self.patches['checkpoint'] or 'none'}; platform {self.patches['platform']}")
        m = self.memory
        head.add_row("memory", f"{m['weights_gib_per_rank']:.2f} GiB weights/rank at TP={self.tp} + {m['kv_gib']:.2f} GiB KV + {m['reserve_gib']:.1f} reserve = {m['total_gib']:.2f} of {m['budget_gib']} GiB")
        fmt = Table(title="storage by module kind", show_lines=False)
        for col in ("kind", "part", "format", "modules", "GiB"):
            fmt.add_column(col, justify="right" if col in ("modules", "GiB") else "left")
        for row in self.formats:
            fmt.add_row(row["kind"], row["part"], row["format"], f"{row['modules']:,}", f"{row['gib']:.2f}")
        lines = [f"[red]✗ {p}[/red]" for p in self.problems] + [f"[yellow]• {n}[/yellow]" for n in self.notes]
        verdict = "[green]OK: the layout matches what vLLM 0.33 will build[/green]" if self.ok else "[red]FAILED[/red]"
        return Group(head, fmt, *lines, verdict)


# ---------------------------------------------------------------- vLLM mirror


def _vllm_prefix(module: str, is_mtp: bool) -> str:
    """The module's prefix inside vLLM: the target's through Glm5NextForConditionalGeneration's mapper
    (glm4_1v.py: model.language_model. -> language_model.model., lm_head. -> language_model.lm_head.),
    the MTP's as the draft model builds it (prefix "", mtp.py ~115: model.layers.{i}...)."""
    if is_mtp:
        return module.replace("model.language_model.", "model.", 1)
    if module.startswith("model.language_model."):
        return "language_model.model." + module[len("model.language_model."):]
    if module == "lm_head":
        return "language_model.lm_head"
    return module


def _mapped_excludes(entries: list[str]) -> list[str]:
    """ModelOptQuantConfigBase.apply_vllm_mapper: `x*` -> `x`, `x.*`, then the name mapper."""
    out = []
    for entry in entries:
        expanded = [entry[:-1], entry[:-1] + ".*"] if len(entry) >= 2 and entry[-1] == "*" and entry[-2] != "." else [entry]
        for e in expanded:
            if e.startswith("model.language_model."):
                e = "language_model.model." + e[len("model.language_model."):]
            elif e.startswith("lm_head."):
                e = "language_model." + e
            elif e.startswith("model.visual."):
                e = "visual." + e[len("model.visual."):]
            out.append(e)
    return out


def _modelopt_excluded(prefix: str, excludes: list[str]) -> bool:
    """ModelOptQuantConfigBase.is_layer_excluded (modelopt.py ~191): exact, substring, then fnmatch."""
    if prefix in excludes:
        return True
    bare = prefix.removeprefix("language_model.") if prefix.startswith("language_model.") else None
    for e in excludes:
        if e != prefix and (e in prefix or (bare is not None and e in bare)):
            return True
    return any(fnmatchcase(prefix, e) for e in excludes)


def _ct_algo(ct: CompressedTensors, m: Module, prefix: str) -> str | None:
    """What compressed-tensors builds for checkpoint module `m` (vLLM-side `prefix`)."""
    if m.kind == "routed_expert":
        return ct_algo(ct.moe_scheme(prefix))
    last = prefix.rsplit(".", 1)[-1]
    if last in ("gate_proj", "up_proj"):
        prefix = prefix[: -len(last)] + "gate_up_proj"  # vLLM's fused layer, resolved through its shards
    return ct_algo(ct.scheme(prefix, _CT_CLASS.get(last, "Linear")))


def _vllm_module(module: Module) -> str:
    """The vLLM layer a checkpoint module loads into: every routed expert into its layer's experts."""
    if module.kind == "routed_expert":
        return module.name.split(".mlp.experts.", 1)[0] + ".mlp.experts"
    return module.name


# ---------------------------------------------------------------- checks


def _expected_algo(variant: Variant, quant: dict, inv: Inventory, m: Module, excludes: list[str],
                   ct: CompressedTensors | None = None) -> tuple[str | None, str | None]:
    """(algorithm vLLM will build module `m` with, patch it needs for that) under the declared config."""
    mtp = inv.is_mtp(m)
    prefix = _vllm_prefix(_vllm_module(m), mtp)
    fmt = variant.checkpoint.format
    algo = variant.checkpoint.quant_algo.upper()
    if fmt == "compressed-tensors":
        if m.kind not in QUANTIZED_KINDS or ct is None:
            return None, None
        return _ct_algo(ct, m, prefix), None
    if algo == "MIXED_PRECISION":
        layers = quant.get("quantized_layers") or {}
        entry = layers.get(m.name)
        if entry is None and m.kind == "routed_expert":
            entry = next((v for k, v in layers.items() if k.startswith(_vllm_module(m) + ".")), None)
        if entry is None:
            return None, None
        if m.kind in PACKED_KINDS:
            return entry["quant_algo"].upper(), "packed-modules-4p67"
        if m.kind not in QUANTIZED_KINDS:
            return None, None  # vLLM builds it unquantized even with every patch applied
        return entry["quant_algo"].upper(), ("modelopt-mtp-namespace" if mtp else None)
    if m.kind not in QUANTIZED_KINDS or _modelopt_excluded(prefix, excludes):
        return None, None
    if algo == "NVFP4" and _weight_only(quant):
        algo = "W4A16_NVFP4"  # ModelOptNvFp4Config._from_config: no input_activations anywhere
    return algo, None


def _weight_only(quant: dict) -> bool:
    groups = quant.get("config_groups")
    return isinstance(groups, dict) and bool(groups) and all(
        isinstance(g, dict) and g.get("input_activations") is None for g in groups.values()
    )


def _check_layout(variant: Variant, quant: dict, inv: Inventory, excludes: list[str]) -> tuple[dict, dict]:
    """Mismatches grouped by (kind, part, stored, built) and the patches quantized modules need."""
    mismatches: dict[tuple, list[str]] = defaultdict(list)
    needs: dict[str, set[str]] = defaultdict(set)
    ct = CompressedTensors(quant, "quantization_config") if variant.checkpoint.format == "compressed-tensors" else None
    for m in inv.modules.values():
        if m.format in ("F32", "other") and not any(t.rsplit(".", 1)[-1] in LINEAR_PARAMS for t in m.tensors):
            continue  # bare parameters, norms, taps: never quantized
        algo, patch = _expected_algo(variant, quant, inv, m, excludes, ct)
        stored_quantized = m.format not in ("BF16", "F16", "F32")
        part = "mtp" if inv.is_mtp(m) else "main"
        if algo is None:
            if stored_quantized:
                mismatches[(m.kind, part, m.format, "unquantized")].append(m.name)
        elif m.format not in ACCEPTS.get(algo, set()):
            mismatches[(m.kind, part, m.format, algo)].append(m.name)
        elif patch:
            needs[patch].add(f"{part} {m.kind}")
    return mismatches, needs


def _platform_patches(text: dict, variant: Variant) -> list[str]:
    """GB10 (compute capability 12.1) needs, from the config rather than the quantization."""
    out = []
    if text.get("qk_rope_head_dim", 0) == 0 and variant.serve.kv_cache_dtype == "fp8_ds_mla":
        out.append("nope-mla-pad")
    if text.get("index_topk") is not None:
        out += ["persistent-topk-cc12", "pool-topk-init"]
    return out


def _detect(root: Path, images_dir: Path | None) -> Variant:
    """The pinned variant whose pins these files match (hashing only, nothing parsed)."""
    digests = [sha256_bytes(read_checkpoint_file(root, name)) for name in (CONFIG, INDEX)]
    variants = load_variants(images_dir).values()
    for variant in variants:
        pins = variant.checkpoint.pins
        if (pins.config_sha256, pins.index_sha256) == tuple(digests):
            return variant
    # A partly pinned variant is never chosen by hashing (its unknown pin is unchecked), only named.
    partial = [v.name for v in variants if not v.pinned and any(
        own == digest for own, digest in zip((v.checkpoint.pins.config_sha256, v.checkpoint.pins.index_sha256), digests,
                                             strict=True))]
    hint = f"; its known pins match variant {', '.join(partial)}, which pins only part of the checkpoint" if partial else ""
    raise PatchkitError(
        f"{root} matches no pinned variant (config sha256 {digests[0]}){hint}; name it with --variant and give "
        "--pin-config/--pin-index for an unpinned one"
    )


def preflight(
    root: Path,
    variant: Variant | None = None,
    tp: int | None = None,
    pin_config: str | None = None,
    pin_index: str | None = None,
    images_dir: Path | None = None,
    series_of: Callable[[str], Sequence[str]] | None = None,
) -> PreflightReport:
    """Run every check; PatchkitError when identity or structure fails, else a report (ok or not).

    `series_of(image)` gives the patch series of the variant's image (the CLI reads the image
    definition); without it the tensor-name spelling is judged against the variant's own patches."""
    root = Path(root)
    variant = variant or _detect(root, images_dir)
    tp = tp or variant.serve.tensor_parallel_size
    verified = verify_identity(root, resolve_pins(variant, pin_config, pin_index))
    config = verified.config
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise PatchkitError(f"{root / CONFIG}: text_config is not an object")
    source = read_declared(root, config, variant)
    quant = source.config
    declared_algo = source.declared_algo
    want = variant.checkpoint
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        raise PatchkitError(f"{root / CONFIG}: num_hidden_layers missing or invalid: {layers!r}")
    inv = inventory(read_headers(verified), layers)

    problems: list[str] = []
    notes: list[str] = []
    if source.sha256:
        notes.append(f"vLLM reads the layer table from {source.source} (sha256 {source.sha256}), which no pin covers")
    excludes = _mapped_excludes(list(quant.get("ignore", quant.get("exclude_modules", [])) or []))
    mismatches, needs = _check_layout(variant, quant, inv, excludes)

    # The BF16 predictor outside `ignore`: the mismatch serve-args' override removes.
    mtp_fix = want.exclude_mtp_from_quant and any(part == "mtp" for (_, part, _, _) in mismatches)
    if mtp_fix:
        extended = extended_quantization_config(config)
        if extended is not None:
            mismatches, needs = _check_layout(variant, extended, inv, _mapped_excludes(extended["ignore"]))
            notes.append("the BF16 MTP predictor is outside `ignore`: serve-args adds the --hf-overrides that excludes it")
    for (kind, part, stored, built), names in sorted(mismatches.items()):
        problems.append(
            f"{len(names)} {part} {kind} module(s) stored {stored} but vLLM 0.33 builds them {built}, e.g. {names[0]}"
        )

    mtp_layers = inv.mtp_layers
    mtp_formats = dict(Counter(m.format for m in inv.modules.values() if inv.is_mtp(m) and m.kind == "routed_expert"))
    if want.mtp == "absent" and mtp_layers:
        problems.append(f"variant says no MTP weights, but the checkpoint has tensors under layers {mtp_layers}")
    if want.mtp != "absent" and not mtp_layers:
        problems.append(f"variant expects MTP weights ({want.mtp}); the checkpoint has none past layer {layers - 1}")
    if want.mtp == "bf16" and mtp_layers and set(mtp_formats) != {"BF16"}:
        problems.append(f"variant says the MTP is BF16; its routed experts are stored {mtp_formats}")
    if want.mtp == "quantized" and mtp_layers and "BF16" in mtp_formats:
        problems.append(f"variant says the MTP is quantized; its routed experts are stored {mtp_formats}")

    names = weight_map_names(verified.index, str(root / INDEX))
    spelling = spelling_of(names)
    series = tuple(series_of(variant.image)) if series_of else variant.patches
    image = f"image {variant.image}" if series_of else f"variant {variant.name}'s patches"
    if spelling.handled_by(series) is False:
        problems.append(spelling.verdict(series, image))

    needed = sorted(needs)
    for patch in needed:
        if patch not in variant.patches:
            problems.append(f"the checkpoint needs patch {patch} ({', '.join(sorted(needs[patch]))}); variant {variant.name} does not list it")
    for patch in variant.patches:
        if patch not in needs:
            notes.append(f"variant lists patch {patch}, which this checkpoint's layout does not need")

    lm_only = "--language-model-only" in variant.serve.args
    weights = per_rank_bytes(inv, tp, lm_only) / GIB
    kv = variant.serve.kv_cache_memory_bytes / GIB
    total = weights + kv + ACTIVATION_RESERVE_GIB
    if total > GB10_MEMORY_GIB:
        problems.append(f"{weights:.2f} GiB weights + {kv:.2f} GiB KV + {ACTIVATION_RESERVE_GIB} GiB reserve per rank exceed GB10's {GB10_MEMORY_GIB} GiB at TP={tp}")
    elif total > GB10_FREE_AT_BOOT_GIB:
        notes.append(f"{total:.2f} GiB per rank is above the ~{GB10_FREE_AT_BOOT_GIB} GiB usually free at boot")
    if inv.header_only_shards:
        notes.append(f"{inv.header_only_shards} shard(s) are header dumps without tensor data: nothing to serve from them")

    formats = Counter()
    sizes: Counter = Counter()
    for m in inv.modules.values():
        key = (m.kind, "mtp" if inv.is_mtp(m) else "main", m.format)
        formats[key] += 1
        sizes[key] += m.nbytes
    return PreflightReport(
        variant=variant.name,
        root=str(root),
        tp=tp,
        identity={"config_sha256": verified.config_sha256, "index_sha256": verified.index_sha256,
                  **({"hf_quant_config_sha256": source.sha256} if source.sha256 else {})},
        declared={"format": want.format, "quant_algo": str(declared_algo), "vllm_method": variant.quantization,
                  "source": source.source},
        tensors=inv.tensor_count,
        total_gib=inv.total_bytes / GIB,
        header_only_shards=inv.header_only_shards,
        formats=[
            {"kind": k, "part": p, "format": f, "modules": formats[(k, p, f)], "gib": sizes[(k, p, f)] / GIB}
            for (k, p, f) in sorted(formats)
        ],
        mtp={"layers": mtp_layers, "routed_expert_formats": mtp_formats, "excluded_by_override": bool(mtp_fix)},
        patches={"checkpoint": needed, "declared": list(variant.patches), "platform": _platform_patches(text, variant)},
        memory={
            "weights_gib_per_rank": weights, "kv_gib": kv, "reserve_gib": ACTIVATION_RESERVE_GIB,
            "total_gib": total, "budget_gib": GB10_MEMORY_GIB, "free_at_boot_gib": GB10_FREE_AT_BOOT_GIB,
            "language_model_only": lm_only,
        },
        spelling={"kind": spelling.kind, "nested": spelling.nested, "flat": spelling.flat,
                  "verdict": spelling.verdict(series, image)},
        problems=problems,
        notes=notes,
    )
