"""The patching commands: `list`, `check` and `diff` read a source; `apply`, `revert` and `status` work on a
target tree under its lock. cli/main.py registers them (COMMANDS).

Exit codes: 0 success; 1 a patch does not apply or is broken; 2 bad input or usage.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from patchkit import PINNED_SOURCES
from patchkit.cli.common import (
    assume_option,
    console,
    emit,
    err_console,
    json_option,
    load_series,
    parse_assumed,
    patches_option,
    refuse_if_out_of_every_range,
    series_option,
)
from patchkit.patching import planner, report
from patchkit.patching.plan_record import check_record, plan_record, status_record


@click.command("list")
@patches_option
@series_option
@json_option
def list_cmd(patches_dir, series, as_json):
    """The patches of a series, in application order, with their provenance."""
    _, patches = load_series(patches_dir, series)
    rows = [
        {
            "id": p.id,
            "title": p.title,
            "ranges": {k: str(v) for k, v in p.ranges.items()},
            "upstream": p.upstream,
            "license": p.origin["license"],
            "digest": p.digest,
        }
        for p in patches
    ]
    from rich.table import Table

    table = Table(title="patch series (application order)", title_justify="left")
    for col in ("#", "patch", "title", "applies to", "upstream"):
        table.add_column(col, overflow="fold")
    for i, r in enumerate(rows, 1):
        ranges = "; ".join(f"{k} {v}" for k, v in r["ranges"].items())
        table.add_row(str(i), r["id"], r["title"], ranges, r["upstream"]["state"])
    emit(as_json, {"patches": rows}, table)


@contextlib.contextmanager
def _open(specs: tuple[str, ...]):
    """(the sources combined, their Companion or None); a directory among them is read under its lock (it
    may be a target being written) and refused while an interrupted run's journal is in it. A vLLM release
    given without FlashInfer is checked with the FlashInfer it pins, or what `sources.companion`'s policy
    checks instead (as `verify` does); a FlashInfer among the sources is checked as given."""
    from patchkit.patching.tree import read_locked
    from patchkit.sources import combine_sources, open_source
    from patchkit.sources.companion import with_companion

    if not specs:
        raise click.UsageError("give at least one --source")
    with contextlib.ExitStack() as locks:
        for spec in specs:
            if Path(spec).expanduser().is_dir():
                locks.enter_context(read_locked(Path(spec).expanduser()))
        sources, companion = with_companion([open_source(s) for s in specs], progress=err_console.is_terminal)
        yield combine_sources(sources), companion


source_option = click.option(
    "--source", "sources", multiple=True, metavar="SRC", default=PINNED_SOURCES, show_default=True,
    help="Directory, version (0.33.0, flashinfer-python==0.7.2.post1), git:PATH@REF, or .whl. Repeatable.",
)


@click.command()
@source_option
@patches_option
@series_option
@assume_option
@json_option
def check(sources, patches_dir, series, assumed, as_json):
    """Does the series apply to SRC? Every anchor asserted; nothing written."""
    _, patches = load_series(patches_dir, series)
    with _open(sources) as (source, companion):
        plan = planner.plan(patches, source, versions=parse_assumed(assumed))
    _report_companion(companion)
    refuse_if_out_of_every_range(plan)
    labels = {planner.State.NOT_APPLIED: "applies"}
    emit(as_json, check_record(plan, companion).to_dict(), report.plan_table(plan, labels=labels))
    sys.exit(0 if plan.ok else 1)


def _report_companion(companion) -> None:
    """The release's companion finding on stderr (a FlashInfer pin the index never published, and what was
    checked instead), before anything that may stop the command; stdout keeps the report or the diff."""
    if companion is not None and companion.finding:
        err_console.print(f"{companion.finding}", style="yellow", markup=False, highlight=False, soft_wrap=True)


@click.command()
@source_option
@patches_option
@series_option
@assume_option
def diff(sources, patches_dir, series, assumed):
    """The unified diff of the series against SRC, for review or an upstream pull request."""
    _, patches = load_series(patches_dir, series)
    with _open(sources) as (source, companion):
        plan = planner.plan(patches, source, versions=parse_assumed(assumed))
    _report_companion(companion)
    plan.raise_for_errors()
    click.echo(plan.diff(), nl=False)


def target_command(f):
    """The options every command on a target tree takes."""
    for option in reversed([
        click.option("--target", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True),
        patches_option, series_option, assume_option, json_option,
        click.option("--wait", type=click.FloatRange(min=0), default=60, show_default=True, metavar="SECONDS",
                     help="How long to wait for another patchkit run on the same target."),
    ]):
        f = option(f)
    return click.command(f.__name__)(f)


@contextlib.contextmanager
def _locked(target: Path, wait: float):
    """The target locked for this command, any interrupted run finished first, read as a DirectorySource."""
    from patchkit.patching.tree import open_target
    from patchkit.sources import DirectorySource

    with open_target(target, wait=wait) as locked:
        if locked.recovery:
            err_console.print(f"[yellow]{target}: {locked.recovery.describe()}[/]", soft_wrap=True)
        yield locked, DirectorySource(target)


def _run_on_target(target, patches_dir, series, assumed, as_json, wait, *, mode: planner.Mode, done: planner.State,
                   done_label: str, nothing: str) -> None:
    """Plan `mode` on the tree, write only when every patch is whole, report, exit 0/1."""
    _, patches = load_series(patches_dir, series)
    versions = parse_assumed(assumed)
    with _locked(target, wait) as (locked, source):
        plan = planner.plan(patches, source, mode=mode, versions=versions)
        if mode == "apply":
            refuse_if_out_of_every_range(plan)
        if plan.ok and plan.changes:
            locked.write_plan(source, plan)
    labels = {done: done_label if plan.ok else str(done)}
    emit(as_json, plan_record(plan).to_dict(), report.plan_table(plan, labels=labels))
    if plan.ok and not plan.changes and not as_json:
        console.print(f"nothing to do: {nothing} (no file changed)")
    sys.exit(0 if plan.ok else 1)


@target_command
def apply(target, patches_dir, series, assumed, as_json, wait):
    """Apply the series to a vLLM tree: all patches or none, atomically."""
    _run_on_target(target, patches_dir, series, assumed, as_json, wait, mode=planner.Mode.APPLY, done=planner.State.NOT_APPLIED,
                   done_label="applied now", nothing="the series is already applied")


@target_command
def revert(target, patches_dir, series, assumed, as_json, wait):
    """Undo the series, restoring the original bytes exactly."""
    _run_on_target(target, patches_dir, series, assumed, as_json, wait, mode=planner.Mode.REVERT, done=planner.State.APPLIED,
                   done_label="reverted now", nothing="no patch of the series is applied")


@target_command
def status(target, patches_dir, series, assumed, as_json, wait):
    """Per-patch state of a tree, read from its text."""
    patchset, patches = load_series(patches_dir, series)
    versions = parse_assumed(assumed)
    with _locked(target, wait) as (_, source):
        plan = planner.plan(patches, source, versions=versions)
    from patchkit.wheels.manifest import installed_report  # a site-packages with a patched wheel names its patches

    wheels, lines = installed_report(target, patchset.patches)
    emit(as_json, status_record(plan, wheels).to_dict(), report.plan_table(plan))
    for line in [] if as_json else lines:
        console.print(line, markup=False, highlight=False)
    sys.exit(0 if plan.ok else 1)


COMMANDS = (list_cmd, check, diff, apply, revert, status)  # `upstream`: cli/upstream.py
