"""Exclude a BF16 MTP predictor from quantization: the `--hf-overrides` for nvidia/GLM-5.3-Flash-NVFP4.

That checkpoint ships layer 45 (its MTP predictor, 288 routed experts included) in BF16 but does not list
it in `quantization_config.ignore`, so vLLM builds it NVFP4 and the MoE weight loader fails (width 512 vs
1024). The fix extends `ignore` with, for every predictor layer i in
[num_hidden_layers, num_hidden_layers + num_nextn_predict_layers), the four spellings a layer can have
on either side of vLLM's name mappers:

    model.layers.{i}.*                   the draft model's own prefix (built with prefix "")
    model.language_model.layers.{i}.*    the HF checkpoint spelling
    language_model.model.layers.{i}.*    the same after Glm5NextForConditionalGeneration's mapper
    model.layers.{i}.mtp_block.*         the loader-side parameter names

Why an --hf-overrides value and not a vLLM patch: the fault is in the checkpoint's metadata, not in
vLLM; the value is derived from the verified config.json of the checkpoint being served (`serve-args`
only calls this after the identity pins matched), touches nothing for any other checkpoint, and needs no
image rebuild. vLLM 0.33 applies a dict-valued override by replacing the attribute
(`ModelConfig._apply_dict_overrides`: quantization_config is a plain dict, not a sub-config), so the
override carries the whole quantization_config with the checkpoint's own entries preserved. The key
written is `ignore`: vLLM 0.33 reads `ignore` and falls back to `exclude_modules`
(`ModelOptQuantConfigBase.from_config`), 0.30-0.32 read only `ignore`.

Every malformed input fails closed: no quantization_config, a non-ModelOpt or MIXED_PRECISION config
(where unlisted layers are unquantized already), no ignore list, non-string entries, missing or
contradictory layer counts, no predictor layers.
"""

from __future__ import annotations

import copy
from fnmatch import fnmatchcase

from patchkit.errors import PatchkitError
from patchkit.vllm_rules import hf_to_vllm, module_prefix

MAX_PREDICTOR_LAYERS = 64
_HF = "model.language_model.layers.{i}.*"
# The four spellings of the module docstring, the mapped ones through vllm_rules' one mapper.
SPELLINGS = (module_prefix(_HF, mtp=True), _HF, hf_to_vllm(_HF), "model.layers.{i}.mtp_block.*")


class MtpIgnoreRefused(PatchkitError):
    """A config.json the MTP ignore cannot be derived from (exit 2): the `field` at fault (a dotted path,
    "text_config.num_hidden_layers"; "top level" for the document), what it was `expected` to be and what
    was `found` (None when absent)."""

    def __init__(self, field: str, expected: str, found: object = None):
        self.field, self.expected, self.found = field, expected, found
        shown = "nothing" if found is None else repr(found)[:200]
        super().__init__(f"config.json: {field}: expected {expected}, found {shown}")


def _count(config: dict, key: str) -> int | None:
    """A layer count from the top level or text_config; both present must agree."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise MtpIgnoreRefused("text_config", "an object", text)
    values = {where: src[key] for where, src in ((key, config), (f"text_config.{key}", text or {})) if key in src}
    for where, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MtpIgnoreRefused(where, "a non-negative integer", value)
    if len(set(values.values())) > 1:
        raise MtpIgnoreRefused(key, "one value at the top level and in text_config", values)
    return next(iter(values.values()), None)


def predictor_layers(config: dict) -> range:
    """The MTP predictor layer indices; PatchkitError when the config declares none."""
    hidden = _count(config, "num_hidden_layers")
    nextn = _count(config, "num_nextn_predict_layers")
    if hidden is None or hidden == 0:
        raise MtpIgnoreRefused("num_hidden_layers", "a layer count above 0 to place the MTP predictor after", hidden)
    if not nextn:
        raise MtpIgnoreRefused("num_nextn_predict_layers", "1 or more MTP predictor layers to exclude", nextn)
    if nextn > MAX_PREDICTOR_LAYERS:  # four patterns a layer: a hostile 10^9 would never finish
        raise MtpIgnoreRefused("num_nextn_predict_layers", f"at most {MAX_PREDICTOR_LAYERS} MTP predictor layers "
                               "(GLM-5.3-Flash and DeepSeek-V3 have 1)", nextn)
    return range(hidden, hidden + nextn)


def patterns(layers: range) -> list[str]:
    return [spelling.format(i=i) for i in layers for spelling in SPELLINGS]


def _covered(pattern: str, entries: list[str]) -> bool:
    """Is the pattern already listed, literally or under one of the checkpoint's own wildcards?"""
    probe = pattern.replace("*", "probe")
    return pattern in entries or any(fnmatchcase(probe, entry) for entry in entries)


def extended_quantization_config(config: dict) -> dict | None:
    """quantization_config with the predictor layers appended to `ignore`; None when already listed."""
    if not isinstance(config, dict):
        raise MtpIgnoreRefused("top level", "an object", config)
    quant = config.get("quantization_config")
    if quant is None:
        raise MtpIgnoreRefused("quantization_config", "a table to exclude the MTP predictor from")
    if not isinstance(quant, dict):
        raise MtpIgnoreRefused("quantization_config", "an object", quant)
    if quant.get("quant_method") != "modelopt":
        raise MtpIgnoreRefused("quantization_config.quant_method", "'modelopt'", quant.get("quant_method"))
    if "quantization" in quant:
        raise MtpIgnoreRefused("quantization_config.quantization", "the flat config.json form, not the nested "
                               "hf_quant_config one", quant["quantization"])
    algo = quant.get("quant_algo")
    if not isinstance(algo, str) or not algo:
        raise MtpIgnoreRefused("quantization_config.quant_algo", "an algorithm name", algo)
    if algo.upper() == "MIXED_PRECISION":
        raise MtpIgnoreRefused("quantization_config.quant_algo", "one that quantizes unlisted layers (MIXED_PRECISION "
                               "leaves them unquantized: an MTP ignore does not apply)", algo)
    key = "ignore" if "ignore" in quant else "exclude_modules" if "exclude_modules" in quant else None
    if key is None:
        raise MtpIgnoreRefused("quantization_config.ignore", "an `ignore` or `exclude_modules` list")
    entries = quant[key]
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise MtpIgnoreRefused(f"quantization_config.{key}", "a list of strings", entries)
    missing = [p for p in patterns(predictor_layers(config)) if not _covered(p, entries)]
    if not missing:
        return None
    extended = copy.deepcopy(quant)
    extended["ignore"] = [*entries, *missing]
    return extended


def hf_overrides(config: dict) -> dict | None:
    """The --hf-overrides value for a verified config.json, or None when the checkpoint lists its MTP."""
    extended = extended_quantization_config(config)
    return None if extended is None else {"quantization_config": extended}
