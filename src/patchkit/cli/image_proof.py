"""`patchkit smoke-image`: the in-image proof of a built linux/arm64 image (smoke.image_proof)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from patchkit.cli.common import console, err_console, images_option, json_option, patches_option


@click.command("smoke-image")
@click.argument("image", metavar="LAYOUT[:REF]")
@click.argument("variants", nargs=-1)
@click.option("--modelopt-python", help="Interpreter with ModelOpt that packs the tiny checkpoints "
              "(default: $PATCHKIT_MODELOPT_PYTHON, else this one).")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False),
              help="Where checkpoints and the assembled root filesystem go (default: a new temporary folder).")
@click.option("--receipt", type=click.Path(path_type=Path, dir_okay=False), help="Write the JSON receipt here.")
@click.option("--timeout", type=click.IntRange(min=1), default=3600, show_default=True, metavar="SECONDS",
              help="Limit for the run inside the image.")
@patches_option
@images_option
@json_option
def smoke_image(image, variants, modelopt_python, workdir, receipt, timeout, patches_dir, images_dir, as_json):
    """Run a built image's own files: its patched vLLM imports, its files are the series', its extra
    wheels import, and each VARIANT's CPU load smoke passes through the image's own torch and vLLM
    (under qemu-user off arm64). No VARIANT: every variant the image's dev.patchkit.image label serves.
    Exit 0 proved, 1 not proved, 2 the image cannot be read or run."""
    from patchkit.smoke.image_proof import prove_image, write_receipt
    from patchkit.variants.definitions import find_variant

    chosen = [find_variant(v, images_dir) for v in variants]
    python = modelopt_python or os.environ.get("PATCHKIT_MODELOPT_PYTHON") or sys.executable
    work = Path(workdir or tempfile.mkdtemp(prefix="patchkit-smoke-image-"))
    proof = prove_image(image, chosen, images_dir=images_dir, patches_dir=patches_dir, workdir=work,
                        modelopt_python=python, timeout=timeout)
    if receipt:
        write_receipt(proof, receipt)
        err_console.print(f"receipt: {receipt}", markup=False, highlight=False)
    click.echo(json.dumps(proof.to_dict(), indent=2)) if as_json else console.print(proof)
    sys.exit(0 if proof.ok else 1)


COMMANDS = (smoke_image,)
