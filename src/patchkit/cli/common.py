"""What every patchkit command shares: consoles, default folders, common options, JSON output and the
group that turns patchkit's errors into exit codes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import msgspec
from packaging.version import InvalidVersion, Version
from rich.console import Console

# The shared options live in a light module of their own (cli.options); commands take them from here too.
from patchkit.cli.options import (  # noqa: F401
    JSON_MODE,
    SeriesChoice,
    assume_option,
    images_option,
    json_option,
    patches_option,
    series_option,
)
from patchkit.errors import INTERNAL_ERROR_EXIT, PatchFailed, PatchkitError
from patchkit.jsondata import CommandError, FailedCommand
from patchkit.patching.patchset import Patch, PatchSet, load_patchset

console = Console()
err_console = Console(stderr=True)


def load_series(patches_dir: Path, series: SeriesChoice) -> tuple[PatchSet, list[Patch]]:
    """The patch set of --patches, and the series --series names in it (an image name: of --images)."""
    from patchkit.images.definitions import series_named  # images depend on the patch model, not the other way round

    patchset = load_patchset(patches_dir)
    return patchset, series_named(series.name, series.images_dir, patchset)


class InvalidAssumedVersion(PatchkitError):
    """An `--assume-version` `value` that is not PACKAGE=VERSION (`version` None), or whose `version` is
    not a PEP 440 version (exit 2)."""

    def __init__(self, value: str, version: str | None = None):
        self.value, self.version = value, version
        super().__init__(f"--assume-version takes PACKAGE=VERSION, got {value!r}" if version is None
                         else f"--assume-version {value}: {version!r} is not a version (e.g. vllm=0.30.0)")


class OutOfEveryRange(PatchFailed):
    """The tree's (or `--assume-version`'s) `versions` (package -> version) lie outside every patch's range
    on `source`, so nothing applies and nothing is "already applied" (exit 1)."""

    def __init__(self, versions: dict[str, str], source: str):
        self.versions, self.source = versions, source
        found = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        super().__init__(f"no patch of the series applies to {found} ({source}); see `patchkit list` for the ranges")


def parse_assumed(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        package, sep, version = value.partition("=")
        if not sep or not package or not version:
            raise InvalidAssumedVersion(value)
        try:
            Version(version)
        except InvalidVersion:
            raise InvalidAssumedVersion(value, version) from None
        out[package] = version
    return out


def refuse_if_out_of_every_range(plan) -> None:
    """A tree (or an assumed version) outside every patch's range is not "already applied": exit 1 (the
    rule is patching.carry's, the one images and wheels follow)."""
    from patchkit.patching.carry import out_of_every_range

    if out_of_every_range(plan):
        raise OutOfEveryRange(dict(plan.versions), plan.source)


def emit(as_json: bool, payload: dict, renderable=None) -> None:
    if as_json:
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    elif renderable is not None:
        console.print(renderable)


class PatchkitGroup(click.Group):
    """Turns every failure into its exit code and a one-paragraph message, never a traceback.

    PatchkitError: its own code (1 a patch does not apply, 2 bad input or environment). An OSError or a
    RecursionError that escaped the code that knows the path is still the environment's (exit 2).
    Anything else is a bug: exit 3, "internal error", and how to report it. With --json the same failure
    is also one JSON object on stdout.
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PatchkitError as e:
            self._fail(ctx, e.exit_code, "patch failed" if isinstance(e, PatchFailed) else "error", str(e))
        except click.exceptions.Exit:
            raise
        except click.ClickException as e:
            if ctx.meta.get(JSON_MODE):
                _json_failure(e.exit_code, "usage", e.format_message())
            raise
        except OSError as e:
            where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
            self._fail(ctx, 2, "error", f"{where or 'the file system'}: {e.strerror or e}")
        except RecursionError:
            self._fail(ctx, 2, "error", "an input file is nested too deeply to read (hostile or corrupt JSON?)")
        except Exception as e:  # the last line of defence: a bug, reported as one
            if os.environ.get("PATCHKIT_TRACEBACK"):
                raise
            self._fail(ctx, INTERNAL_ERROR_EXIT, "internal error",
                       f"{type(e).__name__}: {e}\nThis is a bug in patchkit, not in your input. Please report it "
                       "with the command line, `patchkit --version` and this message; run again with "
                       "PATCHKIT_TRACEBACK=1 to include the traceback.")

    @staticmethod
    def _fail(ctx, code: int, kind: str, message: str):
        if ctx.meta.get(JSON_MODE):
            _json_failure(code, kind, message)
        err_console.print(f"[bold red]patchkit: {kind}:[/] ", end="")
        err_console.print(message, markup=False, highlight=False, soft_wrap=True)
        sys.exit(code)


def _json_failure(code: int, kind: str, message: str) -> None:
    failed = FailedCommand(ok=False, error=CommandError(exit_code=code, kind=kind, message=message))
    click.echo(json.dumps(msgspec.to_builtins(failed), indent=2, sort_keys=True))
