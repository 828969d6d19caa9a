"""The `patchkit census` command: the kernel census, on its own beside verify's matrix. The wheel's half
reads a release wheel's compiled kernels (does every kernel the GLM-5.3 NVFP4 path needs carry code that
loads on GB10, sm_121?); `--compile` is the run-time compiled half, compiled with CUDA 13's nvcc and judged
by ptxas' resource use against GB10's limits. The library is census/; the group in cli/main.py registers
this command and maps PatchkitError to exit 2.
"""

from __future__ import annotations

import json
import sys

import click

from patchkit import PINNED_VLLM
from patchkit.cli.options import json_option, one_release


@click.command("census")
@click.option("--release", default=PINNED_VLLM, show_default=True, metavar="VERSION",
              callback=lambda ctx, param, value: one_release(value, "--release"),
              help="The vLLM release whose kernels are counted.")
@click.option("--platform", "wheel_platform", type=click.Choice(["aarch64", "x86_64"]), default="aarch64",
              show_default=True, help="Whose wheel (a Spark's is aarch64; both carry the same sm_12x set in 0.33.0).")
@click.option("--wheel", "wheel_file", type=click.Path(dir_okay=False), default=None,
              help="A wheel file on disk instead of the release's from the index.")
@click.option("--compile", "jit", is_flag=True,
              help="The run-time compiled half instead of the wheel: compile, with CUDA 13's nvcc, the release's "
              "persistent top-k (its sdist's csrc/topk.cu, against torch's headers) and the sparse MLA SM120 kernels of "
              "the FlashInfer it pins (GLM-5.3's shapes) for sm_121a and sm_120f, and check ptxas' registers and static "
              "+ requested dynamic shared memory against GB10's limits (101,376 B a block). Exit 2 without nvcc. "
              "Cached in the user cache dir.")
@json_option
def census_command(release, wheel_platform, wheel_file, jit, as_json):
    """The kernel census of a vLLM release for GB10 (sm_121): its wheel's compiled kernels, or with
    --compile the kernels compiled at run time.

    Exit 0: every kernel the GLM-5.3 NVFP4 path needs loads and fits. 1: one lost its GB10 code or exceeds
    GB10's limits. 2: bad input, or no nvcc for --compile.
    """
    if jit and wheel_file:
        raise click.UsageError("--compile compiles the release's sources: it takes no --wheel")
    if jit:
        _jit_census(release, as_json)
    _wheel_census(release, wheel_platform, wheel_file, as_json)


def _wheel_census(release: str, platform: str, wheel_file: str | None, as_json: bool) -> None:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from patchkit.census.kernels import census
    from patchkit.wheels.release import release_wheel

    if wheel_file:
        wheel = Path(wheel_file)
    else:
        wheel = release_wheel(release, platform, progress=sys.stderr.isatty())
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


def _jit_census(version: str, as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from patchkit.census.jit_census import census, census_dict, find_nvcc
    from patchkit.sources.cache import ArchiveCache
    from patchkit.sources.companion import companion_of
    from patchkit.sources.release import open_release

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
