"""The states of a cell of the `patchkit verify` matrix, and how each one reads.

A cell is the planner's verdict on one patch within the full series against one upstream version,
in the matrix's own words: "applies" is the planner's not-applied (pending, and clean). An
out-of-range cell is evaluated again with every range ignored; its state there is what the patch
"would" do (`CellState.would`, `CellState.would_short`).
"""

from __future__ import annotations

import enum

from patchkit.patching.planner import State


class CellState(enum.StrEnum):
    """A cell's state: its value is what --json says, the rest is how the tables show it.

    label: the table text; mark: its emoji in Markdown; style: its rich style; would: the phrase after
    "ignoring ranges it" in a cell's summary; would_short: the note a table adds to an out-of-range
    cell (None: no note).
    """

    label: str
    mark: str
    style: str
    would: str
    would_short: str | None

    def __new__(cls, value: str, label: str, mark: str, style: str, would: str, would_short: str | None):
        member = str.__new__(cls, value)
        member._value_ = value
        member.label, member.mark, member.style = label, mark, style
        member.would, member.would_short = would, would_short
        return member

    # member = value,                  label,          mark, style,      would,                            would_short
    APPLIES = "applies",               "applies",      "✅", "green",    "would apply",                    "would apply"
    APPLIED = "applied",               "applied",      "✅", "green",    "is already applied",             "applied"
    UPSTREAMED = "upstreamed",         "upstreamed",   "🔵", "cyan",     "is upstreamed (drop it)",        "upstreamed"
    BROKEN = "broken",                 "BROKEN",       "❌", "bold red", "would break",                    "would BREAK"
    OUT_OF_RANGE = "out-of-range",     "out of range", "⚪", "dim",      "has no release number to check", None
    NOT_APPLICABLE = "not-applicable", "n/a",          "➖", "dim",      "is not applicable",              None

    @property
    def good(self) -> bool:
        """The patch does its job here: it applies, or is applied."""
        return self in (CellState.APPLIES, CellState.APPLIED)

    @classmethod
    def from_plan(cls, state: State) -> CellState:
        """The planner's state as the matrix shows it. Partial and modified are broken: a pristine upstream
        tree holding half a patch, or an edited copy of its text, needs a person (the detail says which)."""
        if state == State.NOT_APPLIED:
            return cls.APPLIES
        if state in (State.PARTIAL, State.MODIFIED):
            return cls.BROKEN
        return cls(state.value)  # type: ignore[call-arg]  # the Enum's lookup by value; mypy reads it as __new__
