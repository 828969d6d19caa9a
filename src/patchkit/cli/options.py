"""The options commands share, and where patches/ and images/ are when no option names them. Light on
imports (click only), so `patchkit verify` can take them before it loads anything heavy."""

from __future__ import annotations

import os
from pathlib import Path

import click

from patchkit import CHECKOUT


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


patches_option = click.option(
    "--patches", "patches_dir", type=click.Path(path_type=Path), default=None,
    callback=lambda ctx, param, value: value or patches_home(),
    help="Patch set directory (default: ./patches, this checkout's, or $PATCHKIT_PATCHES).",
)
images_option = click.option(
    "--images", "images_dir", type=click.Path(path_type=Path), default=None,
    callback=lambda ctx, param, value: value or images_home(),
    help="Image definitions directory (default: ./images, this checkout's, or $PATCHKIT_IMAGES).",
)
series_option = click.option("--series", default=None, help="'full' (default) or an image name whose series to use.")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
assume_option = click.option(
    "--assume-version", "assumed", multiple=True, metavar="PKG=VER",
    help="Treat a package as this release (e.g. a dev-build base: vllm=0.30.0).",
)
