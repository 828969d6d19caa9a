"""The image commands: `build` (an image: its base plus one layer of patched files), `load` (an OCI layout's
linux/arm64 image into the local engine, to build on with --load) and `mirrors` (where CI copies each
pinned base). cli/main.py registers them (COMMANDS)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from patchkit.cli.common import console, err_console, images_option, json_option, patches_option
from patchkit.localfiles import atomic_write


@click.command("build")
@click.argument("image")
@click.option("--base", help="Base to build on instead of the image's pinned one: a registry reference or an OCI layout path.")
@click.option("--push", multiple=True, metavar="REF", help="Push to this repository (computed tag) or tag. Repeatable.")
@click.option("--output", type=click.Path(path_type=Path), help="OCI image layout directory (default build/oci/IMAGE).")
@click.option("--dry-run", is_flag=True, help="Print what would change and the digest; write nothing.")
@click.option("--engine", is_flag=True, help="Build through a Docker-API engine (Docker, podman) instead.")
@click.option("--load", is_flag=True, help="Build into the local Docker/podman engine; when the base is already "
              "there only the patched files move (else as --engine).")
@click.option("--engine-url", help="Docker-API endpoint, e.g. unix:///run/podman/podman.sock.")
@click.option("--result-json", type=click.Path(path_type=Path), help="Write the build summary (digest, tags) here.")
@click.option("--revision", help="Source revision for the OCI annotations (default: git HEAD).")
@click.option("--source-url", help="Source URL for the OCI annotations.")
@click.option("--proven", type=click.Path(path_type=Path, dir_okay=False), metavar="RECEIPT",
              help="Write or push only the digest this `patchkit smoke-image --receipt` proved for IMAGE "
              "(exit 1 otherwise, before anything is written). Not with --engine or --load.")
@patches_option
@images_option
@json_option
def build_cmd(image, base, push, output, dry_run, engine, load, engine_url, result_json, revision, source_url, proven,
              patches_dir, images_dir, as_json):
    """Build IMAGE: the base plus one layer of patched files, linux/arm64, reproducible, no daemon."""
    from patchkit.images.build import build
    from patchkit.oci.progress import RichProgress
    from patchkit.smoke.image_proof import proven_digest

    if proven and (engine or load):
        raise click.UsageError("--proven holds the daemonless build to a proved digest; an engine build's image "
                               "is the engine's own (prove the layout, then push it without --engine/--load)")
    result = build(
        image, base=base, push=push, output=output, dry_run=dry_run, engine=engine, load=load, engine_url=engine_url,
        images_dir=images_dir, patches_dir=patches_dir, revision=revision, source_url=source_url,
        progress=RichProgress(err_console), proven=proven_digest(proven, image) if proven else None,
    )
    summary = result.summary()
    for patch_id, note in summary["notes"].items():
        err_console.print(f"[yellow]{patch_id}: {note}[/]")
    if result_json:
        atomic_write(result_json, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        console.print(_build_table(summary))


def _build_table(summary: dict):
    from rich.table import Table

    table = Table(title=f"{summary['image']} (linux/arm64)", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key in ("route", "digest", "tag", "base", "output", "engine_image", "transferred_bytes"):
        if summary.get(key):
            table.add_row(key, str(summary[key]))
    table.add_row("series", ", ".join(summary["series"]))
    if summary.get("skipped"):
        table.add_row("upstreamed (left out)", ", ".join(summary["skipped"]))
    table.add_row("patched files", "\n".join(summary["files"]))
    for ref in summary.get("pushed", []):
        table.add_row("pushed", ref)
    return table


@click.command("load")
@click.argument("layout", metavar="LAYOUT[:REF]")
@click.option("--tag", help="The name the engine gets it under (default patchkit/<layout folder>:<REF>).")
@click.option("--engine-url", "--engine", "engine_url",
              help="Docker-API endpoint, e.g. unix:///run/podman/podman.sock (default DOCKER_HOST, else Docker's socket).")
@json_option
def load_cmd(layout, tag, engine_url, as_json):
    """Load LAYOUT's linux/arm64 image into the local Docker/podman engine (a docker-archive through the
    engine's API; skopeo 1.9 cannot read a layout whose entry is a manifest list). Then:
    `patchkit build IMAGE --load --base TAG`."""
    from patchkit.images.load import load_layout
    from patchkit.oci.progress import RichProgress

    loaded = load_layout(layout, tag=tag, engine_url=engine_url, progress=RichProgress(err_console))
    summary = {"tag": loaded.tag, "image_id": loaded.image_id, "config": loaded.config_digest,
               "layers": loaded.layers, "sent_bytes": loaded.sent}
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        console.print(f"loaded {loaded.tag} ({loaded.image_id}); build on it with "
                      f"`patchkit build IMAGE --load --base {loaded.tag}`")


@click.command("mirrors")
@click.argument("prefix")
@click.argument("image", required=False)
@patches_option
@images_option
def mirrors_cmd(prefix, image, patches_dir, images_dir):
    """One "SOURCE MIRROR" line per distinct pinned base, of IMAGE or of every image.

    SOURCE is the base as its image.toml pins it, without the tag (skopeo refuses tag and digest
    together); MIRROR is the same digest under PREFIX (e.g. ghcr.io/owner). CI copies each base there
    once (skopeo copy --preserve-digests) and builds every image on its copy. An unknown IMAGE: exit 2.
    """
    from patchkit.images.definitions import load_images, mirrors
    from patchkit.patching.patchset import load_patchset

    patchset = load_patchset(patches_dir)
    images = load_images(images_dir, patchset)
    for source, mirror in mirrors(images, prefix, image):
        click.echo(f"{source} {mirror}")


COMMANDS = (build_cmd, load_cmd, mirrors_cmd)
