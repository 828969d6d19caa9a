"""Untrusted JSON that must be an object (manifests, configs, safetensors headers), parsed fail-closed."""

from __future__ import annotations

import json

from patchkit.errors import PatchkitError


def load_json_object(data: bytes | str, what: str) -> dict:
    """`data` parsed as a JSON object; a clear error naming `what` for anything else."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PatchkitError(f"{what}: not valid JSON: {exc}") from None
    except RecursionError:  # a hostile document nested deeper than the parser's stack
        raise PatchkitError(f"{what}: JSON nested too deeply to be a real document") from None
    if not isinstance(value, dict):
        raise PatchkitError(f"{what}: not a JSON object")
    return value
