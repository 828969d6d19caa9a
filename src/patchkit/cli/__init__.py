"""The `patchkit` command line (`patchkit.cli:main`)."""

from patchkit.cli.main import main

__all__ = ["main"]
