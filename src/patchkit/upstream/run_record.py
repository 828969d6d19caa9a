"""The record a test run writes of itself (tests/release_record.py, the pytest plugin every release's run
loads), declared once: the plugin writes it through this type, and its readers read it through the same
one: retirement (upstream/retire.py), the bump pull request's body (upstream/bump_records.py) and the
what-ran-where merge (tests/ran_where.py). A field renamed here is renamed for all of them.

A test's outcome is pytest's (`TestReport.outcome`), as a StrEnum: a value pytest does not give is refused.
The fields with a default are those a record from before they existed lacks (tests/data/bump/run).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class TestOutcome(StrEnum):
    """One test's outcome in a run (a setup or teardown failure is a failure; failures stick)."""

    __test__ = False  # not a pytest test class, whatever its name

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class RunRecord(msgspec.Struct, kw_only=True):
    """One test run: the release it ran on, the patches left out (PATCHKIT_TEST_EXCLUDE), each test's
    outcome, and where and how narrowly it ran (commit .. stopped_early)."""

    vllm: str | None  # the installed vLLM release (None: none installed)
    torch: str | None = None  # beside it (None: not installed, as a record without them reads)
    transformers: str | None = None
    excluded: list[str]  # sorted
    exitstatus: int  # pytest's
    commit: str | None = None  # the checkout's HEAD, "+dirty" when the tree differed from it
    finished: str | None = None  # UTC, "%Y-%m-%dT%H:%M:%SZ"
    selection: list[str] = []  # the paths and node ids it was given
    deselected: list[str] = []  # what -k/-m deselected
    stopped_early: bool = False
    tests: dict[str, TestOutcome]  # node id -> its outcome
    skip_reasons: dict[str, str] = {}  # node id -> why it was skipped

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self)
