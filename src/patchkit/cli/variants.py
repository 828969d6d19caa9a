"""The checkpoint-variant commands: `preflight` (will this checkpoint load?), `serve-args` (the vLLM
command line for a variant) and `smoke` (prove a variant loads, on CPU or on real hosts). cli/main.py
registers them (COMMANDS); `doctor` (a recorded boot log judged offline) is in cli/doctor.py.

Exit codes: 0 the checkpoint/command/smoke is good; 1 it is not (or is incomplete); 2 bad input or usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from patchkit.cli.common import (
    SeriesChoice,
    console,
    err_console,
    images_option,
    json_option,
    load_series,
    patches_option,
)

pin_options = [
    click.option("--pin-config", metavar="SHA256", help="config.json pin for a variant without a known one."),
    click.option("--pin-index", metavar="SHA256", help="model.safetensors.index.json pin, likewise."),
]


def with_pins(f):
    for option in reversed(pin_options):
        f = option(f)
    return f


@click.command()
@click.argument("path", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--variant", help="Variant to check against (default: recognised by its pinned hashes).")
@click.option("--tp", type=int, help="Tensor-parallel size for the per-rank memory estimate (default: the recipe's).")
@with_pins
@patches_option
@images_option
@json_option
def preflight(path, variant, tp, pin_config, pin_index, patches_dir, images_dir, as_json):
    """Will this checkpoint load in its variant's image? Identity pins first, then safetensors headers only
    (no tensor data); the patches it needs against the image's series."""
    from patchkit.checkpoint.preflight import detect_variant
    from patchkit.checkpoint.preflight import preflight as run
    from patchkit.variants.definitions import find_variant

    chosen = find_variant(variant, images_dir) if variant else detect_variant(path, images_dir)
    patchset, series = load_series(patches_dir, SeriesChoice(chosen.image, images_dir))
    report_ = run(path, chosen, series=[p.id for p in series], patchset=patchset, tp=tp,
                  pin_config=pin_config, pin_index=pin_index)
    if as_json:
        click.echo(report_.to_json())
    else:
        console.print(report_)
    sys.exit(0 if report_.ok else 1)


LOAD_FORMATS = ("auto", "safetensors", "instanttensor")


def check_loader(variant, load_format: str | None, images_dir: Path, patches_dir: Path) -> None:
    """The loader served (the option's, else the variant's) must find its package in the variant's image."""
    from patchkit.images.definitions import load_image
    from patchkit.images.extras import LOAD_FORMAT_PACKAGES, check_load_format
    from patchkit.patching.patchset import load_patchset

    wanted = load_format or variant.serve.load_format
    if wanted in LOAD_FORMAT_PACKAGES:
        check_load_format(load_image(images_dir, variant.image, load_patchset(patches_dir)), wanted)


@click.command("serve-args")
@click.argument("variant")
@click.option("--checkpoint", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Local checkpoint: verified, then used to derive overrides such as the MTP ignore list.")
@click.option("--model", help="Model reference to serve (default: the variant's repo).")
@click.option("--load-format", type=click.Choice(LOAD_FORMATS), help="vLLM's weight loader instead of the "
              "variant's (off by default); instanttensor needs an image that pins it ([wheels.instanttensor]).")
@with_pins
@patches_option
@images_option
@json_option
def serve_args_cmd(variant, checkpoint, model, load_format, pin_config, pin_index, patches_dir, images_dir, as_json):
    """The vLLM command line (and environment) for VARIANT; overrides only from a verified checkpoint."""
    from patchkit.checkpoint.serve import serve_args
    from patchkit.variants.definitions import find_variant

    chosen = find_variant(variant, images_dir)
    check_loader(chosen, load_format, images_dir, patches_dir)
    command = serve_args(chosen, checkpoint, pin_config, pin_index, model, load_format)
    click.echo(command.to_json() if as_json else command.shell())
    if not command.complete:
        err_console.print(f"[yellow]incomplete: {'; '.join(command.pending)}[/]")
    sys.exit(0 if command.complete else 1)


@click.command()
@click.argument("variants", nargs=-1, required=True)
@click.option("--cpu", is_flag=True, help="CPU quantprobe smoke: tiny real-format checkpoints through stock and patched vLLM.")
@click.option("--host", "hosts", multiple=True, help="Docker-API host per node (ssh://user@spark1); head first.")
@click.option("--image", help="Image reference to boot (hardware smoke).")
@click.option("--checkpoint", type=click.Path(path_type=Path, file_okay=False), help="Checkpoint dir to verify and serve.")
@click.option("--hf-cache", default="~/.cache/huggingface", show_default=True, help="HF cache on the hosts.")
@click.option("--url", help="OpenAI endpoint to probe (default: http://HEAD:PORT).")
@click.option("--receipt", type=click.Path(path_type=Path),
              help="Write the JSON receipt here, each node's log beside it (default: a new temporary folder).")
@click.option("--keep", is_flag=True, help="Leave the containers running after the smoke.")
@click.option("--master-addr", help="Head address for the other nodes (default: the head host's name).")
@click.option("--gpus", type=click.Choice(["auto", "all", "none"]), default="auto", show_default=True,
              help="GPU request of the containers: all (--gpus all), none, or auto: all when the engine reports "
              "the nvidia runtime.")
@click.option("--boot-timeout", type=click.FloatRange(min=1), metavar="SECONDS",
              help="How long to wait for /health (default: the variant's expect.boot_timeout_s).")
@click.option("--health-interval", type=click.FloatRange(min=0.05), default=5.0, show_default=True, metavar="SECONDS",
              help="Seconds between /health polls.")
@click.option("--load-format", type=click.Choice(LOAD_FORMATS), help="Hardware smoke: vLLM's weight loader "
              "instead of the variant's (as serve-args takes it); instanttensor needs an image that pins it.")
@click.option("--vllm-python", help="Interpreter whose vLLM the CPU smoke uses (default: this one).")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False), help="Where CPU smoke checkpoints go.")
@click.option("--series", default=None, help="Series applied for the patched CPU run (default: each variant's image).")
@with_pins
@patches_option
@images_option
@json_option
def smoke(variants, cpu, hosts, image, checkpoint, hf_cache, url, receipt, keep, master_addr, gpus, boot_timeout,
          health_interval, load_format, vllm_python, workdir, series, pin_config, pin_index, patches_dir, images_dir,
          as_json):
    """Prove a variant loads: --cpu here (stock vs patched vLLM), or on real hosts with --host."""
    from patchkit.variants.definitions import find_variant

    chosen = [find_variant(v, images_dir) for v in variants]
    if cpu == bool(hosts):
        raise click.UsageError("give either --cpu or at least one --host")
    if cpu and load_format:
        raise click.UsageError("--load-format goes with --host (the CPU smoke loads no weights from disk)")
    if cpu:
        ok = _smoke_cpu(chosen, vllm_python, workdir, series, patches_dir, images_dir, as_json)
    else:
        ok = _smoke_hosts(chosen, hosts, image, checkpoint, hf_cache, url, receipt, keep, master_addr,
                          pin_config, pin_index, patches_dir, images_dir, as_json, gpus=gpus,
                          boot_timeout=boot_timeout, health_interval=health_interval, load_format=load_format)
    sys.exit(0 if ok else 1)


def _smoke_cpu(variants, vllm_python, workdir, series, patches_dir, images_dir, as_json) -> bool:
    import tempfile

    from patchkit.patching.copies import installed_package, reuse_or_copy
    from patchkit.smoke.cpu import smoke_cpu

    python = vllm_python or sys.executable
    work = Path(workdir or tempfile.mkdtemp(prefix="patchkit-smoke-"))
    installed = installed_package("vllm", python)
    reports = []
    for variant in variants:
        _, patches = load_series(patches_dir, SeriesChoice(series or variant.image, images_dir))
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
                 pin_index, patches_dir, images_dir, as_json, gpus="auto", boot_timeout=None,
                 health_interval=5.0, load_format=None) -> bool:
    from patchkit.checkpoint.serve import serve_args
    from patchkit.images.definitions import load_image
    from patchkit.smoke.containers import DockerRunner, host_name
    from patchkit.smoke.hardware import run_smoke, switches_of

    if len(variants) != 1 or not image:
        raise click.UsageError("a hardware smoke takes one variant and --image")
    variant = variants[0]
    check_loader(variant, load_format, images_dir, patches_dir)
    command = serve_args(variant, checkpoint, pin_config, pin_index, None, load_format)
    patchset, series = load_series(patches_dir, SeriesChoice(variant.image, images_dir))  # what its patches ask
    extras = load_image(images_dir, variant.image, patchset).wheels  # what its weight-load advice may name
    runners = [DockerRunner(h, hf_cache, gpus=gpus) for h in hosts]
    result = run_smoke(variant, command, image, runners, url or f"http://{host_name(hosts[0])}:{variant.serve.port}",
                       keep=keep, master_addr=master_addr, switches=switches_of(series),
                       boot_timeout_s=boot_timeout, health_interval_s=health_interval, extras=extras)
    if not receipt:  # the containers are gone: their logs are the evidence, so they are always kept
        import tempfile

        receipt = Path(tempfile.mkdtemp(prefix=f"patchkit-smoke-{variant.name}-")) / "receipt.json"
    result.write(receipt)
    err_console.print(f"receipt: {receipt}; node logs: {', '.join(str(p) for p in result.log_paths(receipt))}",
                      markup=False, highlight=False, soft_wrap=True)
    click.echo(result.to_json()) if as_json else console.print(result)
    return result.ok


COMMANDS = (preflight, serve_args_cmd, smoke)
