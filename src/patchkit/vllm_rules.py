"""vLLM's loading rules that patchkit mirrors, in one place: what the pinned vLLM (0.33) does with a GLM-5.3
checkpoint before it reads a tensor, so preflight, serve-args, the variant files and the CPU smoke's
judgement read one table each and cannot drift apart.

- which quantization method a layout routes to (modelopt.py LINEAR_ALGOS and each config's
  override_quantization_method; config/model.py::_verify_quantization replaces a user-given
  --quantization with it, so a wrong one would hide the real loader: refused instead);
- the checkpoint-to-vLLM weight-name mapper (Glm4vForConditionalGeneration.hf_to_vllm_mapper, which
  Glm5NextForConditionalGeneration inherits) and where the MTP draft's layers live;
- which modules vLLM builds with the checkpoint's quant config, and which storage each built layer loads;
- ModelOpt's exclusion (apply_vllm_mapper, is_layer_excluded) and its weight-only NVFP4 reroute;
- compressed-tensors' per-layer resolution (get_scheme_dict and its helpers);
- which modules every tensor-parallel rank holds whole.

Only the standard library (and `regex`, imported when a `re:` target is matched): the smoke's workers
import it inside the vLLM environment. tests/test_preflight.py runs vLLM's own functions against the mirror.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from patchkit.errors import PatchkitError


class QuantConfigRefused(PatchkitError):
    """A checkpoint's quantization config that vLLM would not load, at `where` (the config, or the layer it
    resolves): `problem` says what vLLM's own code refuses in it (exit 2)."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.where, self.problem = where, problem

# ---------------------------------------------------------------- the method a layout routes to

# The quantization_config.quant_method values whose loader routes a layout to a method.
LOADER_FORMATS = ("modelopt", "compressed-tensors")
# Which vLLM 0.33 quantization method owns each ModelOpt quant_algo.
MODELOPT_METHODS: dict[str, str] = {
    "FP8": "modelopt",
    "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
    "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4",
    "W4A16_NVFP4": "modelopt_fp4",
    "MXFP8": "modelopt_mxfp8",
    "MIXED_PRECISION": "modelopt_mixed",
}
# The ModelOpt methods, each reading its table from hf_quant_config.json when config.json has none.
MODELOPT_METHOD_NAMES = frozenset(MODELOPT_METHODS.values())


class UnloadableCheckpoint(PatchkitError):
    """A checkpoint layout vLLM 0.33 has no loader for (exit 2): its `fmt` and `quant_algo`, and `where`
    (the file, table and key naming it; "" when the caller adds it)."""

    def __init__(self, fmt: str, quant_algo: str, where: str = ""):
        self.fmt, self.quant_algo, self.where = fmt, quant_algo, where
        lead = f"{where}: " if where else ""
        if fmt == "modelopt":
            super().__init__(f"{lead}ModelOpt quant_algo {quant_algo!r} is not one vLLM 0.33 loads "
                             f"(known: {', '.join(sorted(MODELOPT_METHODS))})")
        else:
            super().__init__(f"{lead}checkpoint format {fmt!r} is not one of {', '.join(LOADER_FORMATS)}")


class WrongQuantMethod(PatchkitError):
    """A vLLM quantization method that does not load the checkpoint's layout (exit 2): `where` names it
    (file, table, key), the layout's `fmt` and `quant_algo`, the `method` given and the one `needed`."""

    def __init__(self, where: str, fmt: str, quant_algo: str, method: str, needed: str):
        self.where, self.fmt, self.quant_algo, self.method, self.needed = where, fmt, quant_algo, method, needed
        detail = (" (in vLLM 0.33 `modelopt` is the FP8 config; the day-0 fork's loader names do not carry over)"
                  if method == "modelopt" and needed != "modelopt" else "")
        super().__init__(f"{where}: {method!r} does not load a {fmt} {quant_algo} checkpoint in vLLM 0.33; "
                         f"it needs {needed!r}{detail}")


def expected_method(fmt: str, quant_algo: str) -> str:
    """The vLLM 0.33 method for a checkpoint layout; PatchkitError for a layout it cannot load."""
    if fmt == "compressed-tensors":
        return "compressed-tensors"
    if fmt == "modelopt":
        method = MODELOPT_METHODS.get(quant_algo.upper())
        if method is None:
            raise UnloadableCheckpoint(fmt, quant_algo)
        return method
    raise UnloadableCheckpoint(fmt, quant_algo)


def check_method(fmt: str, quant_algo: str, method: str, where: str) -> None:
    """Refuse a quantization method that does not match the checkpoint layout, naming the right one.
    `where` leads the message: the file, table and key that name `method`."""
    try:
        right = expected_method(fmt, quant_algo)
    except UnloadableCheckpoint:
        raise UnloadableCheckpoint(fmt, quant_algo, where) from None
    if method != right:
        raise WrongQuantMethod(where, fmt, quant_algo, method, right)


# ---------------------------------------------------------------- names

# Glm4vForConditionalGeneration.hf_to_vllm_mapper's orig_to_new_prefix (glm4_1v.py), in its order:
# WeightsMapper replaces each prefix a name starts with, one after the other.
HF_TO_VLLM_PREFIXES = (
    ("lm_head.", "language_model.lm_head."),
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
)
HF_LANGUAGE_MODEL = "model.language_model."


def hf_to_vllm(name: str) -> str:
    """A checkpoint name (weight, or a quant config's layer entry) as the mapper renames it."""
    for old, new in HF_TO_VLLM_PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
    return name


def module_prefix(module: str, mtp: bool = False) -> str:
    """The prefix vLLM builds a checkpoint module under: the target's is what the mapper makes of the
    module's weights (`lm_head` -> `language_model.lm_head`); the MTP draft is built with prefix ""
    (mtp.py ~115), so its layers are `model.layers.{i}...`."""
    if mtp:
        return module.replace(HF_LANGUAGE_MODEL, "model.", 1)
    return hf_to_vllm(module + ".")[:-1]


# ---------------------------------------------------------------- which modules are quantized, and what loads

# Modules vLLM 0.33 builds with the checkpoint's quant config (glm5next/common/model.py): routed experts
# (FusedMoE), shared experts and the dense MLP (Glm5NextMLP linears), the LM head (ParallelLMHead).
# KDA, MLA and the indexer get quant_config=None (kda.py ~210, model.py ~408, attention.py ~242), as do
# the vision tower and the embeddings; the MTP eh_proj is a plain nn.Linear. Under ModelOpt
# MIXED_PRECISION only the target's are resolved: the draft's `model.layers.{i}` prefixes match no
# `quantized_layers` entry. A patch may build more (its [needed_when] quantized rule says which).
QUANTIZED_KINDS = frozenset({"routed_expert", "shared_expert", "dense_mlp", "lm_head"})
MIXED_PRECISION = "MIXED_PRECISION"
UNQUANTIZED = "None"  # the algorithm of a layer built without a quantized method (quantprobe's word)
# What a layer built unquantized loads: the plain dtypes.
UNQUANTIZED_STORAGE = frozenset({"BF16", "F16", "F32"})
# (checkpoint format, algorithm a layer is built with) -> the storage formats its weight loader reads
# (patchkit.checkpoint.inventory.FORMATS). Algorithms are ModelOpt's quant_algo words, which the
# quantprobe patch prints for compressed-tensors layers too.
LOADS: dict[tuple[str, str], frozenset[str]] = {
    ("modelopt", "NVFP4"): frozenset({"NVFP4"}),
    ("modelopt", "W4A16_NVFP4"): frozenset({"NVFP4", "NVFP4A16"}),  # the input_scale, if stored, is not read
    ("modelopt", "MXFP8"): frozenset({"MXFP8"}),
    ("modelopt", "FP8"): frozenset({"FP8"}),
    ("modelopt", "FP8_PB_WO"): frozenset({"FP8-BLOCK"}),
    ("compressed-tensors", "NVFP4"): frozenset({"NVFP4-CT"}),
    ("compressed-tensors", "W4A16_NVFP4"): frozenset({"NVFP4-CT"}),
    ("compressed-tensors", "FP8"): frozenset({"FP8"}),  # a weight and its F32 scale
}


def loads(fmt: str, algo: str | None) -> frozenset[str]:
    """The storage formats a layer built with `algo` (None or "None": unquantized) loads, for a
    checkpoint of format `fmt`; empty for an algorithm no loader of that format has."""
    if algo is None or algo == UNQUANTIZED:
        return UNQUANTIZED_STORAGE
    return LOADS.get((fmt, algo), frozenset())


# ---------------------------------------------------------------- ModelOpt


def mapped_excludes(entries: list[str]) -> list[str]:
    """ModelOptQuantConfigBase.apply_vllm_mapper: `x*` -> `x`, `x.*`, then the name mapper."""
    out = []
    for entry in entries:
        wild = len(entry) >= 2 and entry[-1] == "*" and entry[-2] != "."
        out += [hf_to_vllm(e) for e in ([entry[:-1], entry[:-1] + ".*"] if wild else [entry])]
    return out


def modelopt_excluded(prefix: str, excludes: list[str]) -> bool:
    """ModelOptQuantConfigBase.is_layer_excluded (modelopt.py ~191): exact, substring, then fnmatch."""
    if prefix in excludes:
        return True
    bare = prefix.removeprefix("language_model.") if prefix.startswith("language_model.") else None
    for e in excludes:
        if e != prefix and (e in prefix or (bare is not None and e in bare)):
            return True
    return any(fnmatchcase(prefix, e) for e in excludes)


def weight_only(quant: dict) -> bool:
    """ModelOptNvFp4Config._from_config: NVFP4 with no input_activations in any group is W4A16_NVFP4."""
    groups = quant.get("config_groups")
    return isinstance(groups, dict) and bool(groups) and all(
        isinstance(g, dict) and g.get("input_activations") is None for g in groups.values()
    )


# ---------------------------------------------------------------- tensor parallelism

# Modules vLLM 0.33 builds replicated on every TP rank (the rest is split TP ways): the router
# (GateLinear is a ReplicatedLinear), MLA's fused q_a/kv_a projection (DeepSeekV2FusedQkvAProjLinear,
# disable_tp=True), the whole sparse indexer (ReplicatedLinear wq_b, wk_weights_proj disable_tp=True),
# KDA's f_a/g_a shards (replicated_shard_ids=(4, 5)), the MTP eh_proj (a plain nn.Linear), norms and
# hyper-connection parameters. Read from vllm/models/glm5next/common/{model,attention,kda,mtp}.py.
REPLICATED_KINDS = frozenset({"router", "indexer", "norm", "hyper_connection", "mtp_head"})
REPLICATED_ATTENTION = ("q_a_proj", "kv_a_proj_with_mqa", "f_a_proj", "g_a_proj", "q_a_layernorm",
                        "kv_a_layernorm", "o_norm")

# ---------------------------------------------------------------- compressed-tensors

# Glm5NextForConditionalGeneration.packed_modules_mapping (vllm/models/glm5next/common/model.py).
PACKED_MODULES = {"gate_up_proj": ["gate_proj", "up_proj"]}
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# The vLLM module class a checkpoint module loads into, for compressed-tensors' class-name targets.
CT_CLASS = {"gate_proj": "MergedColumnParallelLinear", "up_proj": "MergedColumnParallelLinear",
            "down_proj": "RowParallelLinear", "lm_head": "ParallelLMHead"}
# A `re:` target is the checkpoint's (a folder from outside), so a match has a time budget: `regex` (re's
# superset, mrab) is the maintained engine with a per-match timeout; `re` has none, and a pattern such as
# `(a|a)*b` backtracks exponentially. Its default VERSION0 keeps re's semantics.
MATCH_TIMEOUT_S = 1.0


class SlowPattern(PatchkitError):
    """A config's `re:` target, `pattern`, that does not finish matching the module name `value` within
    MATCH_TIMEOUT_S (exit 2)."""

    def __init__(self, pattern: str, value: str):
        self.pattern, self.value = pattern, value
        super().__init__(f"the quantization config's target {pattern!r} takes over {MATCH_TIMEOUT_S:g} s to match "
                         f"{value!r}: a pattern that backtracks catastrophically (vLLM would stall on it at load too); "
                         "refused")


def _match(value: str, target: str, contains: bool = False) -> bool:
    """is_equal_or_regex_match: `re:` regex from the start, else equality (or substring, ignoring case)."""
    if target.startswith("re:"):
        import regex

        try:  # compiled (and checked with re, as vLLM compiles it) once in CompressedTensors
            return regex.match(target[3:], value, timeout=MATCH_TIMEOUT_S) is not None
        except TimeoutError:
            raise SlowPattern(target, value) from None
    if contains:
        return target.lower() in value.lower()
    return target == value


class CompressedTensors:
    """Which config group (if any) vLLM gives each layer of a compressed-tensors checkpoint
    (compressed_tensors.py `get_scheme_dict`, `_quantization_scheme_map_from_config`, `apply_vllm_mapper`;
    compressed_tensors/utils.py `should_ignore_layer`, `find_matched_target`; utils/config_utils.py
    `is_equal_or_regex_match`): every config group's targets in order (a later group's target overrides),
    targets and `ignore` entries through the name mapper (a `re:` pattern or a class name starts with
    none of its prefixes), `ignore` first, then the layer name, its fused shards (gate_up_proj ->
    gate_proj, up_proj), then the module class name by substring; a routed-experts layer is resolved
    through its expert 0's gate/up/down projections, which must agree."""

    def __init__(self, quant: dict, where: str) -> None:
        groups = quant.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise QuantConfigRefused(where, "config_groups is not an object")
        self.default_format = quant.get("format")
        self.targets: dict[str, dict] = {}
        for name, group in groups.items():
            if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
                raise QuantConfigRefused(where, f"config group {name!r} has no targets list")
            for target in group["targets"]:
                self.targets[hf_to_vllm(target)] = {
                    "group": name, "weights": group.get("weights"), "input_activations": group.get("input_activations"),
                    "format": group.get("format") or self.default_format,
                }
        if "Linear" in self.targets and "RoutedExperts" not in self.targets:
            self.targets["RoutedExperts"] = self.targets["Linear"]  # _add_fused_moe_to_target_scheme_map
        self.ignore = [hf_to_vllm(e) for e in quant.get("ignore") or []]
        for pattern in (*self.targets, *self.ignore):
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except (re.error, RecursionError, OverflowError) as exc:
                    raise QuantConfigRefused(where, f"{pattern!r} is not a regular expression vLLM can compile: {exc}") from None

    def _ignored(self, layer: str) -> bool:
        if any(_match(layer, e) for e in self.ignore):
            return True
        proj = layer.rsplit(".", 1)[-1]
        if proj not in PACKED_MODULES:
            return False
        shards = [any(_match(layer.replace(proj, s), e) for e in self.ignore) for s in PACKED_MODULES[proj]]
        if any(shards) and not all(shards):
            raise QuantConfigRefused(layer, "some of its fused shards are ignored and some not; vLLM refuses it")
        return all(shards)

    def _target(self, layer: str, class_name: str) -> str | None:
        for target in self.targets:
            if _match(layer, target):
                return target
        proj = next((p for p in PACKED_MODULES if layer.endswith(p)), None)
        if proj is not None:
            found = [next((t for t in self.targets if _match(layer.replace(proj, s), t)), None) for s in PACKED_MODULES[proj]]
            if all(found):
                return found[0]
        return next((t for t in self.targets if _match(class_name, t, contains=True)), None)

    def target_of(self, layer: str, class_name: str) -> str | None:
        """The config-group target vLLM matches for a layer: None when ignored or matched by none."""
        return None if self._ignored(layer) else self._target(layer, class_name)

    def scheme(self, layer: str, class_name: str) -> dict | None:
        """get_scheme_dict for a vLLM layer name: None when ignored or matched by no group."""
        target = self.target_of(layer, class_name)
        return self.targets[target] if target is not None else None

    def moe_scheme(self, experts: str) -> dict | None:
        """CompressedTensorsMoEMethod.get_moe_method: expert 0's three projections must agree."""
        schemes = [self.scheme(f"{experts}.0.{p}", "RoutedExperts") for p in EXPERT_PROJECTIONS]
        if any(s != schemes[0] for s in schemes):
            raise QuantConfigRefused(experts, "its expert projections resolve to different schemes; vLLM refuses the layer")
        return schemes[0]

    def algo(self, prefix: str, kind: str) -> str | None:
        """The algorithm vLLM builds the layer at `prefix` with (a module of inventory kind `kind`); None:
        unquantized. A gate or up projection is resolved as the fused gate_up_proj it loads into."""
        if kind == "routed_expert":
            return ct_algo(self.moe_scheme(prefix))
        last = prefix.rsplit(".", 1)[-1]
        if last in ("gate_proj", "up_proj"):
            prefix = prefix[: -len(last)] + "gate_up_proj"
        return ct_algo(self.scheme(prefix, CT_CLASS.get(last, "Linear")))


def ct_algo(scheme: dict | None) -> str | None:
    """A resolved scheme's algorithm in ModelOpt's words, as the quantprobe patch names it (a key of
    LOADS): 4-bit float weights are NVFP4 (W4A16_NVFP4 without input activations), 8-bit float FP8;
    None = unquantized."""
    if scheme is None or scheme.get("weights") is None:
        return None
    weights = scheme["weights"]
    if scheme.get("format") == "nvfp4-pack-quantized" or (weights.get("num_bits") == 4 and weights.get("type") == "float"):
        return "W4A16_NVFP4" if scheme.get("input_activations") is None else "NVFP4"
    if weights.get("num_bits") == 8 and weights.get("type") == "float":
        return "FP8"
    return f"compressed-tensors {scheme.get('format')}"


# ---------------------------------------------------------------- the config as vLLM reads it

# transformers' Glm5NextTextConfig defaults (configuration_glm5_next.py), which vLLM's config takes for a
# key config.json leaves out: a patch's [needed_when] config rule is judged on them too.
TEXT_CONFIG_DEFAULTS = {"qk_rope_head_dim": 0, "index_topk": 2048}
