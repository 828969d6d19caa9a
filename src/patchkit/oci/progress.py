"""Progress for blob transfers: rich bars on a terminal, nothing when quiet.

Transfers report through this small interface so the registry client and the layer reader do not
depend on rich, and tests run silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Progress(Protocol):
    def task(self, description: str, total: int | None) -> AbstractContextManager[Callable[[int], None]]: ...

    def note(self, message: str) -> None: ...


class Quiet:
    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        yield lambda n: None

    def note(self, message: str) -> None:
        pass


class RichProgress:
    """Byte-counting bars on `console` (a rich Console; stderr by default)."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as Bars

        with Bars(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=self.console, transient=False) as bars:
            task_id = bars.add_task(description, total=total)
            yield lambda n: bars.advance(task_id, n)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False)
