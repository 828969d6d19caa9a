"""The vLLM command line of a variant: `patchkit serve-args VARIANT [--checkpoint DIR]`.

Everything comes from the variant definition except the MTP exclusion override, which is derived from
the checkpoint's own config.json, and only after that file's SHA-256 matched the variant's pin (or the
pins the user supplied for an unpinned variant): an unverified config is never parsed. Without a
checkpoint the command is printed with that override marked pending, and `complete` is False.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from patchkit.checkpoint.identity import VerifiedCheckpoint, verify_identity
from patchkit.checkpoint.mtp_ignore import hf_overrides
from patchkit.checkpoint.quant_config import read_declared
from patchkit.errors import PatchkitError
from patchkit.variants.definitions import Variant
from patchkit.variants.pins import resolve_pins


class NodeRankOutOfRange(PatchkitError):
    """A node rank outside the multi-node group (exit 2): the `rank` asked for and the group's `nnodes`."""

    def __init__(self, rank: int, nnodes: int):
        self.rank, self.nnodes = rank, nnodes
        super().__init__(f"node rank {rank} outside 0..{nnodes - 1}")


@dataclass(frozen=True)
class ServeCommand:
    variant: str
    argv: tuple[str, ...]
    env: dict[str, str]
    hf_overrides: dict | None
    pending: tuple[str, ...]  # parts that could not be derived; the command must not be run as is
    notes: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.pending

    def for_node(self, rank: int, nnodes: int, master_addr: str) -> tuple[str, ...]:
        """argv for one node of a multi-node TP group (vLLM's mp backend: rank 0 serves the API,
        the others run headless)."""
        if not 0 <= rank < nnodes:
            raise NodeRankOutOfRange(rank, nnodes)
        if nnodes == 1:
            return self.argv
        extra = ("--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master_addr)
        return self.argv + extra + (("--headless",) if rank else ())

    def shell(self) -> str:
        """A copy-pasteable command: environment first, one flag (with its value) per line."""
        lines = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        tokens = list(self.argv)
        head = " ".join(shlex.quote(t) for t in tokens[:3])  # vllm serve MODEL
        lines.append(head)
        i = 3
        while i < len(tokens):
            token = tokens[i]
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                lines.append(f"  {shlex.quote(token)} {shlex.quote(tokens[i + 1])}")
                i += 2
            else:
                lines.append(f"  {shlex.quote(token)}")
                i += 1
        text = " \\\n".join(lines)
        comments = [f"# PENDING: {p}" for p in self.pending] + [f"# {n}" for n in self.notes]
        return "\n".join([*comments, text]) + "\n"

    def to_json(self) -> str:
        return json.dumps(
            {
                "variant": self.variant,
                "argv": list(self.argv),
                "env": self.env,
                "hf_overrides": self.hf_overrides,
                "complete": self.complete,
                "pending": list(self.pending),
                "notes": list(self.notes),
            },
            indent=2,
        )


def serve_command(
    variant: Variant, checkpoint: VerifiedCheckpoint | None = None, model: str | None = None,
    load_format: str | None = None,
) -> ServeCommand:
    """The command line for `variant`; pass a VerifiedCheckpoint to derive the MTP exclusion. `load_format`
    replaces the variant's loader (the caller checks the image carries what it imports: images.extras)."""
    s = variant.serve
    ckpt = variant.checkpoint
    argv: list[str] = ["vllm", "serve", model or ckpt.repo]
    if model is None and ckpt.revision:
        argv += ["--revision", ckpt.revision]
    argv += [
        "--served-model-name", s.served_model_name,
        "--host", s.host,
        "--port", str(s.port),
        "--tensor-parallel-size", str(s.tensor_parallel_size),
        "--quantization", variant.quantization,
        "--kv-cache-memory-bytes", str(s.kv_cache_memory_bytes),
        "--kv-cache-dtype", s.kv_cache_dtype,
    ]
    if chosen := load_format or s.load_format:
        argv += ["--load-format", chosen]
    if s.speculative is not None:
        argv += ["--speculative-config", s.speculative.to_json()]
    argv += list(s.args)
    pending: list[str] = []
    notes: list[str] = []
    overrides = None
    if checkpoint is not None:
        read_declared(checkpoint.root, checkpoint.config, variant)
    if ckpt.exclude_mtp_from_quant:
        if checkpoint is None:
            pending.append(
                "--hf-overrides excluding the BF16 MTP predictor from quantization: derived from the "
                "checkpoint's verified config.json; pass --checkpoint DIR"
            )
        else:
            overrides = hf_overrides(checkpoint.config)
            if overrides is None:
                notes.append("the checkpoint's ignore list already covers its MTP layers: no override needed")
            else:
                argv += ["--hf-overrides", json.dumps(overrides, separators=(",", ":"))]
    return ServeCommand(variant.name, tuple(argv), dict(s.env), overrides, tuple(pending), tuple(notes))


def serve_args(
    variant: Variant,
    checkpoint_dir: Path | None = None,
    pin_config: str | None = None,
    pin_index: str | None = None,
    model: str | None = None,
    load_format: str | None = None,
) -> ServeCommand:
    """The CLI entry: verify the checkpoint's identity first (fail closed), then build the command."""
    verified = None
    if checkpoint_dir is not None:
        verified = verify_identity(checkpoint_dir, resolve_pins(variant, pin_config, pin_index))
    return serve_command(variant, verified, model, load_format)
