"""How much of a GB10's memory one tensor-parallel rank of a checkpoint needs: its weights (split TP ways
except what vLLM replicates, vllm_rules.REPLICATED_*), the pinned KV pool and an activation reserve."""

from __future__ import annotations

from patchkit.checkpoint.inventory import Inventory
from patchkit.errors import PatchkitError
from patchkit.vllm_rules import REPLICATED_ATTENTION, REPLICATED_KINDS

GIB = 1024**3
GB10_MEMORY_GIB = 121.63  # unified memory per DGX Spark node
GB10_FREE_AT_BOOT_GIB = 108.5  # field records "The 4p67 recipe": driver reserve + page cache routinely leave about this much
# Activations at --max-num-batched-tokens 4096, CUDA/NCCL context and the sampler: a margin, not a
# measurement (field records "The 4p67 recipe" lists "weights ~93 + pinned KV 10 + activations" as the whole allocation).
ACTIVATION_RESERVE_GIB = 6.0


class BadTensorParallelSize(PatchkitError):
    """A tensor parallel size `tp` (--tp) below 1 (exit 2)."""

    def __init__(self, tp: int):
        self.tp = tp
        super().__init__(f"tensor parallel size must be >= 1, got {tp}")


def per_rank_bytes(inv: Inventory, tp: int, language_model_only: bool) -> int:
    """Estimated weight bytes one rank holds at tensor parallel size `tp` (the vision tower is skipped
    when vLLM runs --language-model-only)."""
    if tp < 1:
        raise BadTensorParallelSize(tp)
    total = 0
    for m in inv.modules.values():
        if m.kind == "vision" and language_model_only:
            continue
        last = m.name.rsplit(".", 1)[-1]
        replicated = m.kind in REPLICATED_KINDS or (m.kind == "attention" and last in REPLICATED_ATTENTION)
        total += m.nbytes if replicated else -(-m.nbytes // tp)
    return total
