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
@click.option("--compile", "jit", is_flag=True,
              help="With --kernels: the run-time compiled half instead of the wheel: compile, with CUDA 13's nvcc, the "
              "release's persistent top-k (its sdist's csrc/topk.cu, against torch's headers) and the sparse MLA SM120 "
              "kernels of the FlashInfer it pins (GLM-5.3's shapes) for sm_121a and sm_120f, and check ptxas' registers "
              "and static + requested dynamic shared memory against GB10's limits (101,376 B a block). Exit 1 when one "
              "exceeds them, 2 without nvcc. Cached in the user cache dir.")
def verify_command(versions, git_location, tag_globs, refs, with_sources, patches_dir, images_dir, as_json, markdown,
                   kernels, wheel_platform, wheel_file, jit):
    """Each image's series against upstream vLLM versions: a matrix patch x version.

    Exit 0: nothing regressed. 1: a patch broken (in range) on the pinned release or a newer version,
    or one that applies on the pinned release no longer matching a newer one. 2: bad input.
    """
    if jit and (not kernels or wheel_file):
        raise click.UsageError("--compile goes with --kernels, without --wheel")
    if jit:
        _jit_census(versions, as_json)
    if kernels:
        _kernel_census(versions, wheel_platform, wheel_file, as_json)
    elif wheel_file:
        raise click.UsageError("--wheel goes with --kernels")
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


def _kernel_census(versions: str | None, platform: str, wheel_file: str | None, as_json: bool) -> None:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from patchkit.census.kernels import census
    from patchkit.wheels.release import release_wheel

    if wheel_file:
        wheel = Path(wheel_file)
    else:
        wheel = release_wheel(_one_version(versions), platform, progress=sys.stderr.isatty())
    result = census(wheel)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        table = Table(title=f"kernel census of {result.wheel}: code that loads on GB10 (sm_121)", title_justify="left")
        for col in ("kernel", "loads on sm_121", "all targets", "verdict"):
            table.add_column(col, overflow="fold")
        for row in result.rows:
            verdict = "[green]ok[/]" if row.loadable else ("[red]MISSING[/]" if row.need.required else "[yellow]none (not for GB10)[/]")
            if row.over_limits:  # loads, but a kernel of it cannot launch within GB10's registers or shared memory
                verdict = f"[red]OVER GB10 LIMITS[/] ({len(row.over_limits)} kernels)"
            used = row.usage_summary()
            usage = (f"\n[dim]{used['kernels']} SASS kernels: <= {used['max_registers']} registers, "
                     f"<= {used['max_static_smem_bytes']:,} B static smem, <= {used['max_stack_bytes']:,} B stack[/]"
                     if used else "")
            table.add_row(f"{row.need.name}\n[dim]{row.need.why}[/]", (", ".join(sorted(row.loadable)) or "-") + usage,
                          ", ".join(sorted(row.targets)) or "-", verdict)
        console = Console()
        console.print(table)
        console.print("compiled at run time on 12.x (need CUDA 13's nvcc where vLLM runs): FlashInfer's sparse MLA "
                      "(FLASHINFER_MLA_SPARSE_SM120), DeepGEMM; `--compile` compiles them and vLLM's persistent top-k for GB10")
    sys.exit(0 if result.ok else 1)


def _jit_census(versions: str | None, as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from patchkit.census.jit_census import census, census_dict, find_nvcc
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.companion import companion_of
    from patchkit.sources.release import open_release

    version = _one_version(versions)
    find_nvcc()  # before any download: without nvcc nothing can be checked
    progress = sys.stderr.isatty()
    cache = ArchiveCache()
    # The FlashInfer it pins, or what the companion policy compiles instead (the same as verify's matrix).
    companion = companion_of(open_release("vllm", version, cache=cache, progress=progress), cache=cache)
    flashinfer = companion.checked if companion else None
    rows = census("vllm", version, progress=progress)
    if companion is not None and companion.checked:
        rows += census(companion.dist, companion.checked, progress=progress)
    result = census_dict(rows, {"vllm": version, "flashinfer-python": flashinfer})
    result["companion"] = companion.to_dict() if companion else None
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        sys.exit(0 if result["ok"] else 1)
    console = Console(width=None if sys.stdout.isatty() else 140)
    for unit in dict.fromkeys(row.unit for row in rows):
        unit_version = next(r.version for r in rows if r.unit == unit)  # not `version`: the release, said below
        table = Table(title=f"{unit} {unit_version}: ptxas' resource use against GB10's limits (sm_121)", title_justify="left")
        for col in ("kernel", "arch", "regs", "spill B", "static B", "dynamic B", "limit B", "verdict"):
            table.add_column(col, justify="left" if col in ("kernel", "arch", "verdict") else "right",
                             overflow="fold")  # a kernel's name is what a person searches for
        for row in (r for r in rows if r.unit == unit):
            verdict = f"[green]{row.verdict}[/]" if row.ok else f"[red]{row.verdict}[/]"
            shown = row.kernel if "<" in row.kernel else row.name.split("<")[0].rsplit("::", 1)[-1] + row.name[
                len(row.name.split("<")[0]):]
            table.add_row(shown, row.arch, str(row.registers), f"{row.spills:,}", f"{row.static_smem:,}",
                          f"{row.dynamic_smem:,}", f"{result['limits']['smem_per_block']:,}", verdict)
        console.print(table)
        # once per kernel, not per entry: the release's file:lines a verdict rests on (a refusal and its reach)
        for (kernel, verdict, ok), evidence in {(r.kernel, r.verdict, r.ok): r.evidence for r in rows
                                                if r.unit == unit and r.evidence}.items():
            console.print(f"{kernel}: {verdict}", style="green" if ok else "red", markup=False)
            for line in evidence:
                console.print(f"  {line}", markup=False)
    if companion is None:
        console.print(f"[yellow]vLLM {version} pins no flashinfer-python (requirements/cuda.txt): its sparse MLA not compiled[/]")
    elif companion.finding:
        console.print(f"vLLM {version}: {companion.finding}" + ("" if flashinfer else ": its sparse MLA not compiled"),
                      style="yellow", markup=False)
    sys.exit(0 if result["ok"] else 1)


def _one_version(versions: str | None) -> str:
    version = versions or PINNED_VLLM
    if any(c in version for c in ",<>=~!*"):
        raise click.UsageError(f"--kernels reads one release: give --versions one version, not {version!r}")
    return version
