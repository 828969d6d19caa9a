"""The quantization config as the pinned vLLM reads it, and per-module resolution as vLLM resolves it.

Where it is read from (vllm/model_executor/model_loader/weight_utils.py::get_quant_config, 0.33.0):
`quantization_config` in config.json, else in its `text_config`, else `compression_config`; for
`modelopt_mixed` a config.json table without `quantized_layers` falls through to the file route, as does
a config.json with no table at all: the one `*.json` in the checkpoint ending in the method's config
file name (`hf_quant_config.json` for every ModelOpt method), which for `modelopt`/`modelopt_mixed` must
name `producer.name == "modelopt"`. Its `{"quantization": {...}}` nesting and `exclude_modules` are
flattened the way ModelOptQuantConfigBase.from_config reads them.

compressed-tensors resolution mirrors CompressedTensorsConfig (compressed_tensors.py `get_scheme_dict`,
`_quantization_scheme_map_from_config`, `apply_vllm_mapper`; compressed_tensors/utils.py
`should_ignore_layer`, `find_matched_target`; utils/config_utils.py `is_equal_or_regex_match`): every
config group's targets in order (a later group's target overrides), layer-path targets and `ignore`
entries mapped to vLLM's names (`re:` patterns and class names are not), `ignore` first, then the layer
name, its fused shards (gate_up_proj -> gate_proj, up_proj), then the module class name by substring;
a routed-experts layer is resolved through its expert 0's gate/up/down projections, which must agree.
tests/test_preflight.py checks this mirror against vLLM's own functions on the real configs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from patchkit.errors import PatchkitError
from patchkit.jsondata import load_json_object
from patchkit.untrusted import read_file
from patchkit.checkpoint.headers import sha256_bytes
from patchkit.checkpoint.shapes import HfQuantConfig, QuantTable, conform

if TYPE_CHECKING:
    from patchkit.variants.definitions import Variant

HF_QUANT_CONFIG = "hf_quant_config.json"
MODELOPT_METHODS = ("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed")
# Glm5NextForConditionalGeneration.packed_modules_mapping (vllm/models/glm5next/common/model.py).
PACKED_MODULES = {"gate_up_proj": ["gate_proj", "up_proj"]}
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class QuantSource:
    config: dict  # flat: quant_method, quant_algo | format, ignore, quantized_layers, config_groups
    source: str  # where vLLM reads it: "config.json", "config.json text_config", "hf_quant_config.json"
    sha256: str | None = None  # of hf_quant_config.json (not pinned: reported so the user can check it)

    @property
    def declared_algo(self) -> str | None:
        """ModelOpt's quant_algo, or compressed-tensors' format."""
        return self.config.get("quant_algo") or self.config.get("format")


def hf_to_vllm(name: str) -> str:
    """Glm5NextForConditionalGeneration's weight-name mapper (inherited from Glm4vForConditionalGeneration)."""
    for old, new in (("model.visual.", "visual."), ("model.language_model.", "language_model.model."),
                     ("lm_head.", "language_model.lm_head.")):
        if name.startswith(old):
            return new + name[len(old):]
    return "language_model.lm_head" if name == "lm_head" else name


def _flatten_modelopt(data: dict, where: str) -> dict:
    nested = data.get("quantization")
    if nested is None:
        return dict(data)
    if not isinstance(nested, dict):
        raise PatchkitError(f"{where}: 'quantization' is not an object")
    flat = {"quant_method": "modelopt", **nested}
    if "exclude_modules" in flat and "ignore" not in flat:
        flat["ignore"] = flat["exclude_modules"]
    return flat


def read_declared(root: Path, config: dict, variant: Variant) -> QuantSource:
    """The quantization table vLLM reads for `variant`, refused unless it declares the variant's own format
    and algorithm (else this is another checkpoint): the one check preflight and serve-args share."""
    source = read_quant_config(root, config, variant.quantization)
    method, algo = source.config.get("quant_method"), source.declared_algo
    want = variant.checkpoint
    if method != want.format or str(algo).upper() != want.quant_algo.upper():
        raise PatchkitError(f"{root}/config.json declares {method} {algo}; variant {variant.name} expects "
                            f"{want.format} {want.quant_algo}: another checkpoint, or the variant is wrong")
    return source


def _table(table: dict, where: str, at: str) -> dict:
    """The table as it is, once the keys patchkit resolves layers with have the shapes vLLM reads."""
    conform(table, QuantTable, where, at)
    return dict(table)


def read_quant_config(root: Path, config: dict, vllm_method: str) -> QuantSource:
    """The quantization table vLLM uses for this checkpoint under `vllm_method` (PatchkitError if none)."""
    table, source, at = config.get("quantization_config"), "config.json", "$.quantization_config"
    text = config.get("text_config")
    if table is None and isinstance(text, dict) and text.get("quantization_config") is not None:
        table, source, at = text["quantization_config"], "config.json text_config", "$.text_config.quantization_config"
    if table is None and config.get("compression_config") is not None:
        table, source, at = config["compression_config"], "config.json compression_config", "$.compression_config"
    if table is not None and not isinstance(table, dict):
        raise PatchkitError(f"{root / 'config.json'}: {source} quantization table is not an object")
    # A table declaring another algorithm is returned as it is: the caller names the contradiction.
    mixed_without_layers = (vllm_method == "modelopt_mixed" and "quantized_layers" not in (table or {})
                            and str((table or {}).get("quant_algo", "MIXED_PRECISION")).upper() == "MIXED_PRECISION")
    if table is not None and not mixed_without_layers:
        return QuantSource(_table(table, str(root / "config.json"), at), source)
    if vllm_method not in MODELOPT_METHODS:
        raise PatchkitError(f"{root / 'config.json'}: no quantization_config for {vllm_method}")
    files = sorted(p for p in root.glob("*.json") if p.name.endswith(HF_QUANT_CONFIG))
    if len(files) != 1:
        found = f"found {[p.name for p in files]}" if files else "found none"
        raise PatchkitError(
            f"{root}: config.json has no quantization_config{' with quantized_layers' if table else ''}, and vLLM "
            f"then reads {vllm_method}'s from exactly one *{HF_QUANT_CONFIG} ({found})"
        )
    raw = read_file(files[0], "config")
    data = load_json_object(raw, str(files[0]))
    shape = conform(data, HfQuantConfig, str(files[0]), "$")
    if vllm_method in ("modelopt", "modelopt_mixed") and (shape.producer is None or shape.producer.name != "modelopt"):
        raise PatchkitError(f"{files[0]}: vLLM refuses it for {vllm_method}: producer.name is not 'modelopt'")
    flat = _flatten_modelopt(data, str(files[0]))
    return QuantSource(_table(flat, str(files[0]), "$.quantization" if "quantization" in data else "$"),
                       files[0].name, sha256_bytes(raw))


# ---------------------------------------------------------------- compressed-tensors


# A `re:` target is the checkpoint's (a folder from outside), so a match has a time budget: `regex` (re's
# superset, mrab) is the maintained engine with a per-match timeout; `re` has none, and a pattern such as
# `(a|a)*b` backtracks exponentially. Its default VERSION0 keeps re's semantics.
MATCH_TIMEOUT_S = 1.0


class SlowPattern(PatchkitError):
    """A config's `re:` target that does not finish matching one module name within MATCH_TIMEOUT_S (exit 2)."""

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


def _map_target(target: str) -> str:
    return hf_to_vllm(target) if "." in target and not target.startswith("re:") else target


class CompressedTensors:
    """Which config group (if any) vLLM gives each layer of a compressed-tensors checkpoint."""

    def __init__(self, quant: dict, where: str) -> None:
        groups = quant.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise PatchkitError(f"{where}: config_groups is not an object")
        self.default_format = quant.get("format")
        self.targets: dict[str, dict] = {}
        for name, group in groups.items():
            if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
                raise PatchkitError(f"{where}: config group {name!r} has no targets list")
            for target in group["targets"]:
                self.targets[_map_target(target)] = {
                    "group": name, "weights": group.get("weights"), "input_activations": group.get("input_activations"),
                    "format": group.get("format") or self.default_format,
                }
        if "Linear" in self.targets and "RoutedExperts" not in self.targets:
            self.targets["RoutedExperts"] = self.targets["Linear"]  # _add_fused_moe_to_target_scheme_map
        self.ignore = [_map_target(e) for e in quant.get("ignore") or []]
        for pattern in (*self.targets, *self.ignore):
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except (re.error, RecursionError, OverflowError) as exc:
                    raise PatchkitError(f"{where}: {pattern!r} is not a regular expression vLLM can compile: {exc}") from None

    def _ignored(self, layer: str) -> bool:
        if any(_match(layer, e) for e in self.ignore):
            return True
        proj = layer.rsplit(".", 1)[-1]
        if proj not in PACKED_MODULES:
            return False
        shards = [any(_match(layer.replace(proj, s), e) for e in self.ignore) for s in PACKED_MODULES[proj]]
        if any(shards) and not all(shards):
            raise PatchkitError(f"{layer}: some of its fused shards are ignored and some not; vLLM refuses it")
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
            raise PatchkitError(f"{experts}: its expert projections resolve to different schemes; vLLM refuses the layer")
        return schemes[0]


def ct_algo(scheme: dict | None) -> str | None:
    """The storage a resolved scheme loads (preflight.ACCEPTS keys): None = unquantized."""
    if scheme is None or scheme.get("weights") is None:
        return None
    weights = scheme["weights"]
    if scheme.get("format") == "nvfp4-pack-quantized" or (weights.get("num_bits") == 4 and weights.get("type") == "float"):
        return "nvfp4-pack-quantized"
    if weights.get("num_bits") == 8 and weights.get("type") == "float":
        return "float-quantized"
    return f"compressed-tensors {scheme.get('format')}"
