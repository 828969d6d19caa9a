"""A closing summary of what did not run, where people look: beside the closing lines of the run.

pytest's own "N skipped" hides among hundreds of dots; this names each reason, how many tests it kept
from running, and the one command that enables them (the command each skip reason carries).
"""

from __future__ import annotations

import re
from collections import Counter

ENABLING = re.compile(r"(apt-get install [\w .-]+|nox -s [\w-]+|pip install [\w .=<>-]+)")


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter()
    for report in skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    terminalreporter.section("what did not run", sep="=", yellow=True, bold=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:4d} test(s): {reason}")
        enabling = ENABLING.search(reason)
        if enabling:
            terminalreporter.write_line(f"      to run them: {enabling.group(1).strip()}")
