"""The `patchkit` command line: the `main` group and the commands it registers, one module per group.

Each command parses its arguments, calls the library and renders a rich table or --json:
cli/patching.py (list, check, diff, apply, revert, status), cli/upstream.py (rebase, record, upstream,
retire, bump), cli/build.py (build, mirrors), cli/variants.py (preflight, serve-args, smoke), cli/image_proof.py
(smoke-image), cli/doctor.py,
cli/verify.py (the matrix), cli/census.py (the kernel census), cli/wheel.py, cli/schemas.py.

Exit codes: 0 success; 1 a patch does not apply or is broken (or, for verify, a regression);
2 bad input or usage (malformed files, unknown names, unreachable sources). PatchkitGroup (cli/common.py)
maps every failure to its code and a message, never a traceback.
"""

from __future__ import annotations

import click

from patchkit.cli import build, image_proof, patching, upstream, variants
from patchkit.cli.census import census_command
from patchkit.cli.common import PatchkitGroup
from patchkit.cli.doctor import doctor
from patchkit.cli.options import cache_dir_option
from patchkit.cli.schemas import schemas_command
from patchkit.cli.verify import verify_command
from patchkit.cli.wheel import wheel_group

__all__ = ["PatchkitGroup", "main"]


@click.group(cls=PatchkitGroup)
@click.version_option(package_name="patchkit")
@cache_dir_option
def main() -> None:
    """Anchor-asserted, fail-closed vLLM patches for GLM-5.3-Flash on DGX Spark."""


for command in (*patching.COMMANDS, *upstream.COMMANDS, *build.COMMANDS, *variants.COMMANDS, *image_proof.COMMANDS,
                verify_command, census_command, wheel_group, doctor, schemas_command):
    main.add_command(command)
