"""The SHA-256 pins an identity check trusts: the variant's own, or the user's where it has none.

A pin that is not known (no public record of it could be checked) is written in variant.toml as an
empty string, and such a variant is *unpinned*: identity checks refuse it unless the user supplies
the pins (`--pin-config/--pin-index`). A user pin never overrides one the variant carries.
"""

from __future__ import annotations

import re

from patchkit.errors import PatchkitError
from patchkit.variants.definitions import Pins, Variant

_SHA256 = re.compile(r"[0-9a-f]{64}")


def resolve_pins(
    variant: Variant, config_sha256: str | None = None, index_sha256: str | None = None
) -> Pins:
    """The pins an identity check uses: the variant's, or the user's where the variant has none.

    A user pin that contradicts a pin the variant carries is an error, never a silent override; a pin
    still unknown after both is an error too (fail closed: an unpinned checkpoint is never trusted).
    """
    chosen: dict[str, str] = {}
    for label, own, given in (
        ("config.json", variant.checkpoint.pins.config_sha256, config_sha256),
        ("model.safetensors.index.json", variant.checkpoint.pins.index_sha256, index_sha256),
    ):
        if given is not None:
            given = given.lower()
            if not _SHA256.fullmatch(given):
                raise PatchkitError(f"pin for {label} is not a SHA-256 (64 hex digits): {given!r}")
        if own and given and own != given:
            raise PatchkitError(
                f"variant {variant.name} pins {label} sha256 {own}; the pin given ({given}) contradicts it"
            )
        value = own or given
        if value is None:
            raise PatchkitError(
                f"variant {variant.name} has no known SHA-256 pin for {label} "
                f"({variant.checkpoint.pin_source}); identity checks refuse an unpinned checkpoint: "
                "supply the pins yourself (--pin-config SHA --pin-index SHA) from a source you trust"
            )
        chosen[label] = value
    return Pins(chosen["config.json"], chosen["model.safetensors.index.json"])
