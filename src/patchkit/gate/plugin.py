"""A pytest plugin (`-p patchkit.gate.plugin`) that writes each test id's outcome to a JSON file.

pytest's own junitxml splits an id into classname and name, losing the exact id a rerun needs; this
keeps the node id as pytest prints it. Outcomes: passed, failed, error (setup, teardown or collection),
skipped, xfailed, xpassed. With xdist, the controller receives every worker's reports and writes once.

Environment: PATCHKIT_GATE_OUTCOMES, the file to write; PATCHKIT_GATE_ONLY, a file of ids (one a
line): every other collected test is deselected (a rerun of the ids that differed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

_OUTCOMES: dict[str, str] = {}


def _outcome(report: pytest.TestReport) -> str | None:
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed"
        return report.outcome
    if report.failed:  # setup or teardown raised
        return "error"
    if report.when == "setup" and report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = _outcome(report)
    if outcome is not None and not (outcome != "error" and _OUTCOMES.get(report.nodeid) == "error"):
        _OUTCOMES[report.nodeid] = outcome


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _OUTCOMES[report.nodeid or "<collection>"] = "error"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = os.environ.get("PATCHKIT_GATE_ONLY")
    if not only:
        return
    wanted = set(Path(only).read_text().splitlines())
    keep = [i for i in items if i.nodeid in wanted]
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
    items[:] = keep


def pytest_sessionfinish(session: pytest.Session) -> None:
    where = os.environ.get("PATCHKIT_GATE_OUTCOMES")
    if not where or hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        return
    tmp = Path(where).with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(_OUTCOMES.items())), ensure_ascii=False, indent=0))
    tmp.replace(where)
