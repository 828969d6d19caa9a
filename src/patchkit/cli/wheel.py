"""`patchkit wheel build` and `patchkit wheel index`: patched vLLM wheels and the static index pip reads.

cli/main.py registers the group; its PatchkitGroup turns PatchFailed (a series that does not apply:
no wheel written) into exit 1 and every other PatchkitError into exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from patchkit import PINNED_VLLM
from patchkit.cli.common import (
    SeriesChoice,
    console,
    err_console,
    images_option,
    json_option,
    load_series,
    patches_option,
)
from patchkit.errors import PatchkitError
from patchkit.patching.series import FULL_SERIES
from patchkit.wheels import ARCHES


@click.group("wheel")
def wheel_group() -> None:
    """Patched vLLM wheels: pip-installable without Docker (the Spark is aarch64)."""


@wheel_group.command("build")
@click.option("--vllm", "version", default=PINNED_VLLM, show_default=True, help="vLLM release whose wheel to patch.")
@click.option("--series", "series_names", multiple=True, metavar="NAME",
              help="'full' or an image name whose series to apply. Repeatable. Default: every image's series.")
@click.option("--platform", "platforms", multiple=True, type=click.Choice(ARCHES),
              help="manylinux wheel to patch. Repeatable. Default: both.")
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), default=Path("dist/wheels"),
              show_default=True, help="Folder the wheels are written to.")
@patches_option
@images_option
@json_option
def build_cmd(version, series_names, platforms, output, patches_dir, images_dir, as_json):
    """Patch the release's wheel with each series; write `vllm-VERSION+glm53.HASH-...whl`, reproducibly."""
    from patchkit.sources.companion import resolve_pin
    from patchkit.wheels.build import build_wheel
    from patchkit.wheels.release import pinned_companion, release_wheel
    from patchkit.wheels.requires import substitution_for

    names = series_names or tuple(sorted(p.parent.name for p in images_dir.glob("*/image.toml")))
    built = []
    companions = {}  # pin -> the companion policy's answer, asked once
    substitutions = {}  # pin -> the Substitution the wheel requires in its place, or None (the pin kept)
    for arch in platforms or ARCHES:
        release = release_wheel(version, arch, progress=err_console.is_terminal)
        pin = pinned_companion(release)
        if pin is not None and pin not in companions:  # reported before any build that may stop the command
            substitutions[pin] = None
            try:
                companion = resolve_pin(pin)
            except PatchkitError as e:  # advice about the pin, never a reason not to build the wheel
                companions[pin] = {"pin": pin, "checked": None, "finding": f"not asked: {e}"}
                err_console.print(f"vLLM {version}'s wheel requires flashinfer-python=={pin}; the index was not "
                                  f"asked whether it is published ({e}): {KEPT}", style="yellow", markup=False,
                                  highlight=False, soft_wrap=True)
            else:
                companions[pin] = companion.to_dict()
                substitutions[pin] = substitution_for(companion)
                if companion.finding:
                    err_console.print(_unpublished_pin(version, companion), style="yellow", markup=False,
                                      highlight=False, soft_wrap=True)
        for name in names:
            patchset, patches = load_series(patches_dir, SeriesChoice(name, images_dir))
            result = build_wheel(release, patches, name, output, substitution=substitutions.get(pin))
            extras = _extra_wheels(images_dir, name, patchset)
            built.append({**result.summary(), "extras": extras, "companion": companions[pin] if pin else None})
            err_console.print(f"{name} ({arch}): {result.path.name}")
            for s in result.manifest.substituted:
                err_console.print(f"  requires {s.requirement} where the release requires {s.release_requirement}",
                                  markup=False, highlight=False, soft_wrap=True)
            for requirement in extras:  # the image's [wheels] are not inside vLLM's wheel: installed beside it
                err_console.print(f"  its image also carries {requirement.split()[0]}: `pip install "
                                  f"{requirement.split()[0]}`, or pinned: `{requirement}` in a requirements file "
                                  "for `pip install --require-hashes -r`")
    if as_json:
        click.echo(json.dumps(built, indent=2, sort_keys=True))
    else:
        console.print(_table(built))


KEPT = "the patched wheel keeps the release's requirement, which pip cannot install where it is unpublished"


def _unpublished_pin(version: str, companion) -> str:
    """What a pin other than the one checked means for the patched wheel: pip cannot resolve the
    requirement as the release states it; the policy's substitute (sources.companion) is what verify and
    check read the series' FlashInfer edits against (a vLLM wheel carries none of them), and what the
    patched wheel requires in the pin's place (wheels.requires). Without a substitute the pin is kept."""
    head = f"vLLM {version}'s wheel requires {companion.dist}=={companion.pin}"
    if companion.how != "substitute":
        return f"{head}: {companion.finding}; {KEPT}"
    return (f"{head}, {companion.unpublished}: pip cannot install the wheel's requirements from the index as "
            f"they stand; {companion.checked} is the substitute `patchkit verify` and `check` read the series' "
            f"FlashInfer edits against, and the patched wheel requires {companion.dist}=={companion.checked} "
            "in the pin's place (recorded in its dist-info's patchkit.json)")


def _extra_wheels(images: Path, series: str, patchset) -> list[str]:
    """The pip requirement of each extra wheel (`[wheels]`) the image of `series` carries, hashes pinned."""
    if series == FULL_SERIES:
        return []
    from patchkit.images.definitions import load_image

    return [pin.requirement for _, pin in sorted(load_image(images, series, patchset).wheels.items())]


def _table(built: list[dict]):
    from rich.table import Table

    table = Table(title="patched wheels", title_justify="left")
    for column in ("series", "version", "wheel", "sha256", "patches"):
        table.add_column(column, overflow="fold")
    for b in built:
        table.add_row(b["series"], b["version"], Path(b["wheel"]).name, b["sha256"][:16], ", ".join(b["patches"]))
    return table


@wheel_group.command("index")
@click.argument("wheels", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for simple/ and index.html (default: WHEELS itself).")
@click.option("--base-url", metavar="URL",
              help="Where the wheels are downloaded from (e.g. a release's asset URL); default: beside the pages.")
@json_option
def index_cmd(wheels, output, base_url, as_json):
    """A static index of the wheels in WHEELS (PEP 503 pages with sha256, PEP 691 JSON beside them)."""
    from patchkit.wheels.index import write_index

    out = output or wheels
    found = write_index(wheels, out, base_url)
    listing = [{"filename": w.filename, "version": w.version, "sha256": w.sha256} for w in found]
    if as_json:
        click.echo(json.dumps({"index": str(out / "simple"), "wheels": listing}, indent=2, sort_keys=True))
    else:
        click.echo(f"{out / 'simple'}: {len(found)} wheel(s)")
        for w in listing:
            click.echo(f"  vllm=={w['version']}  {w['filename']}")
