"""Resolving every quantizable layer of a checkpoint through the real (stock or patched) vLLM
quantization code: the quantprobe table. `quantprobe` runs the worker (`probe`) in the vLLM
environment's interpreter, with the tree under test first on its path."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from patchkit.bounded_process import run_captured
from patchkit.errors import PatchkitError
from patchkit.smoke.synthetic_layout import PREFIX, Dims, Layout, is_kda
from patchkit.vllm_rules import EXPERT_PROJECTIONS, QuantConfigRefused, module_prefix

SRC = Path(__file__).resolve().parents[2]  # the directory holding the patchkit package
ERRORS_SHOWN = 3000  # of the worker's stderr, the last characters: its traceback's end, where vLLM says why


class WorkerFailed(PatchkitError):
    """The smoke worker `worker` ("pack": ModelOpt packs the tiny checkpoints, "probe": vLLM resolves them)
    run by `python` did not answer: it exited with `code`, or was killed at `timeout` seconds with what it
    started (`code` None); `errors` is the end of its stderr."""

    def __init__(self, worker: str, python: str, code: int | None, timeout: float, errors: str):
        self.worker, self.python, self.code, self.timeout, self.errors = worker, python, code, timeout, errors
        if code is None:
            super().__init__(f"smoke worker {worker} ({python}) did not finish within {timeout:g} s; it was killed "
                             f"with the processes it started\n{errors}".rstrip())
        else:
            super().__init__(f"smoke worker {worker} ({python}) failed (exit {code}):\n{errors}")


class ResolvedOtherMethod(PatchkitError):
    """The vLLM tree under test resolves `checkpoint` to quantization method `chosen`, not the variant's
    `method` (its override_quantization_method): the probe would judge another method's layers."""

    def __init__(self, checkpoint: str, chosen: str, method: str):
        self.checkpoint, self.chosen, self.method = checkpoint, chosen, method
        super().__init__(f"vLLM resolves {checkpoint} to {chosen!r}, not {method!r}")


def run_worker(python: str, args: list[str], pythonpath: list[Path], timeout: int) -> str:
    """What the worker printed; at `timeout` it is killed with what it started (vLLM's engine processes)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath), VLLM_LOGGING_LEVEL="ERROR")
    finished = run_captured([python, "-m", "patchkit.smoke.cpu", *args], timeout=timeout, env=env, stderr_apart=True)
    if finished.timed_out or finished.code != 0:
        raise WorkerFailed(args[0], python, None if finished.timed_out else finished.code, timeout,
                           finished.errors[-ERRORS_SHOWN:])
    return finished.output



def probe_prefixes(layout: Layout, d: Dims) -> list[tuple[str, str, str, str]]:
    """(layer class, vLLM prefix, checkpoint module whose storage it loads, how vLLM builds it) for every
    quantizable layer. `built`: "model" = constructed with the model's quant config; "attention" = a
    KDA/MLA/indexer projection, constructed with whatever config the tree passes those constructors;
    "none" = the indexer's fused wk_weights_proj, constructed with quant_config=None in every tree."""
    rows = []
    last = d.layers + (d.mtp_layers if layout.has_mtp else 0)
    for layer in range(last):
        mtp = layer >= d.layers
        hp = f"{PREFIX}.layers.{layer}"
        vp = module_prefix(hp, mtp)
        a = "attention"
        if is_kda(layer) and not mtp:
            rows += [("LinearBase", f"{vp}.self_attn.in_proj_qkvbfg_a", f"{hp}.self_attn.q_proj", a)]
            rows += [("LinearBase", f"{vp}.self_attn.{p}", f"{hp}.self_attn.{p}", a) for p in ("f_b_proj", "g_b_proj", "o_proj")]
        else:
            rows += [("LinearBase", f"{vp}.self_attn.fused_qkv_a_proj", f"{hp}.self_attn.q_a_proj", a)]
            rows += [("LinearBase", f"{vp}.self_attn.{p}", f"{hp}.self_attn.{p}", a) for p in ("q_b_proj", "kv_b_proj", "o_proj")]
            rows += [("LinearBase", f"{vp}.self_attn.indexer.wq_b", f"{hp}.self_attn.indexer.wq_b", a),
                     ("LinearBase", f"{vp}.self_attn.indexer.wk_weights_proj", f"{hp}.self_attn.indexer.wk", "none")]
        if layer < d.dense_layers:
            rows += [("LinearBase", f"{vp}.mlp.gate_up_proj", f"{hp}.mlp.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.down_proj", f"{hp}.mlp.down_proj", "model")]
        else:
            rows += [("RoutedExperts", f"{vp}.mlp.experts", f"{hp}.mlp.experts.0.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.shared_experts.gate_up_proj", f"{hp}.mlp.shared_experts.gate_proj", "model"),
                     ("LinearBase", f"{vp}.mlp.shared_experts.down_proj", f"{hp}.mlp.shared_experts.down_proj", "model")]
    rows.append(("LinearBase", module_prefix("lm_head"), "lm_head", "model"))
    return rows


def probe(jobs: list[dict]) -> list[list[dict]]:
    """Worker, in the vLLM environment (stock or patched tree first on sys.path): resolve every prefix.

    Runs vLLM's own code: the method vLLM's override rule picks for this quantization_config
    (`override_quantization_method`, as ModelConfig._verify_quantization does), the config class's
    `from_config`, `configure_quant_config` with the real model classes in the order the loader
    builds them (Glm5NextForConditionalGeneration, its inner Glm5NextForCausalLM, then the Glm5NextMTP
    draft, which reuses the target's config object), the config the tree hands the KDA/MLA constructors
    (the patched tree's `glm5next_layer_quant_config`; upstream passes None, kda.py ~213, model.py
    ~408), then the exclusion and per-layer resolution `get_quant_method` applies. It stops there:
    layers are not constructed (their MoE kernels need CUDA), so no weight loader runs."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.models.glm5next import (
        Glm5NextForCausalLM,
        Glm5NextForConditionalGeneration,
        Glm5NextMTP,
    )

    # The module defining the model classes: models/glm5next/common/model.py from 0.31.0,
    # models/glm5next/nvidia/model.py on 0.30.0 (the default base's layout).
    glm = sys.modules[Glm5NextForCausalLM.__module__]

    results = []
    for job in jobs:
        config = json.loads((Path(job["checkpoint"]) / "config.json").read_text())
        # A dict-valued --hf-overrides replaces the attribute whole (ModelConfig._apply_dict_overrides).
        config.update(job["overrides"])
        quant, method = config["quantization_config"], job["method"]
        cls = get_quantization_config(method)
        chosen = cls.override_quantization_method(quant, method) or quant["quant_method"]
        if chosen != method:
            raise ResolvedOtherMethod(job["checkpoint"], chosen, method)
        qc = cls.from_config(quant)
        classes = (Glm5NextForConditionalGeneration, Glm5NextForCausalLM) + ((Glm5NextMTP,) if job["speculative"] else ())
        for model_class in classes:
            configure_quant_config(qc, model_class)
        layer_qc = glm.glm5next_layer_quant_config(qc) if hasattr(glm, "glm5next_layer_quant_config") else None
        rows = []
        for layer, prefix, module, built in job["prefixes"]:
            given = {"model": qc, "attention": layer_qc, "none": None}[built]
            algo = "None" if given is None else _algo(given, method, layer, prefix)
            rows.append({"layer": layer, "prefix": prefix, "module": module, "built": built, "algo": algo})
        results.append(rows)
    return results


def _algo(qc, method: str, layer: str, prefix: str) -> str:
    """The algorithm get_quant_method would build `prefix` with, or "None" (unquantized)."""
    if method == "compressed-tensors":
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
        from vllm.model_executor.layers.linear import RowParallelLinear
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        # get_scheme_dict: `ignore`, then the layer name, its fused shards, then the module's class name
        # ("Linear" is contained in every LinearBase subclass's name, not in ParallelLMHead's). Only the
        # class name is read, so an uninitialised instance stands for the layer. Routed experts resolve
        # as CompressedTensorsMoEMethod.get_moe_method does: through expert 0's checkpoint projections.
        if layer == "RoutedExperts":
            qc._add_fused_moe_to_target_scheme_map()
            experts = object.__new__(RoutedExperts)
            schemes = [qc.get_scheme_dict(experts, f"{prefix}.0.{p}") for p in EXPERT_PROJECTIONS]
            if any(s != schemes[0] for s in schemes):
                raise QuantConfigRefused(prefix, "its expert projections resolve to different schemes; vLLM refuses the layer")
            scheme = schemes[0]
        else:
            cls = ParallelLMHead if prefix.endswith("lm_head") else RowParallelLinear
            scheme = qc.get_scheme_dict(object.__new__(cls), prefix)
        if scheme is None or scheme.get("weights") is None:
            return "None"
        # The matched group's arguments, named as the quantprobe boot marker names them (NVFP4 weights:
        # CompressedTensorsW4A4Fp4 / its MoE method, use_a16 when the group quantizes no activations).
        if qc._is_nvfp4_format(scheme["weights"]):
            return "W4A16_NVFP4" if scheme.get("input_activations") is None else "NVFP4"
        return str(scheme.get("format"))
    if qc.is_layer_excluded(prefix):
        return "None"
    if method == "modelopt_mixed":
        algo = qc._resolve_quant_algo(prefix)
        return "None" if algo is None else algo
    return qc.quant_method


def quantprobe(jobs: list[dict], python: str, vllm_root: Path | None = None, timeout: int = 900) -> list[list[dict]]:
    """Quantprobe tables for several checkpoints in one interpreter of the vLLM tree at `vllm_root`
    (None: `python`'s own vLLM). A job: checkpoint, method, speculative, overrides, prefixes."""
    path = [p for p in (vllm_root, SRC) if p is not None]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:  # too long for a command line
        json.dump(jobs, fh)
        fh.flush()
        out = run_worker(python, ["probe", fh.name], path, timeout)
    tables = json.loads(out.strip().splitlines()[-1])
    if not isinstance(tables, list) or len(tables) != len(jobs):  # each checkpoint's table, in order
        raise PatchkitError(f"the quantprobe worker answered {len(tables) if isinstance(tables, list) else 'no list of'} "
                            f"tables for {len(jobs)} checkpoints (a patchkit bug: please report it)")
    return tables
