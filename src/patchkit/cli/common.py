"""What every patchkit command shares: consoles, default folders, common options, JSON output and the
group that turns patchkit's errors into exit codes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from patchkit.errors import PatchFailed, PatchkitError
from patchkit.patching.patchset import PatchSet, load_patchset

console = Console()
err_console = Console(stderr=True)
from patchkit import CHECKOUT as REPO_ROOT  # noqa: E402


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
    from patchkit.images.definitions import (
        load_images,  # images depend on the patch model, not the other way round
    )

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
            err_console.print(str(e), markup=False, highlight=False, soft_wrap=True)
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


