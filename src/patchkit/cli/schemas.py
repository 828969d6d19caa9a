"""`patchkit schemas`: the JSON Schema of each file kind patchkit reads, for editors.

taplo (and the Even Better TOML editor extension built on it) validates TOML against JSON Schema as
people type; `.taplo.toml` maps each file kind to its schema under `schemas/`.
"""

from __future__ import annotations

import json

import click

from patchkit import CHECKOUT
from patchkit.images.schema import ImageFile
from patchkit.patching.schema import PatchFile, SeriesFile
from patchkit.tomlschema import json_schema
from patchkit.variants.schema import VariantFile

SCHEMAS = {
    "patch": (PatchFile, "patchkit patch", "patches/<id>/patch.toml: one anchor-asserted patch"),
    "series": (SeriesFile, "patchkit series", "patches/series.toml: the full series in application order"),
    "image": (ImageFile, "patchkit image", "images/<name>/image.toml: how one image is built"),
    "variant": (VariantFile, "patchkit variant", "images/<name>/variant.toml: the checkpoint variant an image serves"),
}


def rendered() -> dict[str, str]:
    """schemas/<kind>.schema.json -> its text."""
    return {f"{kind}.schema.json": json.dumps(json_schema(*spec), indent=2, sort_keys=True) + "\n"
            for kind, spec in SCHEMAS.items()}


@click.command("schemas")
@click.option("--write", is_flag=True, help="Rewrite schemas/ of this checkout.")
def schemas_command(write: bool) -> None:
    """The JSON Schema of patch.toml, series.toml, image.toml and variant.toml (printed, or --write)."""
    folder = CHECKOUT / "schemas"
    for name, text in rendered().items():
        if write:
            folder.mkdir(exist_ok=True)
            (folder / name).write_text(text)
            click.echo(f"wrote {folder / name}")
        else:
            click.echo(f"# {name}\n{text}", nl=False)
