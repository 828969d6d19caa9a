"""What ran on which vLLM release, recorded by the run itself.

With PATCHKIT_RESULTS=path set (noxfile.py sets it for every release's run), the run writes at its end
the installed vLLM release, the torch and transformers beside it, the patches left out
(PATCHKIT_TEST_EXCLUDE), each test's outcome, the commit of the checkout it ran from (`git rev-parse
HEAD`, "+dirty" when the tree differed from it: a tracked change or an untracked file, at the start or
the end of the run), when it finished, and what narrowed it (the paths and node ids it was given, the
tests -k/-m deselected, whether it stopped early): tests/ran_where.py merges a narrowed run's cells into
the committed records only where they failed, so a partial run never erases a recorded result.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_outcomes: dict[str, str] = {}
_reasons: dict[str, str] = {}
_deselected: set[str] = set()
_commit_at_start: list[str | None] = []


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def checkout_commit(repo: Path = REPO) -> str | None:
    """HEAD of the checkout, with "+dirty" when its tree differs from HEAD; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=60)
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode or status.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def _selection(config) -> list[str]:
    """The paths and node ids the run was given, as node ids relative to the rootdir ([] = pytest's testpaths)."""
    selected = []
    for arg in config.args:
        path, sep, rest = str(arg).partition("::")
        where = (config.invocation_params.dir / path).resolve()
        try:
            path = where.relative_to(config.rootpath).as_posix()
        except ValueError:
            path = where.as_posix()
        selected.append(path + sep + rest)
    return selected


def pytest_sessionstart(session):
    if os.environ.get("PATCHKIT_RESULTS") and not hasattr(session.config, "workerinput"):
        _commit_at_start.append(checkout_commit())


def pytest_deselected(items):
    # -k/-m: under pytest-xdist the workers collect, and send theirs to the controller (pytest_testnodedown)
    _deselected.update(item.nodeid for item in items)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _deselected.update(getattr(node, "workeroutput", {}).get("patchkit_deselected", []))


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
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["patchkit_deselected"] = sorted(_deselected)
        return  # under pytest-xdist only the controller, which sees every worker's reports, writes the record
    target = os.environ.get("PATCHKIT_RESULTS")
    if not target:
        return
    commit = _commit_at_start[0] if _commit_at_start else None
    if commit is not None and not commit.endswith("+dirty") and checkout_commit() != commit:
        commit += "+dirty"  # the tree changed under the run: it ran on no one commit
    from patchkit.upstream.run_record import RunRecord, TestOutcome  # the one declaration its readers read too

    record = RunRecord(
        vllm=_version("vllm"), torch=_version("torch"), transformers=_version("transformers"),
        excluded=sorted(i for i in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",") if i),
        exitstatus=int(exitstatus), commit=commit, finished=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        selection=_selection(session.config), deselected=sorted(_deselected),
        stopped_early=bool(session.shouldstop or session.shouldfail or exitstatus == pytest.ExitCode.INTERRUPTED),
        tests={node: TestOutcome(outcome) for node, outcome in sorted(_outcomes.items())},
        skip_reasons=dict(sorted(_reasons.items())))
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
