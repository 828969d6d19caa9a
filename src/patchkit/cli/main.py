"""The `patchkit` command line: parse arguments, call the library, render a rich table or --json.

Exit codes: 0 success; 1 a patch does not apply or is broken (or, for verify, a regression);
2 bad input or usage (malformed files, unknown names, unreachable sources).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from patchkit import PINNED_SOURCES
from patchkit.cli.common import (
    PatchkitGroup,
    assume_option,
    console,
    default_dir,
    emit,
    err_console,
    json_option,
    load_series,
    parse_assumed,
    patches_option,
    refuse_if_out_of_every_range,
    series_option,
)
from patchkit.errors import PatchkitError
from patchkit.patching import planner, report
from patchkit.patching.patchset import load_patchset


@click.group(cls=PatchkitGroup)
@click.version_option(package_name="patchkit")
def main() -> None:
    """Anchor-asserted, fail-closed vLLM patches for GLM-5.3-Flash on DGX Spark."""


@main.command("list")
@patches_option
@series_option
@json_option
def list_cmd(patches_dir, series, as_json):
    """The patches of a series, in application order, with their provenance."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    rows = [
        {
            "id": p.id,
            "title": p.title,
            "ranges": {k: str(v) for k, v in p.ranges.items()},
            "upstream": p.upstream,
            "license": p.origin["license"],
            "digest": p.digest,
        }
        for p in patches
    ]
    from rich.table import Table

    table = Table(title="patch series (application order)", title_justify="left")
    for col in ("#", "patch", "title", "applies to", "upstream"):
        table.add_column(col, overflow="fold")
    for i, r in enumerate(rows, 1):
        ranges = "; ".join(f"{k} {v}" for k, v in r["ranges"].items())
        table.add_row(str(i), r["id"], r["title"], ranges, r["upstream"]["state"])
    emit(as_json, {"patches": rows}, table)


@contextlib.contextmanager
def _open(specs: tuple[str, ...]):
    """The sources, combined; a directory among them is read under its lock (it may be a target being
    written) and refused while an interrupted run's journal is in it."""
    from patchkit.patching.tree import read_locked
    from patchkit.sources import combine_sources, open_source

    if not specs:
        raise PatchkitError("give at least one --source")
    with contextlib.ExitStack() as locks:
        for spec in specs:
            if Path(spec).expanduser().is_dir():
                locks.enter_context(read_locked(Path(spec).expanduser()))
        sources = [open_source(s) for s in specs]
        yield sources[0] if len(sources) == 1 else combine_sources(sources)


source_option = click.option(
    "--source", "sources", multiple=True, metavar="SRC", default=PINNED_SOURCES, show_default=True,
    help="Directory, version (0.33.0, flashinfer-python==0.7.2.post1), git:PATH@REF, or .whl. Repeatable.",
)


@main.command()
@source_option
@patches_option
@series_option
@assume_option
@json_option
def check(sources, patches_dir, series, assumed, as_json):
    """Does the series apply to SRC? Every anchor asserted; nothing written."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    with _open(sources) as source:
        plan = planner.plan(patches, source, versions=parse_assumed(assumed))
    refuse_if_out_of_every_range(plan)
    labels = {planner.State.NOT_APPLIED: "applies"}
    emit(as_json, report.plan_to_dict(plan), report.plan_table(plan, labels=labels))
    sys.exit(0 if plan.ok else 1)


@main.command()
@source_option
@patches_option
@series_option
@assume_option
def diff(sources, patches_dir, series, assumed):
    """The unified diff of the series against SRC, for review or an upstream pull request."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    with _open(sources) as source:
        plan = planner.plan(patches, source, versions=parse_assumed(assumed))
    plan.raise_for_errors()
    click.echo(plan.diff(), nl=False)


def target_command(f):
    """The options every command on a target tree takes."""
    for option in reversed([
        click.option("--target", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True),
        patches_option, series_option, assume_option, json_option,
        click.option("--wait", type=click.FloatRange(min=0), default=60, show_default=True, metavar="SECONDS",
                     help="How long to wait for another patchkit run on the same target."),
    ]):
        f = option(f)
    return main.command(f.__name__)(f)


@contextlib.contextmanager
def _locked(target: Path, wait: float):
    """The target locked for this command, any interrupted run finished first, read as a DirectorySource."""
    from patchkit.patching.tree import open_target
    from patchkit.sources import DirectorySource

    with open_target(target, wait=wait) as locked:
        if locked.recovery:
            err_console.print(f"[yellow]{target}: {locked.recovery.describe()}[/]", soft_wrap=True)
        yield locked, DirectorySource(target)


def _run_on_target(target, patches_dir, series, assumed, as_json, wait, *, mode: str, done: planner.State,
                   done_label: str, nothing: str) -> None:
    """Plan `mode` on the tree, write only when every patch is whole, report, exit 0/1."""
    _, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    versions = parse_assumed(assumed)
    with _locked(target, wait) as (locked, source):
        plan = planner.plan(patches, source, mode=mode, versions=versions)
        if mode == "apply":
            refuse_if_out_of_every_range(plan)
        if plan.ok and plan.changes:
            locked.write_plan(source, plan)
    labels = {done: done_label if plan.ok else str(done)}
    emit(as_json, report.plan_to_dict(plan), report.plan_table(plan, labels=labels))
    if plan.ok and not plan.changes and not as_json:
        console.print(f"nothing to do: {nothing} (no file changed)")
    sys.exit(0 if plan.ok else 1)


@target_command
def apply(target, patches_dir, series, assumed, as_json, wait):
    """Apply the series to a vLLM tree: all patches or none, atomically."""
    _run_on_target(target, patches_dir, series, assumed, as_json, wait, mode="apply", done=planner.State.NOT_APPLIED,
                   done_label="applied now", nothing="the series is already applied")


@target_command
def revert(target, patches_dir, series, assumed, as_json, wait):
    """Undo the series, restoring the original bytes exactly."""
    _run_on_target(target, patches_dir, series, assumed, as_json, wait, mode="revert", done=planner.State.APPLIED,
                   done_label="reverted now", nothing="no patch of the series is applied")


@target_command
def status(target, patches_dir, series, assumed, as_json, wait):
    """Per-patch state of a tree, read from its text."""
    patchset, patches = load_series(patches_dir or default_dir("patches", "PATCHKIT_PATCHES"), series)
    versions = parse_assumed(assumed)
    with _locked(target, wait) as (_, source):
        plan = planner.plan(patches, source, versions=versions)
    from patchkit.wheels.manifest import installed_report  # a site-packages with a patched wheel names its patches

    wheels, lines = installed_report(target, patchset.patches)
    emit(as_json, report.plan_to_dict(plan) | {"changes": []} | ({"wheels": wheels} if wheels else {}),
         report.plan_table(plan))
    for line in [] if as_json else lines:
        console.print(line, markup=False, highlight=False)
    sys.exit(0 if plan.ok else 1)


@main.command("build")
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
@patches_option
@json_option
def build_cmd(image, base, push, output, dry_run, engine, load, engine_url, result_json, revision, source_url, patches_dir,
              as_json):
    """Build IMAGE: the base plus one layer of patched files, linux/arm64, reproducible, no daemon."""
    from patchkit.images.build import build

    result = build(
        image, base=base, push=push, output=output, dry_run=dry_run, engine=engine, load=load, engine_url=engine_url,
        images_dir=default_dir("images", "PATCHKIT_IMAGES"),
        patches_dir=patches_dir or default_dir("patches", "PATCHKIT_PATCHES"),
        revision=revision, source_url=source_url, console=err_console,
    )
    summary = result.summary()
    # Say what the build could not check (e.g. a base without FlashInfer: the pad's FlashInfer asserts).
    summary["notes"] = {r.patch.id: r.detail for r in result.built.prepared.plan.results if r.detail}
    for patch_id, note in summary["notes"].items():
        err_console.print(f"[yellow]{patch_id}: {note}[/]")
    if result_json:
        result_json.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
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


pin_options = [
    click.option("--pin-config", metavar="SHA256", help="config.json pin for a variant without a known one."),
    click.option("--pin-index", metavar="SHA256", help="model.safetensors.index.json pin, likewise."),
]


def with_pins(f):
    for option in reversed(pin_options):
        f = option(f)
    return f


@main.command()
@click.argument("path", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--variant", help="Variant to check against (default: recognised by its pinned hashes).")
@click.option("--tp", type=int, help="Tensor-parallel size for the per-rank memory estimate (default: the recipe's).")
@with_pins
@json_option
def preflight(path, variant, tp, pin_config, pin_index, as_json):
    """Will this checkpoint load? Identity pins first, then safetensors headers only (no tensor data)."""
    from patchkit.variants.definitions import find_variant
    from patchkit.variants.preflight import preflight as run

    images = default_dir("images", "PATCHKIT_IMAGES")
    from patchkit.cli.doctor import image_series

    report_ = run(path, variant=find_variant(variant, images) if variant else None, tp=tp,
                  pin_config=pin_config, pin_index=pin_index, images_dir=images, series_of=image_series)
    if as_json:
        click.echo(report_.to_json())
    else:
        console.print(report_)
    sys.exit(0 if report_.ok else 1)


@main.command("serve-args")
@click.argument("variant")
@click.option("--checkpoint", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Local checkpoint: verified, then used to derive overrides such as the MTP ignore list.")
@click.option("--model", help="Model reference to serve (default: the variant's repo).")
@with_pins
@json_option
def serve_args_cmd(variant, checkpoint, model, pin_config, pin_index, as_json):
    """The vLLM command line (and environment) for VARIANT; overrides only from a verified checkpoint."""
    from patchkit.variants.definitions import find_variant
    from patchkit.variants.serve import serve_args

    command = serve_args(find_variant(variant, default_dir("images", "PATCHKIT_IMAGES")), checkpoint,
                         pin_config, pin_index, model)
    click.echo(command.to_json() if as_json else command.shell())
    if not command.complete:
        err_console.print(f"[yellow]incomplete: {'; '.join(command.pending)}[/]")
    sys.exit(0 if command.complete else 1)


@main.command()
@click.argument("variants", nargs=-1, required=True)
@click.option("--cpu", is_flag=True, help="CPU quantprobe smoke: tiny real-format checkpoints through stock and patched vLLM.")
@click.option("--host", "hosts", multiple=True, help="Docker-API host per node (ssh://user@spark1); head first.")
@click.option("--image", help="Image reference to boot (hardware smoke).")
@click.option("--checkpoint", type=click.Path(path_type=Path, file_okay=False), help="Checkpoint dir to verify and serve.")
@click.option("--hf-cache", default="~/.cache/huggingface", show_default=True, help="HF cache on the hosts.")
@click.option("--url", help="OpenAI endpoint to probe (default: http://HEAD:PORT).")
@click.option("--receipt", type=click.Path(path_type=Path), help="Write the JSON receipt here.")
@click.option("--keep", is_flag=True, help="Leave the containers running after the smoke.")
@click.option("--master-addr", help="Head address for the other nodes (default: the head host's name).")
@click.option("--vllm-python", help="Interpreter whose vLLM the CPU smoke uses (default: this one).")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False), help="Where CPU smoke checkpoints go.")
@click.option("--series", default=None, help="Series applied for the patched CPU run (default: each variant's image).")
@with_pins
@json_option
def smoke(variants, cpu, hosts, image, checkpoint, hf_cache, url, receipt, keep, master_addr, vllm_python, workdir,
          series, pin_config, pin_index, as_json):
    """Prove a variant loads: --cpu here (stock vs patched vLLM), or on real hosts with --host."""
    from patchkit.variants.definitions import find_variant

    images = default_dir("images", "PATCHKIT_IMAGES")
    chosen = [find_variant(v, images) for v in variants]
    if cpu == bool(hosts):
        raise PatchkitError("give either --cpu or at least one --host")
    if cpu:
        ok = _smoke_cpu(chosen, vllm_python, workdir, series, as_json)
    else:
        ok = _smoke_hosts(chosen, hosts, image, checkpoint, hf_cache, url, receipt, keep, master_addr,
                          pin_config, pin_index, as_json)
    sys.exit(0 if ok else 1)


def _smoke_cpu(variants, vllm_python, workdir, series, as_json) -> bool:
    import tempfile

    from patchkit.patching.copies import installed_package, reuse_or_copy
    from patchkit.variants.smoke.cpu import smoke_cpu

    python = vllm_python or sys.executable
    work = Path(workdir or tempfile.mkdtemp(prefix="patchkit-smoke-"))
    installed = installed_package("vllm", python)
    patches_dir = default_dir("patches", "PATCHKIT_PATCHES")
    reports = []
    for variant in variants:
        _, patches = load_series(patches_dir, series or variant.image)
        site = work / f"patched-{variant.name}"
        reuse_or_copy(installed, site, patches)
        reports += smoke_cpu([variant], work, python, python, None, "stock")
        reports += smoke_cpu([variant], work, python, python, site, "patched")
    if as_json:
        click.echo(json.dumps([json.loads(r.to_json()) for r in reports], indent=2))
    else:
        for r in reports:
            console.print(r)
    # The verdict is the patched run's; the stock run is shown for the failures the patches fix.
    return all(r.ok for r in reports if r.vllm == "patched")


def _smoke_hosts(variants, hosts, image, checkpoint, hf_cache, url, receipt, keep, master_addr, pin_config,
                 pin_index, as_json) -> bool:
    from patchkit.variants.serve import serve_args
    from patchkit.variants.smoke.hardware import DockerRunner, run_smoke

    if len(variants) != 1 or not image:
        raise PatchkitError("a hardware smoke takes one variant and --image")
    variant = variants[0]
    command = serve_args(variant, checkpoint, pin_config, pin_index, None)
    runners = [DockerRunner(h, hf_cache) for h in hosts]
    head = hosts[0].split("://")[-1].split("@")[-1].split(":")[0]
    from patchkit.cli.doctor import image_carries_quantprobe

    result = run_smoke(variant, command, image, runners, url or f"http://{head}:{variant.serve.port}",
                       keep=keep, master_addr=master_addr, quantprobe=image_carries_quantprobe(variant.image))
    if receipt:
        result.write(receipt)
    click.echo(result.to_json()) if as_json else console.print(result)
    return result.ok


@main.command()
@patches_option
@click.option("--write", is_flag=True, help="Rewrite UPSTREAM.md beside the patches folder.")
def upstream(patches_dir, write):
    """UPSTREAM.md from the patch metadata (printed, or written with --write)."""
    from patchkit.patching.upstream import render

    patches_dir = patches_dir or default_dir("patches", "PATCHKIT_PATCHES")
    text = render(load_patchset(patches_dir))
    if write:
        (patches_dir.parent / "UPSTREAM.md").write_text(text)
    else:
        click.echo(text, nl=False)


from patchkit.cli.verify import verify_command  # noqa: E402

main.add_command(verify_command)

from patchkit.cli.wheel import wheel_group  # noqa: E402

main.add_command(wheel_group)

from patchkit.cli.doctor import doctor  # noqa: E402

main.add_command(doctor)

from patchkit.cli.schemas import schemas_command  # noqa: E402

main.add_command(schemas_command)
