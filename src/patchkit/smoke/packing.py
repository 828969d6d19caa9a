"""Packing the tiny checkpoint with the reference code (worker, in the ModelOpt environment): ModelOpt's
NVFP4/MXFP8 quantizers and config converter, compressed-tensors' NVFP4 compressor. Run as
`python -m patchkit.smoke.cpu pack ...`; torch and the packers are imported only inside."""

from __future__ import annotations

import json
from pathlib import Path

from patchkit.errors import PatchkitError
from patchkit.smoke.synthetic_config import (
    compressed_tensors_config,
    config_json,
    hf_quant_config,
)
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS, Linear, modules

INPUT_SCALE = 0.5 / (6 * 448)  # a calibrated static activation scale: amax 0.5 over e2m1 max x e4m3 max


def pack(variant: str, out: Path) -> None:
    """Worker, in the ModelOpt environment: write the tiny checkpoint with really packed tensors.

    NVFP4 and MXFP8 come from ModelOpt's NVFP4QTensor / MXFP8QTensor, config.json's quantization_config
    from ModelOpt's convert_hf_quant_config_format; the RedHat format from compressed-tensors'
    NVFP4PackedCompressor, each module with the scheme of the config group the library matches it to."""
    import torch
    from safetensors.torch import save_file

    layout = LAYOUTS[variant]
    mods = modules(layout, TINY_DIMS)
    schemes = _ct_schemes(mods) if layout.fmt == "compressed-tensors" else {}
    gen = torch.Generator().manual_seed(0)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    tensors: dict[str, torch.Tensor] = {}
    for m in mods:
        if m.dtype is not None:
            tensors[m.name] = torch.randn(m.shape, generator=gen).to(dtypes[m.dtype])
            continue
        w = (torch.randn(m.shape, generator=gen) * 0.02).to(torch.bfloat16)
        tensors.update(_quantize(m, w, schemes.get(m.name)))
    out.mkdir(parents=True, exist_ok=True)
    # Two shards, modules kept whole, as real exports do.
    names = list(tensors)
    half = len(names) // 2
    while half < len(names) and names[half].rsplit(".", 1)[0] == names[half - 1].rsplit(".", 1)[0]:
        half += 1
    weight_map = {}
    for i, chunk in enumerate((names[:half], names[half:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in chunk}, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config = config_json(layout, TINY_DIMS, mods)
    if layout.fmt == "modelopt":
        from modelopt.torch.export.convert_hf_config import (
            convert_hf_quant_config_format,
        )

        hf_quant = hf_quant_config(layout, TINY_DIMS, mods)
        config["quantization_config"] = convert_hf_quant_config_format(hf_quant)
        (out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2))
    # compressed-tensors: config_json wrote the public record's quantization_config as it is, which
    # _ct_schemes validated with the library and matched against every module.
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _ct_schemes(mods: list[Linear]) -> dict:
    """Linear module name -> the QuantizationScheme of the config group compressed-tensors itself matches
    it to: `is_match` on the stored HF name (model.language_model.layers.3.mlp.experts.0.gate_proj) and
    the module class, against each group's targets with the config's `ignore`, groups in order. The
    layout must store exactly those modules NVFP4-CT and every other linear BF16, else the tiny
    checkpoint and its config disagree."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import is_match

    config = QuantizationConfig.model_validate(compressed_tensors_config())
    linear = torch.nn.Linear(16, 16, device="meta")  # what every stored linear is; class targets match it
    schemes = {}
    for m in mods:
        if m.dtype is not None:
            continue
        groups = config.config_groups.values()
        scheme = next((g for g in groups if is_match(m.name, linear, g.targets, config.ignore)), None)
        want = "BF16"
        if scheme is not None:
            schemes[m.name] = scheme
            want = "NVFP4-CT" if NVFP4PackedCompressor.can_compress(torch.nn.Linear, scheme) else str(scheme.format)
        if m.fmt != want:
            raise PatchkitError(f"{m.name}: the layout stores it {m.fmt}, its compressed-tensors config group makes "
                                f"it {want} (a patchkit bug: please report it; the synthetic layout and its config "
                                "disagree)")
    return schemes


def _quantize(m: Linear, w, scheme=None):
    import torch

    n = m.name
    if m.fmt == "BF16":
        return {f"{n}.weight": w}
    if m.fmt in ("NVFP4", "NVFP4A16"):
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

        q, scale, scale2 = NVFP4QTensor.quantize(w, block_size=16)
        out = {f"{n}.weight": q._quantized_data, f"{n}.weight_scale": scale, f"{n}.weight_scale_2": scale2.reshape(())}
        if m.fmt == "NVFP4":
            out[f"{n}.input_scale"] = torch.tensor(INPUT_SCALE, dtype=torch.float32)
        return out
    if m.fmt == "MXFP8":
        from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor

        q, scale = MXFP8QTensor.quantize(w)
        return {f"{n}.weight": q._quantized_data, f"{n}.weight_scale": scale}
    if m.fmt == "NVFP4-CT":
        from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

        wf = w.float()
        global_scale = (448.0 * 6.0) / wf.abs().max()  # compressed-tensors' convention: the reciprocal
        block_amax = wf.view(wf.shape[0], -1, 16).abs().amax(-1)
        scale = (block_amax / 6.0 * global_scale).clamp(min=2**-9).to(torch.float8_e4m3fn).float() / global_scale
        state = {"weight": wf, "weight_scale": scale, "weight_global_scale": global_scale.reshape(1),
                 "input_global_scale": torch.tensor([1.0 / INPUT_SCALE])}
        packed = NVFP4PackedCompressor.compress(state, scheme)
        # What the scheme stores: input_global_scale only with NVFP4 (tensor-group) activations.
        kept = NVFP4PackedCompressor.compression_param_names(scheme)
        return {f"{n}.{k}": v for k, v in packed.items() if k in kept}
    raise PatchkitError(f"no packing for format {m.fmt!r} (a patchkit bug: please report it; the synthetic "
                        "layouts use only these)")
