"""The quantization config as the pinned vLLM reads it.

Where it is read from (vllm/model_executor/model_loader/weight_utils.py::get_quant_config, 0.33.0):
`quantization_config` in config.json, else in its `text_config`, else `compression_config`; for
`modelopt_mixed` a config.json table without `quantized_layers` falls through to the file route, as does
a config.json with no table at all: the one `*.json` in the checkpoint ending in the method's config
file name (`hf_quant_config.json` for every ModelOpt method), which for `modelopt`/`modelopt_mixed` must
name `producer.name == "modelopt"`. Its `{"quantization": {...}}` nesting and `exclude_modules` are
flattened the way ModelOptQuantConfigBase.from_config reads them. How vLLM then resolves each layer
against the table is in patchkit.vllm_rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchkit.checkpoint.identity import sha256_bytes
from patchkit.checkpoint.shapes import HfQuantConfig, QuantTable, conform
from patchkit.errors import PatchkitError
from patchkit.jsondata import load_json_object
from patchkit.untrusted import read_file
from patchkit.variants.definitions import Variant
from patchkit.vllm_rules import MODELOPT_METHOD_NAMES

HF_QUANT_CONFIG = "hf_quant_config.json"


@dataclass(frozen=True)
class QuantSource:
    config: dict  # flat: quant_method, quant_algo | format, ignore, quantized_layers, config_groups
    source: str  # where vLLM reads it: "config.json", "config.json text_config", "hf_quant_config.json"
    sha256: str | None = None  # of hf_quant_config.json (not pinned: reported so the user can check it)

    @property
    def declared_algo(self) -> str | None:
        """ModelOpt's quant_algo, or compressed-tensors' format."""
        return self.config.get("quant_algo") or self.config.get("format")


class InvalidQuantConfig(PatchkitError):
    """A quantization table vLLM would not read as the variant needs (exit 2): the file `where` it is (a
    path, with the table when config.json holds several), the `field` at fault and the `problem`."""

    def __init__(self, where: str, field: str, problem: str):
        self.where, self.field, self.problem = where, field, problem
        super().__init__(f"{where}: {field} {problem}")


class QuantMismatch(PatchkitError):
    """A checkpoint that declares another format or algorithm than its variant (exit 2): the `config` file,
    the `variant`, what the checkpoint `declares` and what the variant `expects` ("modelopt NVFP4")."""

    def __init__(self, config: str, variant: str, declares: str, expects: str):
        self.config, self.variant, self.declares, self.expects = config, variant, declares, expects
        super().__init__(f"{config} declares {declares}; variant {variant} expects {expects}: another checkpoint, "
                         "or the variant is wrong")


class NoQuantConfig(PatchkitError):
    """No quantization table vLLM would read for the method (exit 2): the checkpoint `root`, the vLLM
    `method`, whether config.json had a table `without_layers` (MIXED_PRECISION needs quantized_layers) and
    the *hf_quant_config.json files `found` (vLLM reads exactly one)."""

    def __init__(self, root: Path, method: str, without_layers: bool, found: tuple[str, ...]):
        self.root, self.method, self.without_layers, self.found = root, method, without_layers, found
        if method not in MODELOPT_METHOD_NAMES:
            super().__init__(f"{root / 'config.json'}: no quantization_config for {method}")
            return
        layers = " with quantized_layers" if without_layers else ""
        super().__init__(f"{root}: config.json has no quantization_config{layers}, "
                         f"and vLLM then reads {method}'s from exactly one *{HF_QUANT_CONFIG} "
                         f"(found {list(found) if found else 'none'})")


def _flatten_modelopt(data: dict, where: str) -> dict:
    nested = data.get("quantization")
    if nested is None:
        return dict(data)
    if not isinstance(nested, dict):
        raise InvalidQuantConfig(where, "'quantization'", "is not an object")
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
        raise QuantMismatch(f"{root}/config.json", variant.name, f"{method} {algo}", f"{want.format} {want.quant_algo}")
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
        raise InvalidQuantConfig(str(root / "config.json"), f"{source} quantization table", "is not an object")
    # A table declaring another algorithm is returned as it is: the caller names the contradiction.
    mixed_without_layers = (vllm_method == "modelopt_mixed" and "quantized_layers" not in (table or {})
                            and str((table or {}).get("quant_algo", "MIXED_PRECISION")).upper() == "MIXED_PRECISION")
    if table is not None and not mixed_without_layers:
        return QuantSource(_table(table, str(root / "config.json"), at), source)
    if vllm_method not in MODELOPT_METHOD_NAMES:
        raise NoQuantConfig(root, vllm_method, False, ())
    files = sorted(p for p in root.glob("*.json") if p.name.endswith(HF_QUANT_CONFIG))
    if len(files) != 1:
        raise NoQuantConfig(root, vllm_method, table is not None, tuple(p.name for p in files))
    raw = read_file(files[0], "config")
    data = load_json_object(raw, str(files[0]))
    shape = conform(data, HfQuantConfig, str(files[0]), "$")
    if vllm_method in ("modelopt", "modelopt_mixed") and (shape.producer is None or shape.producer.name != "modelopt"):
        raise InvalidQuantConfig(str(files[0]), "producer.name",
                                 f"is not 'modelopt': vLLM refuses it for {vllm_method}")
    flat = _flatten_modelopt(data, str(files[0]))
    return QuantSource(_table(flat, str(files[0]), "$.quantization" if "quantization" in data else "$"),
                       files[0].name, sha256_bytes(raw))
