"""CPU load smoke: a synthetic checkpoint per variant, packed by the reference code, resolved through
the real vLLM quantization code and judged against the variant's expected rows.

The parts, one module each: synthetic_layout (the checkpoint as stored), synthetic_config (its
config.json and header-only shards), packing (ModelOpt/compressed-tensors worker), quantprobe (the
vLLM worker), load_check (the judgement). This module is the smoke itself and the workers' entry point
(`python -m patchkit.smoke.cpu pack|probe ...`), so it imports only the standard library and
patchkit's stdlib-only modules at the top.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from patchkit.smoke.load_check import SmokeReport, judge
from patchkit.smoke.quantprobe import (
    SRC,
    probe_prefixes,
    quantprobe,
    run_worker,
)
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS, NoSyntheticLayout


def _job(variant, workdir: Path, exclude_mtp: bool | None = None) -> tuple[dict, dict[str, str]]:
    """Identity, then the serve override from the verified config, then the stored formats: the same
    path serve-args takes. `exclude_mtp=False` withholds the override (to show what it fixes)."""
    from patchkit.checkpoint.headers import read_headers
    from patchkit.checkpoint.identity import sha256_bytes, verify_identity
    from patchkit.checkpoint.inventory import inventory
    from patchkit.checkpoint.mtp_ignore import hf_overrides
    from patchkit.variants.definitions import Pins

    ckpt = workdir / variant.name
    pins = Pins(sha256_bytes((ckpt / "config.json").read_bytes()), sha256_bytes((ckpt / "model.safetensors.index.json").read_bytes()))
    verified = verify_identity(ckpt, pins)
    exclude = variant.checkpoint.exclude_mtp_from_quant if exclude_mtp is None else exclude_mtp
    overrides = (hf_overrides(verified.config) or {}) if exclude else {}
    stored = {m.name: m.format for m in inventory(read_headers(verified), TINY_DIMS.layers).modules.values()}
    job = {
        "checkpoint": str(ckpt), "method": variant.quantization, "speculative": variant.serve.speculative is not None,
        "overrides": overrides, "prefixes": probe_prefixes(LAYOUTS[variant.name], TINY_DIMS),
    }
    return job, stored


def build_checkpoints(names: list[str], workdir: Path, modelopt_python: str, timeout: int = 1800) -> None:
    """Pack every named variant's tiny checkpoint not yet in `workdir`, in one ModelOpt interpreter."""
    missing = [n for n in names if not (workdir / n / "config.json").exists()]
    for name in missing:
        if name not in LAYOUTS:
            raise NoSyntheticLayout(name, tuple(LAYOUTS))
    if missing:
        run_worker(modelopt_python, ["pack", str(workdir), *missing], [SRC], timeout)


def smoke_cpu(
    variants: list, workdir: Path, modelopt_python: str, vllm_python: str, vllm_root: Path | None = None,
    label: str = "",
) -> list[SmokeReport]:
    """`patchkit smoke --cpu`: tiny checkpoints packed by the reference code, resolved through the vLLM
    tree at `vllm_root` (None: `vllm_python`'s own), each judged against its variant."""
    build_checkpoints([v.name for v in variants], workdir, modelopt_python)
    jobs = [_job(v, workdir) for v in variants]
    tables = quantprobe([job for job, _ in jobs], vllm_python, vllm_root)
    name = label or str(vllm_root or vllm_python)
    return [judge(v, rows, stored, name) for v, rows, (_, stored) in zip(variants, tables, jobs, strict=True)]


def _main(argv: list[str]) -> int:
    if argv[:1] == ["pack"] and len(argv) >= 3:
        from patchkit.smoke.packing import pack

        for name in argv[2:]:
            pack(name, Path(argv[1]) / name)
        return 0
    if argv[:1] == ["probe"] and len(argv) == 2:
        from patchkit.smoke.quantprobe import probe

        print(json.dumps(probe(json.loads(Path(argv[1]).read_text()))))
        return 0
    print("usage: python -m patchkit.smoke.cpu pack WORKDIR VARIANT... | probe JOBS.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
