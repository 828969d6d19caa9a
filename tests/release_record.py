"""What ran on which vLLM release, recorded by the run itself.

With PATCHKIT_RESULTS=path set (noxfile.py sets it for every release's run), the run writes at its end
the installed vLLM release, the torch and transformers beside it, the patches left out
(PATCHKIT_TEST_EXCLUDE) and each test's outcome. tests/ran_where.py reads these files to check every
patch's `vllm` range against the behaviour tests that passed, and renders README's "What ran where".
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_outcomes: dict[str, str] = {}
_reasons: dict[str, str] = {}


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def pytest_runtest_logreport(report):
    # A test's outcome is its call's, unless setup or teardown failed or skipped it; failures stick.
    if report.when != "call" and report.outcome == "passed":
        return
    if _outcomes.get(report.nodeid) == "failed":
        return
    _outcomes[report.nodeid] = report.outcome
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        _reasons[report.nodeid] = report.longrepr[2].removeprefix("Skipped: ")


def pytest_sessionfinish(session, exitstatus):
    target = os.environ.get("PATCHKIT_RESULTS")
    if not target or hasattr(session.config, "workerinput"):
        return  # under pytest-xdist only the controller, which sees every worker's reports, writes the record
    record = {
        "vllm": _version("vllm"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "excluded": sorted(i for i in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",") if i),
        "exitstatus": int(exitstatus),
        "tests": dict(sorted(_outcomes.items())),
        "skip_reasons": dict(sorted(_reasons.items())),
    }
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
