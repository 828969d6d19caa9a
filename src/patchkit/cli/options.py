"""The options commands share, and where patches/ and images/ are when no option names them. Light on
imports (click only), so `patchkit verify` can take them before it loads anything heavy.

Every command that reads the patch set takes `--patches`, every one that reads image or variant
definitions `--images`; `--series NAME` comes with the `--images` its image name is looked up in. The
group's `--cache-dir` (or PATCHKIT_CACHE_DIR, as uv's --cache-dir has UV_CACHE_DIR) is the one cache root
patchkit.cache_root.default_cache_root returns to every cache user, in this process and the ones it
starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from patchkit import CHECKOUT

JSON_MODE = "patchkit.json"  # ctx.meta key: the command was asked for --json (failures are JSON too)
_IMAGES = "patchkit.images"  # ctx.meta key: the --images a --series name is looked up in


def one_release(value: str, option: str) -> str:
    """`value` as one release's PEP 440 version (normalised); click.BadParameter naming `option` (exit 2)
    when it is not one: a range or a list is refused too."""
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(value))
    except InvalidVersion:
        raise click.BadParameter(f"{value!r} is not a version (expected one release, e.g. 0.34.0)",
                                 param_hint=option) from None


def default_dir(name: str, env: str) -> Path:
    """patches/ and images/ of this checkout, overridable for installed copies and tests."""
    if os.environ.get(env):
        return Path(os.environ[env])
    for base in (Path.cwd(), CHECKOUT):
        if (base / name).is_dir():
            return base / name
    return Path.cwd() / name


def patches_home() -> Path:
    return default_dir("patches", "PATCHKIT_PATCHES")


def images_home() -> Path:
    return default_dir("images", "PATCHKIT_IMAGES")


@dataclass(frozen=True)
class SeriesChoice:
    """`--series NAME` with the `--images` folder an image name is looked up in."""

    name: str | None  # None or "full": the whole patch set
    images_dir: Path


def _remember_images(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    ctx.meta[_IMAGES] = value or images_home()


def _series_choice(ctx: click.Context, param: click.Parameter, value: str | None) -> SeriesChoice:
    return SeriesChoice(value, ctx.meta.get(_IMAGES) or images_home())


def _json_mode(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta[JSON_MODE] = value
    return value


def _cache_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        os.environ["PATCHKIT_CACHE_DIR"] = str(value)


_IMAGES_HELP = "Image definitions directory (default: ./images, this checkout's, or $PATCHKIT_IMAGES)."
patches_option = click.option(
    "--patches", "patches_dir", type=click.Path(path_type=Path), default=None,
    callback=lambda ctx, param, value: value or patches_home(),
    help="Patch set directory (default: ./patches, this checkout's, or $PATCHKIT_PATCHES).",
)
images_option = click.option(
    "--images", "images_dir", type=click.Path(path_type=Path), default=None,
    callback=lambda ctx, param, value: value or images_home(), help=_IMAGES_HELP,
)


def series_option(f):
    """`--series NAME` and the `--images DIR` it is looked up in, given to the command as one `series`
    (a SeriesChoice): an image name means nothing without its folder. --images is read first (eager)."""
    f = click.option("--series", "series", default=None, callback=_series_choice,
                     help="'full' (default) or an image name whose series to use.")(f)
    return click.option("--images", type=click.Path(path_type=Path), default=None, expose_value=False,
                        is_eager=True, callback=_remember_images, help=_IMAGES_HELP)(f)


# Eager: set before any other option is read, so a bad value of one is reported as JSON too.
json_option = click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_json_mode,
                           help="Machine-readable output (failures too: one JSON object on stdout).")
assume_option = click.option(
    "--assume-version", "assumed", multiple=True, metavar="PKG=VER",
    help="Treat a package as this release (e.g. a dev-build base: vllm=0.30.0).",
)
cache_dir_option = click.option(
    "--cache-dir", type=click.Path(path_type=Path, file_okay=False), envvar="PATCHKIT_CACHE_DIR",
    expose_value=False, is_eager=True, callback=_cache_dir,
    help="patchkit's cache (downloads, base blobs, engine reads, compile checks) [env: PATCHKIT_CACHE_DIR; "
    "default: the user cache directory].",
)
