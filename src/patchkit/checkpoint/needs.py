"""Which patches a checkpoint served as a variant needs, read from the patches themselves.

Each patch says in its patch.toml when a checkpoint needs it (`[needed_when]`, patching/schema.py): text-config
values (`config`, with transformers' defaults for keys config.json leaves out, vllm_rules.TEXT_CONFIG_DEFAULTS),
text-config keys that are set (`config_set`), the variant's serve contract (`serve`), the tensor-name
spelling (`spelling`), and modules its quant config quantizes that stock vLLM builds unquantized
(`quantized`: preflight's layout check asks `extenders` module by module). Every condition a rule gives
must hold. Nothing here names a patch: a new patch brings its own rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from patchkit.checkpoint.inventory import KINDS
from patchkit.checkpoint.spelling import Spelling
from patchkit.patching.patchset import InvalidPatchFile, Patch
from patchkit.patching.schema import NeededWhenTable
from patchkit.variants.definitions import Serve, Variant
from patchkit.vllm_rules import TEXT_CONFIG_DEFAULTS

SERVE_FIELDS = frozenset(f.name for f in fields(Serve))


@dataclass(frozen=True)
class Need:
    """A patch this checkpoint needs: its rule's reason, and what in the checkpoint or variant meets it."""

    patch: str
    why: str
    found: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"patch": self.patch, "why": self.why, "found": list(self.found)}


@dataclass(frozen=True)
class Rules:
    """The patches whose checkpoint-wide conditions hold for one checkpoint and variant."""

    met: dict[str, tuple[Patch, tuple[str, ...]]]  # patch id -> (patch, what met its conditions)

    def extenders(self, kind: str, part: str) -> list[str]:
        """The patches that build a module of `kind` in `part` ("main" or "mtp") with its quant-config entry,
        where stock vLLM builds it unquantized."""
        out = []
        for pid, (patch, _) in self.met.items():
            rule = patch.needed_when.quantized if patch.needed_when is not None else None
            if rule is not None and (not rule.kinds or kind in rule.kinds) and rule.part in (None, part):
                out.append(pid)
        return out

    def needs(self, quantized_hits: dict[str, set[str]]) -> dict[str, Need]:
        """Every patch needed: a rule without `quantized` by its conditions alone, one with it only where a
        module needed it (`quantized_hits`: patch id -> "part kind" of those modules)."""
        out = {}
        for pid, (patch, found) in self.met.items():
            when = patch.needed_when
            if when is None:  # (met holds only patches with a rule)
                continue
            if when.quantized is not None:
                if pid not in quantized_hits:
                    continue
                found = (*found, *sorted(quantized_hits[pid]))
            out[pid] = Need(pid, when.why, found)
        return out


def rules_for(patches: Iterable[Patch], text_config: dict, variant: Variant, spelling: Spelling) -> Rules:
    """The patches (of the whole set: an image's series is compared with the result) whose checkpoint-wide
    conditions hold."""
    met = {}
    for patch in patches:
        rule = patch.needed_when
        if rule is not None:
            found = _met(rule, text_config, variant, spelling, patch.folder / "patch.toml")
            if found is not None:
                met[patch.id] = (patch, tuple(found))
    return Rules(met)


def _met(rule: NeededWhenTable, text: dict, variant: Variant, spelling: Spelling, where: Path) -> list[str] | None:
    """What meets the rule's checkpoint-wide conditions, or None when one of them does not hold. A key no
    variant or module has is the rule's error, never a condition quietly unmet."""
    found = []
    for key, want in rule.config.items():
        got = text.get(key, TEXT_CONFIG_DEFAULTS.get(key))
        if got != want or isinstance(got, bool) != isinstance(want, bool):
            return None
        found.append(f"config {key} = {got!r}" + ("" if key in text else " (transformers' default)"))
    for key in rule.config_set:
        got = text.get(key, TEXT_CONFIG_DEFAULTS.get(key))
        if got is None:
            return None
        found.append(f"config {key} = {got!r}" + ("" if key in text else " (transformers' default)"))
    for key, want in rule.serve.items():
        if key not in SERVE_FIELDS:
            raise InvalidPatchFile(where, "[needed_when], key 'serve'", "unknown-field",
                                   f"{key!r} is not a [serve] field of a variant ({', '.join(sorted(SERVE_FIELDS))})")
        if getattr(variant.serve, key) != want:
            return None
        found.append(f"variant {variant.name} serves {key} = {want!r}")
    if rule.spelling == "nested":
        if spelling.kind not in ("nested", "mixed"):
            return None
        found.append(f"{spelling.kind} tensor names (e.g. {spelling.example})")
    if rule.quantized is not None:
        unknown = sorted(set(rule.quantized.kinds) - set(KINDS))
        if unknown:
            raise InvalidPatchFile(where, "[needed_when], key 'quantized'", "unknown-kind",
                                   f"kinds {unknown} are not module kinds ({', '.join(KINDS)})")
        ckpt = variant.checkpoint
        if ckpt.format != "modelopt" or ckpt.quant_algo.upper() != rule.quantized.quant_algo.upper():
            return None
    return found
