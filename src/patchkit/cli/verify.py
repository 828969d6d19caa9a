"""The `patchkit verify` command; the group in cli/main.py registers it and maps PatchkitError to exit 2.

Everything heavy is imported inside the command, so `patchkit --help` stays fast.
"""

from __future__ import annotations

import json
import sys

import click

from patchkit import PINNED_VLLM
from patchkit.cli.options import images_option, json_option, patches_option


@click.command("verify")
@click.option(
    "--versions", default=None, metavar="SPEC",
    help=f"Versions to check: a list (0.30.0,0.33.0) or a PEP 440 range (>=0.30). "
    f"Default: the pinned release ({PINNED_VLLM}) and every newer one.",
)
@click.option("--git", "git_location", default=None, metavar="PATH_OR_URL",
              help="Check tags and refs of this git repository instead of releases on the index.")
@click.option("--tags", "tag_globs", multiple=True, metavar="GLOB",
              help="With --git: tags to check (shell glob, repeatable; default 'v*'), filtered by --versions.")
@click.option("--ref", "refs", multiple=True, metavar="REF",
              help="With --git: a branch or commit to check as well (repeatable), e.g. main.")
@click.option("--with", "with_sources", multiple=True, metavar="SRC",
              help="A further source combined with every version, e.g. flashinfer-python==0.7.2.post1.")
@patches_option
@images_option  # none there: the full series stands alone
@json_option
@click.option("--markdown", is_flag=True, help="GitHub-flavoured Markdown (a CI job summary, an issue body).")
@click.option("--kernels", is_flag=True,
              help="Instead of the matrix: the kernel census of a release wheel (default: the pinned release's, or "
              "the one version --versions names): does every compiled kernel the GLM-5.3 NVFP4 path needs carry "
              "code that loads on GB10 (sm_121)? Exit 1 when one lost it.")
@click.option("--platform", "wheel_platform", type=click.Choice(["aarch64", "x86_64"]), default="aarch64",
              show_default=True, help="With --kernels: whose wheel (a Spark's is aarch64; both carry the same sm_12x set in 0.33.0).")
@click.option("--wheel", "wheel_file", type=click.Path(dir_okay=False), default=None,
              help="With --kernels: a wheel file on disk instead of the release's from the index.")
def verify_command(versions, git_location, tag_globs, refs, with_sources, patches_dir, images_dir, as_json, markdown,
                   kernels, wheel_platform, wheel_file):
    """Each image's series against upstream vLLM versions: a matrix patch x version.

    Exit 0: nothing regressed. 1: a patch broken (in range) on the pinned release or a newer version,
    or one that applies on the pinned release no longer matching a newer one. 2: bad input.
    """
    if kernels:
        _kernel_census(versions, wheel_platform, wheel_file, as_json)
    elif wheel_file:
        raise click.UsageError("--wheel goes with --kernels")
    from rich.console import Console

    from patchkit.errors import PatchkitError
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources import open_source
    from patchkit.verify.matrix import compute, load_image_series
    from patchkit.verify.render import render, to_dict, to_markdown
    from patchkit.verify.targets import git_targets, index_targets, parse_versions

    if as_json and markdown:
        raise click.UsageError("--json and --markdown are exclusive")
    if (tag_globs or refs) and not git_location:
        raise click.UsageError("--tags and --ref need --git PATH_OR_URL")
    wanted = parse_versions(versions)
    patchset = load_patchset(patches_dir)
    image_series = load_image_series(images_dir, patchset)
    if git_location:
        targets = git_targets(git_location, tag_globs or ("v*",), refs, wanted)
    else:
        targets = index_targets(wanted)
    progress = sys.stderr.isatty()
    extra = [open_source(spec, progress=progress) for spec in with_sources]
    if any("vllm" in source.versions() for source in extra):
        raise PatchkitError("--with takes sources of other packages (FlashInfer); vLLM is what verify iterates")
    matrix = compute(patchset, targets, image_series=image_series, extra=extra, progress=progress)
    if as_json:
        click.echo(json.dumps(to_dict(matrix), indent=2, sort_keys=True))
    elif markdown:
        click.echo(to_markdown(matrix))
    else:
        console = Console()
        for renderable in render(matrix):
            console.print(renderable)
    sys.exit(matrix.exit_code)


def _kernel_census(versions: str | None, platform: str, wheel_file: str | None, as_json: bool) -> None:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from patchkit.errors import PatchkitError
    from patchkit.verify.kernels import census
    from patchkit.wheels.release import release_wheel

    if wheel_file:
        wheel = Path(wheel_file)
    else:
        version = versions or PINNED_VLLM
        if any(c in version for c in ",<>=~!*"):
            raise PatchkitError(f"--kernels reads one release's wheel: give --versions one version, not {version!r}")
        wheel = release_wheel(version, platform, progress=sys.stderr.isatty())
    result = census(wheel)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        table = Table(title=f"kernel census of {result.wheel}: code that loads on GB10 (sm_121)", title_justify="left")
        for col in ("kernel", "loads on sm_121", "all targets", "verdict"):
            table.add_column(col)
        for row in result.rows:
            verdict = "[green]ok[/]" if row.loadable else ("[red]MISSING[/]" if row.need.required else "[yellow]none (not for GB10)[/]")
            table.add_row(f"{row.need.name}\n[dim]{row.need.why}[/]", ", ".join(sorted(row.loadable)) or "-",
                          ", ".join(sorted(row.targets)) or "-", verdict)
        console = Console()
        console.print(table)
        console.print("compiled at run time on 12.x (need CUDA 13's nvcc where vLLM runs): FlashInfer's sparse MLA "
                      "(FLASHINFER_MLA_SPARSE_SM120), DeepGEMM")
    sys.exit(0 if result.ok else 1)
