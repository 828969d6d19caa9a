"""`patchkit preflight PATH`: will this checkpoint load with this variant in its image, before a 10-minute boot?

In order: the identity pins (fail closed, nothing parsed before they match); the config's declared
layout against the variant; the safetensors headers of every indexed shard (no tensor data read); an
inventory of every module's storage format; the storage checked against what the pinned vLLM 0.33 will
build for each module (patchkit.vllm_rules mirrors its exclusion and per-layer resolution rules); the MTP
predictor; the patches this checkpoint needs (each patch's own `[needed_when]`, checkpoint/needs.py),
against the variant's list and the image's series; and the weight memory one GB10 rank holds at TP=N
beside the pinned KV pool. The mirror is a fast offline check; `smoke --cpu` runs vLLM's own code.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from patchkit.checkpoint.headers import read_headers
from patchkit.checkpoint.identity import CONFIG, INDEX, read_checkpoint_file, sha256_bytes, verify_identity
from patchkit.checkpoint.inventory import Inventory, Module, inventory
from patchkit.checkpoint.memory import (
    ACTIVATION_RESERVE_GIB,
    GB10_FREE_AT_BOOT_GIB,
    GB10_MEMORY_GIB,
    GIB,
    per_rank_bytes,
)
from patchkit.checkpoint.mtp_ignore import extended_quantization_config
from patchkit.checkpoint.needs import Need, Rules, rules_for
from patchkit.checkpoint.quant_config import read_declared
from patchkit.checkpoint.report import PreflightReport
from patchkit.checkpoint.spelling import nested_loaders, spelling_of, weight_map_names
from patchkit.errors import PatchkitError
from patchkit.patching.patchset import PatchSet
from patchkit.variants.definitions import Variant, load_variants
from patchkit.variants.pins import resolve_pins
from patchkit.vllm_rules import (
    MIXED_PRECISION,
    QUANTIZED_KINDS,
    UNQUANTIZED_STORAGE,
    CompressedTensors,
    loads,
    mapped_excludes,
    modelopt_excluded,
    module_prefix,
    weight_only,
)

LINEAR_PARAMS = frozenset({"weight", "weight_packed"})  # a module holding one of these is a linear layer


def _vllm_module(module: Module) -> str:
    """The vLLM layer a checkpoint module loads into: every routed expert into its layer's experts."""
    if module.kind == "routed_expert":
        return module.name.split(".mlp.experts.", 1)[0] + ".mlp.experts"
    return module.name


def _expected_algo(variant: Variant, quant: dict, inv: Inventory, m: Module, excludes: list[str],
                   ct: CompressedTensors | None, rules: Rules) -> tuple[str | None, list[str]]:
    """(algorithm vLLM will build module `m` with, the patches it needs for that) under the declared config."""
    mtp = inv.is_mtp(m)
    prefix = module_prefix(_vllm_module(m), mtp)
    algo = variant.checkpoint.quant_algo.upper()
    if ct is not None:
        return (ct.algo(prefix, m.kind), []) if m.kind in QUANTIZED_KINDS else (None, [])
    if algo == MIXED_PRECISION:
        layers = quant.get("quantized_layers") or {}
        entry = layers.get(m.name)
        if entry is None and m.kind == "routed_expert":
            entry = next((v for k, v in layers.items() if k.startswith(_vllm_module(m) + ".")), None)
        if entry is None:
            return None, []
        # Stock vLLM resolves the target's quantized kinds; a patch's quantized rule says what else it builds.
        extenders = rules.extenders(m.kind, "mtp" if mtp else "main")
        if extenders or (m.kind in QUANTIZED_KINDS and not mtp):
            return entry["quant_algo"].upper(), extenders
        return None, []
    if m.kind not in QUANTIZED_KINDS or modelopt_excluded(prefix, excludes):
        return None, []
    if algo == "NVFP4" and weight_only(quant):
        algo = "W4A16_NVFP4"
    return algo, []


def _check_layout(variant: Variant, quant: dict, inv: Inventory, excludes: list[str],
                  rules: Rules) -> tuple[dict, dict[str, set[str]]]:
    """Mismatches grouped by (kind, part, stored, built), and the modules each patch is needed for."""
    mismatches: dict[tuple, list[str]] = defaultdict(list)
    hits: dict[str, set[str]] = defaultdict(set)
    fmt = variant.checkpoint.format
    ct = CompressedTensors(quant, "quantization_config") if fmt == "compressed-tensors" else None
    for m in inv.modules.values():
        if m.format in ("F32", "other") and not any(t.rsplit(".", 1)[-1] in LINEAR_PARAMS for t in m.tensors):
            continue  # bare parameters, norms, taps: never quantized
        algo, patches = _expected_algo(variant, quant, inv, m, excludes, ct, rules)
        part = "mtp" if inv.is_mtp(m) else "main"
        if algo is None:
            if m.format not in UNQUANTIZED_STORAGE:
                mismatches[(m.kind, part, m.format, "unquantized")].append(m.name)
        elif m.format not in loads(fmt, algo):
            mismatches[(m.kind, part, m.format, algo)].append(m.name)
        else:
            for patch in patches:
                hits[patch].add(f"{part} {m.kind}")
    return mismatches, hits


class InvalidModelConfig(PatchkitError):
    """A checkpoint's config.json (`path`) whose `field` is not `expected` ("an object", "a positive whole
    number"): it is `found` (None when absent) (exit 2)."""

    def __init__(self, path: Path, field: str, expected: str, found: object):
        self.path, self.field, self.expected, self.found = path, field, expected, found
        shown = "missing" if found is None else f"{found!r:.200}"
        super().__init__(f"{path}: {field} is not {expected}: {shown}")


class NoMatchingVariant(PatchkitError):
    """A checkpoint whose pins match no pinned variant (exit 2): its `root`, the `config_sha256` it has and
    the `partial` variants whose known pins it matches (they pin only part of the checkpoint)."""

    def __init__(self, root: Path, config_sha256: str, partial: tuple[str, ...]):
        self.root, self.config_sha256, self.partial = root, config_sha256, partial
        hint = (f"; its known pins match variant {', '.join(partial)}, which pins only part of the checkpoint"
                if partial else "")
        super().__init__(f"{root} matches no pinned variant (config sha256 {config_sha256}){hint}; name it with "
                         "--variant and give --pin-config/--pin-index for an unpinned one")


def detect_variant(root: Path, images_dir: Path) -> Variant:
    """The pinned variant whose pins these files match (hashing only, nothing parsed)."""
    digests = [sha256_bytes(read_checkpoint_file(Path(root), name)) for name in (CONFIG, INDEX)]
    variants = load_variants(images_dir).values()
    for variant in variants:
        pins = variant.checkpoint.pins
        if (pins.config_sha256, pins.index_sha256) == tuple(digests):
            return variant
    # A partly pinned variant is never chosen by hashing (its unknown pin is unchecked), only named.
    partial = tuple(v.name for v in variants if not v.pinned and any(
        own == digest for own, digest in zip((v.checkpoint.pins.config_sha256, v.checkpoint.pins.index_sha256), digests,
                                             strict=True)))
    raise NoMatchingVariant(root, digests[0], partial)


def _missing(needs: dict[str, Need], patchset: PatchSet, series: Sequence[str], variant: Variant) -> tuple[list[Need], list[str]]:
    """The needed patches the image's series lacks, and one problem for each naming the variant, the image
    and why the patch is needed."""
    missing = [needs[pid] for pid in patchset.order if pid in needs and pid not in series]
    problems = [f"image {variant.image} lacks patch {n.patch}, which variant {variant.name} needs for this checkpoint: "
                f"{n.why} (here: {'; '.join(n.found)})" for n in missing]
    return missing, problems


def preflight(root: Path, variant: Variant, *, series: Sequence[str], patchset: PatchSet, tp: int | None = None,
              pin_config: str | None = None, pin_index: str | None = None) -> PreflightReport:
    """Run every check of `root` served as `variant` by its image, whose patch series is `series` (ids of
    `patchset`, the set whose `[needed_when]` rules are judged); PatchkitError when identity or structure
    fails, else a report (ok or not)."""
    root = Path(root)
    series = tuple(series)
    tp = tp or variant.serve.tensor_parallel_size
    verified = verify_identity(root, resolve_pins(variant, pin_config, pin_index))
    config = verified.config
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise InvalidModelConfig(root / CONFIG, "text_config", "an object", text)
    source = read_declared(root, config, variant)
    quant = source.config
    declared_algo = source.declared_algo
    want = variant.checkpoint
    layers = text.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        raise InvalidModelConfig(root / CONFIG, "num_hidden_layers", "a positive whole number", layers)
    inv = inventory(read_headers(verified), layers)
    spelling = spelling_of(weight_map_names(verified.index, str(root / INDEX)))
    rules = rules_for(patchset.series(), text, variant, spelling)

    problems: list[str] = []
    notes: list[str] = []
    if source.sha256:
        notes.append(f"vLLM reads the layer table from {source.source} (sha256 {source.sha256}), which no pin covers")
    excludes = mapped_excludes(list(quant.get("ignore", quant.get("exclude_modules", [])) or []))
    mismatches, hits = _check_layout(variant, quant, inv, excludes, rules)

    # The BF16 predictor outside `ignore`: the mismatch serve-args' override removes.
    mtp_fix = want.exclude_mtp_from_quant and any(part == "mtp" for (_, part, _, _) in mismatches)
    if mtp_fix:
        extended = extended_quantization_config(config)
        if extended is not None:
            mismatches, hits = _check_layout(variant, extended, inv, mapped_excludes(extended["ignore"]), rules)
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

    # The patches: the layout's must be the variant's own list; every need must be in the image's series.
    needs = rules.needs(hits)
    whens = {pid: patchset.patch(pid).needed_when for pid in needs}
    kind = {pid: "checkpoint" if when and when.quantized else "spelling" if when and when.spelling else "platform"
            for pid, when in whens.items()}
    by_layout = [pid for pid in patchset.order if kind.get(pid) == "checkpoint"]
    for patch in by_layout:
        if patch not in variant.patches:
            problems.append(f"the checkpoint needs patch {patch} ({', '.join(sorted(hits[patch]))}); variant {variant.name} does not list it")
    for patch in variant.patches:
        if patch not in by_layout:
            notes.append(f"variant lists patch {patch}, which this checkpoint's layout does not need")
    missing, lacking = _missing(needs, patchset, series, variant)
    problems += lacking
    loaders = nested_loaders(patchset.series())
    if spelling.handled_by(series, loaders) is False and not loaders:  # no patch of the set could load it
        problems.append(spelling.verdict(series, loaders, f"image {variant.image}"))

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

    formats: Counter[tuple[str, str, str]] = Counter()  # (kind, part, format) -> modules
    sizes: Counter[tuple[str, str, str]] = Counter()
    for m in inv.modules.values():
        key = (m.kind, "mtp" if inv.is_mtp(m) else "main", m.format)
        formats[key] += 1
        sizes[key] += m.nbytes
    return PreflightReport(
        variant=variant.name,
        image=variant.image,
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
        patches={"checkpoint": by_layout, "declared": list(variant.patches),
                 "platform": [pid for pid in patchset.order if kind.get(pid) == "platform"],
                 "spelling": [pid for pid in patchset.order if kind.get(pid) == "spelling"],
                 "series": list(series), "missing": [n.to_dict() for n in missing]},
        memory={
            "weights_gib_per_rank": weights, "kv_gib": kv, "reserve_gib": ACTIVATION_RESERVE_GIB,
            "total_gib": total, "budget_gib": GB10_MEMORY_GIB, "free_at_boot_gib": GB10_FREE_AT_BOOT_GIB,
            "language_model_only": lm_only,
        },
        spelling={"kind": spelling.kind, "nested": spelling.nested, "flat": spelling.flat,
                  "verdict": spelling.verdict(series, loaders, f"image {variant.image}")},
        problems=problems,
        notes=notes,
    )
