"""Which vLLM 0.33 quantization method loads a checkpoint layout, and the refusal of a wrong pairing.

Read from vllm/model_executor/layers/quantization/modelopt.py (LINEAR_ALGOS and each config's
override_quantization_method) and vllm/config/model.py::_verify_quantization: vLLM replaces a
user-given --quantization with the method the checkpoint's quant_algo routes to, so naming the wrong
one hides the real loader from whoever reads the command line. We refuse the wrong pairing instead.
"""

from __future__ import annotations

from patchkit.errors import PatchkitError

# The quantization_config.quant_method values whose loader routes a layout to a method below.
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
    raise PatchkitError(f"checkpoint format {fmt!r} is not one of {', '.join(LOADER_FORMATS)}")


def check_method(fmt: str, quant_algo: str, method: str, where: str) -> None:
    """Refuse a quantization method that does not match the checkpoint layout, naming the right one.
    `where` leads the message: the file, table and key that name `method`."""
    try:
        right = expected_method(fmt, quant_algo)
    except PatchkitError as exc:
        raise PatchkitError(f"{where}: {exc}") from None
    if method != right:
        detail = ""
        if method == "modelopt" and right != "modelopt":
            detail = (
                " (in vLLM 0.33 `modelopt` is the FP8 config; the day-0 fork's loader names do not carry "
                "over)"
            )
        raise PatchkitError(
            f"{where}: {method!r} does not load a {fmt} {quant_algo} checkpoint in vLLM 0.33; "
            f"it needs {right!r}{detail}"
        )
