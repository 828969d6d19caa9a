"""The JSON shapes patchkit reads out of a checkpoint (config.json's quantization table, the index, a
safetensors header entry), checked with msgspec where the bytes come in.

Why at the boundary: the code downstream reads `entry["quant_algo"].upper()` and `layers.get(...)`; a
config whose `ignore` is an int or whose `quantized_layers` is a list would reach it as an AttributeError
or a TypeError (exit 3). Only the keys patchkit reads are typed; every other key passes as it is, so a
real checkpoint's extra fields never refuse it. A part of a document already parsed
(patchkit.jsondata) is checked with `conform`, its errors naming the part's JSON path in the file.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

from patchkit.jsondata import MalformedJson, decode

T = TypeVar("T")

# A real tensor has at most 8 dimensions (the largest any public safetensors checkpoint stores is 5); the
# bound keeps a hostile 300,000-dimension shape from costing a quadratic product.
MAX_DIMS = 64
Dim = Annotated[int, msgspec.Meta(ge=0)]


class TensorEntry(msgspec.Struct):
    """One tensor of a safetensors header, as the safetensors library requires it."""

    dtype: str
    shape: Annotated[list[Dim], msgspec.Meta(max_length=MAX_DIMS)]
    data_offsets: tuple[Dim, Dim]


class ConfigGroup(msgspec.Struct):
    """A compressed-tensors config group (CompressedTensorsConfig reads these four keys)."""

    targets: list[str]
    weights: dict[str, Any] | None = None
    input_activations: dict[str, Any] | None = None
    format: str | None = None


class LayerEntry(msgspec.Struct):
    """A modelopt_mixed `quantized_layers` entry: ModelOptMixedPrecisionConfig reads its quant_algo."""

    quant_algo: str


class QuantTable(msgspec.Struct):
    """The keys of a quantization table patchkit resolves layers with; the rest are vLLM's alone."""

    quant_method: str | None = None
    quant_algo: str | None = None
    format: str | None = None
    ignore: list[str] | None = None
    exclude_modules: list[str] | None = None
    quantized_layers: dict[str, LayerEntry] | None = None
    config_groups: dict[str, ConfigGroup] | None = None


class Producer(msgspec.Struct):
    name: Any = None


class HfQuantConfig(msgspec.Struct):
    """hf_quant_config.json: the producer vLLM checks and the nested table it flattens."""

    producer: Producer | None = None
    quantization: dict[str, Any] | None = None


def conform(value: Any, schema: type[T], what: str, at: str) -> T:
    """A part of `what` already parsed (`value`, found at JSON path `at`) checked against `schema`; the
    MalformedJson names the path in the file."""
    try:
        return decode(msgspec.json.encode(value), schema, what)
    except MalformedJson as exc:
        raise MalformedJson(what, exc.problem, at + exc.at[1:]) from None
