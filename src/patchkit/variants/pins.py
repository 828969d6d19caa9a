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


class InvalidPin(PatchkitError):
    """A pin given on the command line that is not a SHA-256 (exit 2): the file it pins (`label`) and the
    `given` text."""

    def __init__(self, label: str, given: str):
        self.label, self.given = label, given
        super().__init__(f"pin for {label} is not a SHA-256 (64 hex digits): {given!r}")


class PinContradicted(PatchkitError):
    """A user pin that contradicts the one the variant carries (exit 2): the `variant`, the file it pins
    (`label`), the variant's `own` pin and the `given` one."""

    def __init__(self, variant: str, label: str, own: str, given: str):
        self.variant, self.label, self.own, self.given = variant, label, own, given
        super().__init__(f"variant {variant} pins {label} sha256 {own}; the pin given ({given}) contradicts it")


class Unpinned(PatchkitError):
    """A variant with no known pin for a file, and none given (exit 2): the `variant`, the file (`label`)
    and the variant's `pin_source` (why no public record pins it)."""

    def __init__(self, variant: str, label: str, pin_source: str):
        self.variant, self.label, self.pin_source = variant, label, pin_source
        super().__init__(f"variant {variant} has no known SHA-256 pin for {label} ({pin_source}); identity checks "
                         "refuse an unpinned checkpoint: supply the pins yourself (--pin-config SHA --pin-index SHA) "
                         "from a source you trust")


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
                raise InvalidPin(label, given)
        if own and given and own != given:
            raise PinContradicted(variant.name, label, own, given)
        value = own or given
        if value is None:
            raise Unpinned(variant.name, label, variant.checkpoint.pin_source)
        chosen[label] = value
    return Pins(chosen["config.json"], chosen["model.safetensors.index.json"])
