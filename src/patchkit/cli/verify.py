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
@click.option("--kernels", "--compile", "census_flag", is_flag=True, hidden=True)  # moved: `patchkit census`
def verify_command(versions, git_location, tag_globs, refs, with_sources, patches_dir, images_dir, as_json, markdown,
                   census_flag):
    """Each image's series against upstream vLLM versions: a matrix patch x version.

    Exit 0: nothing regressed. 1: a patch broken (in range) on the pinned release or a newer version,
    or one that applies on the pinned release no longer matching a newer one. 2: bad input.
    """
    if census_flag:  # where the kernel census lived before it became a command of its own
        raise click.UsageError("the kernel census is its own command: patchkit census [--compile] [--release VERSION]")
    from rich.console import Console

    from patchkit.images.definitions import every_series
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources import open_source
    from patchkit.verify.matrix import compute
    from patchkit.verify.render import render, to_dict, to_markdown
    from patchkit.verify.targets import git_targets, index_targets, parse_versions

    if as_json and markdown:
        raise click.UsageError("--json and --markdown are exclusive")
    if (tag_globs or refs) and not git_location:
        raise click.UsageError("--tags and --ref need --git PATH_OR_URL")
    wanted = parse_versions(versions)
    patchset = load_patchset(patches_dir)
    image_series = every_series(images_dir, patchset)
    if git_location:
        targets = git_targets(git_location, tag_globs or ("v*",), refs, wanted)
    else:
        targets = index_targets(wanted)
    progress = sys.stderr.isatty()
    extra = [open_source(spec, progress=progress) for spec in with_sources]
    for spec, source in zip(with_sources, extra, strict=True):
        if "vllm" in source.versions():
            raise click.UsageError(f"--with {spec} holds vLLM: --with takes sources of other packages (FlashInfer); "
                                   "vLLM is what verify iterates")
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
