"""The `patchkit` command line: parse arguments, call the library, render a rich table or --json.

Exit codes: 0 success; 1 a patch does not apply or is broken (or, for verify, a regression);
2 bad input or usage (malformed files, unknown names, unreachable sources).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from . import PINNED_SOURCES, engine, report
from .errors import PatchkitError, PatchFailed
from .model import PatchSet, load_patchset

console = Console()
err_console = Console(stderr=True)
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_dir(name: str, env: str) -> Path:
    """patches/ and images/ of this checkout, overridable for installed copies and tests."""
    if os.environ.get(env):
        return Path(os.environ[env])
    for base in (Path.cwd(), REPO_ROOT):
        if (base / name).is_dir():
            return base / name
    return Path.cwd() / name


def load_series(patches_dir: Path, series: str | None) -> tuple[PatchSet, list]:
    """`--series full` (the default) is the whole set; any other name is an image's own series."""
    patchset = load_patchset(patches_dir)
    if series in (None, "full"):
        return patchset, patchset.series()
    from .images import load_images  # images depend on the patch model, not the other way round

    images_dir = default_dir("images", "PATCHKIT_IMAGES")
    if not (images_dir / series / "image.toml").is_file():
        names = sorted(p.parent.name for p in images_dir.glob("*/image.toml"))
        raise PatchkitError(f"unknown series {series!r}: use 'full' or an image name ({', '.join(names) or 'none'})")
    images = load_images(images_dir, patchset)
    return patchset, patchset.series(images[series].series)


def parse_assumed(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        package, sep, version = value.partition("=")
        if not sep or not package or not version:
            raise PatchkitError(f"--assume-version takes PACKAGE=VERSION, got {value!r}")
        out[package] = version
    return out


def emit(as_json: bool, payload: dict, renderable=None) -> None:
    if as_json:
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
    elif renderable is not None:
        console.print(renderable)


class PatchkitGroup(click.Group):
    """Turns patchkit's errors into their exit codes with a one-paragraph message, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PatchkitError as e:
            err_console.print(f"[bold red]patchkit: {'patch failed' if isinstance(e, PatchFailed) else 'error'}:[/] ", end="")
            err_console.print(str(e), markup=False, highlight=False)
            sys.exit(e.exit_code)


series_option = click.option("--series", default=None, help="'full' (default) or an image name whose series to use.")
patches_option = click.option(
    "--patches", "patches_dir", type=click.Path(path_type=Path), default=None, help="Patch set directory."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
assume_option = click.option(
    "--assume-version", "assumed", multiple=True, metavar="PKG=VER",
    help="Treat a package as this release (e.g. a dev-build base: vllm=0.30.0).",
)


@click.group(cls=PatchkitGroup)
@click.version_option(package_name="patchkit")
def main() -> None:
    """Anchor-asserted, fail-closed vLLM patches for GLM-5.3-Flash on DGX Spark."""


@main.command("list")
@patches_option
@series_option
@json_option
def list_cmd(patches_dir, series, as_json):
    """The patches of a series, in application order, with their provenance."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
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


def _open(specs: tuple[str, ...]):
    from .sources import combine_sources, open_source

    if not specs:
        raise PatchkitError("give at least one --source")
    sources = [open_source(s) for s in specs]
    return sources[0] if len(sources) == 1 else combine_sources(sources)


source_option = click.option(
    "--source", "sources", multiple=True, metavar="SRC", default=PINNED_SOURCES, show_default=True,
    help="Directory, version (0.33.0, flashinfer-python==0.7.2.post1), git:PATH@REF, or .whl. Repeatable.",
)


@main.command()
@source_option
@patches_option
@series_option
@assume_option
@json_option
def check(sources, patches_dir, series, assumed, as_json):
    """Does the series apply to SRC? Every anchor asserted; nothing written."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    plan = engine.plan(patches, _open(sources), versions=parse_assumed(assumed))
    labels = {engine.State.NOT_APPLIED: "applies"}
    emit(as_json, report.plan_to_dict(plan), report.plan_table(plan, labels=labels))
    sys.exit(0 if plan.ok else 1)


@main.command()
@source_option
@patches_option
@series_option
@assume_option
def diff(sources, patches_dir, series, assumed):
    """The unified diff of the series against SRC, for review or an upstream pull request."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    plan = engine.plan(patches, _open(sources), versions=parse_assumed(assumed))
    plan.raise_for_errors()
    click.echo(plan.diff(), nl=False)


def _target(target: Path):
    from .sources import DirectorySource
    from .tree import recover

    recovery = recover(target)
    if recovery:
        err_console.print(f"[yellow]{target}: {recovery.describe()}[/]")
    return DirectorySource(target)


def _write(target_dir: Path, source, plan) -> None:
    from .tree import write_changes

    write_changes(target_dir, [(source.package_root(c.package) / c.path, c) for c in plan.changes])


@main.command()
@click.option("--target", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@patches_option
@series_option
@assume_option
@json_option
def apply(target, patches_dir, series, assumed, as_json):
    """Apply the series to a vLLM tree: all patches or none, atomically."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    source = _target(target)
    plan = engine.plan(patches, source, versions=parse_assumed(assumed))
    if plan.ok and plan.changes:
        _write(target, source, plan)
    labels = {engine.State.NOT_APPLIED: "applied now" if plan.ok else "not applied"}
    emit(as_json, report.plan_to_dict(plan), report.plan_table(plan, labels=labels))
    if plan.ok and not plan.changes and not as_json:
        console.print("nothing to do: the series is already applied (no file changed)")
    sys.exit(0 if plan.ok else 1)


@main.command()
@click.option("--target", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@patches_option
@series_option
@assume_option
@json_option
def revert(target, patches_dir, series, assumed, as_json):
    """Undo the series, restoring the original bytes exactly."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    source = _target(target)
    plan = engine.plan(patches, source, mode="revert", versions=parse_assumed(assumed))
    if plan.ok and plan.changes:
        _write(target, source, plan)
    labels = {engine.State.APPLIED: "reverted now" if plan.ok else "applied"}
    emit(as_json, report.plan_to_dict(plan), report.plan_table(plan, labels=labels))
    if plan.ok and not plan.changes and not as_json:
        console.print("nothing to do: no patch of the series is applied (no file changed)")
    sys.exit(0 if plan.ok else 1)


@main.command()
@click.option("--target", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
@patches_option
@series_option
@assume_option
@json_option
def status(target, patches_dir, series, assumed, as_json):
    """Per-patch state of a tree, read from its text."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    source = _target(target)
    plan = engine.plan(patches, source, versions=parse_assumed(assumed))
    emit(as_json, report.plan_to_dict(plan) | {"changes": []}, report.plan_table(plan))
    sys.exit(0 if plan.ok else 1)


@main.command("build")
@click.argument("image")
@click.option("--base", help="Base to build on instead of the image's pinned one: a registry reference or an OCI layout path.")
@click.option("--push", multiple=True, metavar="REF", help="Push to this repository (computed tag) or tag. Repeatable.")
@click.option("--output", type=click.Path(path_type=Path), help="OCI image layout directory (default build/oci/IMAGE).")
@click.option("--dry-run", is_flag=True, help="Print what would change and the digest; write nothing.")
@click.option("--engine", is_flag=True, help="Build through a Docker-API engine (Docker, podman) instead.")
@click.option("--engine-url", help="Docker-API endpoint, e.g. unix:///run/podman/podman.sock.")
@click.option("--result-json", type=click.Path(path_type=Path), help="Write the build summary (digest, tags) here.")
@click.option("--revision", help="Source revision for the OCI annotations (default: git HEAD).")
@click.option("--source-url", help="Source URL for the OCI annotations.")
@patches_option
@json_option
def build_cmd(image, base, push, output, dry_run, engine, engine_url, result_json, revision, source_url, patches_dir,
              as_json):
    """Build IMAGE: the base plus one layer of patched files, linux/arm64, reproducible, no daemon."""
    from .build import build

    result = build(
        image, base=base, push=push, output=output, dry_run=dry_run, engine=engine, engine_url=engine_url,
        images_dir=default_dir("images", "PATCHKIT_IMAGES"),
        patches_dir=patches_dir or default_dir("patches", "PATCHKIT_PATCHES"),
        revision=revision, source_url=source_url, console=err_console,
    )
    summary = result.summary()
    if result_json:
        result_json.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))


@main.command()
@patches_option
@click.option("--write", is_flag=True, help="Rewrite UPSTREAM.md beside the patches folder.")
def upstream(patches_dir, write):
    """UPSTREAM.md from the patch metadata (printed, or written with --write)."""
    from .upstream import render

    patches_dir = patches_dir or default_dir("patches", "PATCHKIT_PATCHES")
    text = render(load_patchset(patches_dir))
    if write:
        (patches_dir.parent / "UPSTREAM.md").write_text(text)
    else:
        click.echo(text, nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
