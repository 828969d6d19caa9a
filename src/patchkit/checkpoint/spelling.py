"""Which tensor-name spelling a GLM-5.3-Flash checkpoint stores, and whether an image's series loads it.

GLM-5.3-Flash exports come in two spellings of the same parameters:
- flat, the names vLLM 0.30-0.33 define as parameters: `layers.N.hc_attn_fn`, `layers.N.hc_ffn_*`,
  `self_attn.{q,k,v}_conv1d.weight`, `self_attn.f_a_proj.*`, `self_attn.f_b_proj.*`,
  `self_attn.dt_bias`, `self_attn.A_log`;
- nested, transformers' Glm5Next module tree: `layers.N.attn_hc.{fn,base,scale}`, `layers.N.ffn_hc.*`,
  `self_attn.forget_gate.{f_a_proj,f_b_proj,dt_bias,A_log}`, one fused `self_attn.conv1d.weight`.
Stock vLLM loads only the flat spelling (a nested name is a KeyError at load); a patch whose patch.toml
says it is needed for the nested spelling (`[needed_when] spelling = "nested"`: naming-shim, which has
the evidence) loads both. The index's weight_map names every tensor, so the spelling is known before a
single shard is opened.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from patchkit.checkpoint.identity import INDEX, InvalidWeightMap, NotACheckpoint
from patchkit.jsondata import load_json_object
from patchkit.patching.patchset import Patch
from patchkit.untrusted import read_file

# family -> the name component that marks it, per spelling (a component is bounded by dots or the end)
NESTED = {
    "hyper-connections": re.compile(r"\.(?:attn|ffn)_hc\.(?:fn|base|scale)$"),
    "forget gate": re.compile(r"\.self_attn\.forget_gate\.(?:A_log$|dt_bias$|f_a_proj\.|f_b_proj\.)"),
    "short conv": re.compile(r"\.self_attn\.conv1d\.weight$"),
}
FLAT = {
    "hyper-connections": re.compile(r"\.hc_(?:attn|ffn)_(?:fn|base|scale)$"),
    "forget gate": re.compile(r"\.self_attn\.(?:A_log$|dt_bias$|f_a_proj\.|f_b_proj\.)"),
    "short conv": re.compile(r"\.self_attn\.[qkv]_conv1d\.weight$"),
}


def nested_loaders(patches: Iterable[Patch]) -> tuple[str, ...]:
    """The patches that load the nested spelling: those whose `[needed_when]` names it."""
    return tuple(p.id for p in patches if p.needed_when is not None and p.needed_when.spelling == "nested")


@dataclass(frozen=True)
class Spelling:
    """The spelling of one checkpoint: `kind` and, per spelling, how many tensors of each family."""

    kind: str  # nested | flat | mixed | unknown (no tensor of either spelling: not a KDA/mHC export)
    nested: dict[str, int]
    flat: dict[str, int]
    example: str | None  # the first nested name, for messages

    def handled_by(self, series: Iterable[str], loaders: Iterable[str]) -> bool | None:
        """Does a vLLM 0.30-0.33 carrying `series` load these names, `loaders` being the patches that load
        the nested spelling (nested_loaders)? None: nothing to judge by."""
        if self.kind == "unknown":
            return None
        return self.kind == "flat" or bool(set(series) & set(loaders))

    def describe(self) -> str:
        def counts(families: dict[str, int]) -> str:
            return ", ".join(f"{n} {family}" for family, n in families.items())

        if self.kind == "unknown":
            return "no hyper-connection, forget-gate or short-conv tensors: spelling not determined"
        parts = [f"{self.kind} tensor names"]
        if self.nested:
            parts.append(f"nested: {counts(self.nested)} (e.g. {self.example})")
        if self.flat:
            parts.append(f"flat: {counts(self.flat)}")
        return "; ".join(parts)

    def verdict(self, series: Iterable[str], loaders: Iterable[str], image: str = "the series") -> str:
        """One line for a preflight report."""
        loaders, series = tuple(loaders), tuple(series)
        shim = " or ".join(loaders) or "a patch loading the nested spelling"
        handled = self.handled_by(series, loaders)
        if handled is None:
            return f"{self.describe()}; nothing for {shim} to do"
        if handled:
            through = " or ".join(p for p in loaders if p in series)
            how = "loads them as stored" if self.kind == "flat" else f"loads them through {through}"
            return f"{self.describe()}; {image} {how}"
        return (f"{self.describe()}; {image} lacks {shim}: vLLM 0.30-0.33 stop at the first nested name "
                f"with a KeyError ({self.example})")


def spelling_of(names: Iterable[str]) -> Spelling:
    """Classify tensor names (a weight_map's keys)."""
    nested: Counter[str] = Counter()
    flat: Counter[str] = Counter()
    example = None
    for name in names:
        for family, pattern in NESTED.items():
            if pattern.search(name):
                nested[family] += 1
                example = example or name
        for family, pattern in FLAT.items():
            if pattern.search(name):
                flat[family] += 1
    kind = "mixed" if nested and flat else "nested" if nested else "flat" if flat else "unknown"
    order = list(NESTED)
    return Spelling(kind, {f: nested[f] for f in order if nested[f]}, {f: flat[f] for f in order if flat[f]}, example)


def weight_map_names(index: Mapping, where: str) -> list[str]:
    """The tensor names of a parsed model.safetensors.index.json; a clear error for anything else."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InvalidWeightMap(where, "none")
    return list(weight_map)


def read_spelling(checkpoint: Path) -> Spelling:
    """The spelling of the checkpoint directory `checkpoint`, from its index alone."""
    path = Path(checkpoint) / INDEX
    if not path.exists() and not path.is_symlink():
        raise NotACheckpoint(Path(checkpoint), INDEX)
    index = load_json_object(read_file(path, "checkpoint-index"), str(path))
    return spelling_of(weight_map_names(index, str(path)))
