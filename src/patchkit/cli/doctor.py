"""`patchkit doctor`, one subcommand per question, each with only its own options:

- `patchkit doctor log LOG [--variant V] [--json]`: judge a recorded boot log offline (LOG, or - for stdin);
- `patchkit doctor host [HOST]...`: check a Spark's prerequisites before the first serve (spark/checks.py):
  this machine (no HOST, or `local`) or ssh://[USER@]HOST[:PORT], every node named;
- `patchkit doctor serving URL`: what a client of a running server sees (the smoke's serving probes,
  smoke/serving.py).

`log` makes the same judgement the live smoke makes (patchkit.bootlog.judge): the fatal cause with the
line that showed it and its fix, the weight and KV markers in every format the base and the releases
print, the speculator that attached and its acceptance, and, with --variant, the variant's expectations.
A recorded log is all there is, so one that ends without 'Application startup complete' is a boot that
did not come up: with no error line it was killed from outside (cause `ended-without-error`, with the
phase it reached); --cut-short judges a log captured while the boot was still running.
Exit 0 when the log shows a good boot (every host check passes, every probe splits right), 1 when it does
not, 2 on bad input.

The spellings before the subcommands (`doctor LOG`, `doctor --host [HOST]`, `doctor --serving URL`) are
in scripts and notes; DoctorGroup still runs them, as the subcommand they mean, after saying on stderr
which command to write instead (a log file named like a subcommand needs `doctor log NAME`).
Every column that holds a fix, a finding or a path folds: what a user copies is never cut short.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator

import click

from patchkit.cli.common import console, err_console, images_option, json_option, patches_option
from patchkit.errors import PatchkitError

LEVEL_COLOUR = {"fail": "red", "warn": "yellow", "ok": "green"}  # a finding's level, as every table shows it


def _read(log: str) -> Iterator[tuple[str, bool]]:
    """The log's lines, streamed (never read whole): a regular file within the boot-log limit, or stdin;
    each line cut at the log-line limit (patchkit.untrusted.lines). Opening fails here, before judging."""
    from patchkit.untrusted import UnreadableFile, lines, open_regular

    if log == "-":
        if sys.stdin is None:  # started with its standard input closed
            raise UnreadableFile("the log on stdin", "standard input is closed")
        return lines(sys.stdin.buffer, "the log on stdin")
    what = f"cannot read the log {log}"
    stream = open_regular(log, "boot-log", what)

    def streamed() -> Iterator[tuple[str, bool]]:
        with stream:
            try:
                yield from lines(stream, f"the log {log}")
            except OSError as exc:
                raise UnreadableFile(f"the log {log}", exc.strerror or str(exc), exc.errno) from None

    return streamed()


def _render(verdict, variant_name: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = f"doctor{f' ({variant_name})' if variant_name else ''}: {'GOOD BOOT' if verdict.ok else 'FAILED BOOT'}"
    table = Table(title=title, title_justify="left")
    for col in ("level", "what", "detail"):
        table.add_column(col, overflow="fold")
    for f in verdict.findings:
        table.add_row(f"[{LEVEL_COLOUR[f.level]}]{f.level}[/]", f.what, escape(f.detail))
    console.print(table)
    if verdict.cause:
        c = verdict.cause
        console.print(f"[bold]cause[/]: {c.cause}: {escape(c.what)}\n[bold]line {c.line_no}[/]: {escape(c.line)}\n"
                      f"[bold]fix[/]: {escape(c.fix)}")
        if c.retry_after_s:
            console.print(f"transient: retry once after ~{c.retry_after_s:.0f} s")
    for other in verdict.causes[1:]:
        console.print(f"[dim]also seen: {other.cause} (line {other.line_no})[/]")


def _render_hosts(reports) -> None:
    from rich.markup import escape
    from rich.table import Table

    for report in reports:
        table = Table(title=f"doctor host {report.host}: {'READY' if report.ok else 'NOT READY'}", title_justify="left")
        for col in ("level", "check", "found", "fix"):
            table.add_column(col, overflow="fold")  # a fix is a command to copy whole
        for c in report.checks:
            table.add_row(f"[{LEVEL_COLOUR[c.level]}]{c.level}[/]", c.name, escape(c.found), escape(c.fix))
        console.print(table)


class NotAServerUrl(PatchkitError):
    """`doctor serving` was given `url`, which is not a server's base URL http(s)://HOST[:PORT] (exit 2)."""

    def __init__(self, url: str):
        self.url = url
        super().__init__(f"doctor serving {url!r}: give the server's base URL, http(s)://HOST[:PORT] (no path)")


def _doctor_serving(url: str, model: str | None, variant, images_dir, as_json) -> None:
    """The smoke's serving probes against a running server: the reasoning split, tool-call arguments and
    U+FFFD as a client reads them; each answer read bounded (smoke/api.py)."""
    from urllib.parse import urlsplit

    from rich.markup import escape
    from rich.table import Table

    from patchkit.smoke.api import serving_probes
    from patchkit.variants.definitions import find_variant

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise NotAServerUrl(url)
    if model is None:
        if not variant:
            raise click.UsageError("doctor serving needs the served model name: give --model NAME or --variant V")
        model = find_variant(variant, images_dir).serve.served_model_name
    probes = serving_probes(url.rstrip("/"), model)
    ok = all(p["ok"] for p in probes.values())
    if as_json:
        click.echo(json.dumps({"serving": url, "model": model, "ok": ok, "probes": probes}, indent=2))
        sys.exit(0 if ok else 1)
    table = Table(title=f"doctor serving {url} ({model}): {'SPLITS RIGHT' if ok else 'MIS-SPLITS'}",
                  title_justify="left")
    for col in ("probe", "level", "what", "detail"):
        table.add_column(col, overflow="fold")
    for name, probe in probes.items():
        for f in probe.get("findings") or [{"level": "fail", "what": "no answer", "detail": probe.get("error", "")}]:
            table.add_row(name, f"[{LEVEL_COLOUR[f['level']]}]{f['level']}[/]", f["what"], escape(f["detail"]))
    console.print(table)
    sys.exit(0 if ok else 1)


def _doctor_hosts(hosts, variant, image, checkpoint, kv_cache_dtype, vllm, images_dir, as_json) -> None:
    from patchkit.spark.checks import check_host
    from patchkit.spark.commands import commands_for
    from patchkit.variants.definitions import find_variant

    chosen = find_variant(variant, images_dir) if variant else None
    runners = [commands_for(h) for h in hosts or ("local",)]  # every HOST parsed before any command runs
    reports = [check_host(r, chosen, image, checkpoint, kv_cache_dtype, vllm) for r in runners]
    ok = all(r.ok for r in reports)
    if as_json:
        click.echo(json.dumps({"ok": ok, "variant": chosen.name if chosen else None,
                               "hosts": [r.to_dict() for r in reports]}, indent=2))
    else:
        _render_hosts(reports)
    sys.exit(0 if ok else 1)


class DoctorGroup(click.Group):
    """The doctor's subcommands, and the spellings from before them: arguments that do not start with a
    subcommand's name are the old single command's, run as the subcommand they mean (`--serving URL`:
    serving URL; `--host [HOST]`, repeated: host HOST...; anything else: log) once stderr has said what
    to write instead. Options mixed from two modes are then refused by that subcommand (exit 2), as the
    single command refused them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            new = _new_spelling(args)
            err_console.print(f"patchkit doctor: this spelling is deprecated; use `patchkit doctor {shlex.join(new)}` "
                              "(running that now)", markup=False, highlight=False, soft_wrap=True)
            args = new
        return super().parse_args(ctx, args)


def _new_spelling(args: list[str]) -> list[str]:
    """The old `patchkit doctor` arguments as the subcommand's: `--serving URL` becomes `serving URL` and
    each `--host [VALUE]` a HOST of `host` (a bare --host, as before, this machine: `local`)."""
    options = args[:args.index("--")] if "--" in args else args

    def given(flag: str) -> bool:
        return any(a == flag or a.startswith(f"{flag}=") for a in options)

    flag = "--serving" if given("--serving") else "--host" if given("--host") else None
    if flag is None:
        return ["log", *args]
    values, rest, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(f"{flag}="):
            values.append(arg.partition("=")[2])
        elif arg == flag:
            takes = i + 1 < len(args) and not args[i + 1].startswith("-")
            if takes:
                i += 1
            values.append(args[i] if takes else "local")
        else:
            rest.append(arg)
        i += 1
    return [flag.lstrip("-"), *values, *rest]


@click.group("doctor", cls=DoctorGroup)
def doctor() -> None:
    """Why did this boot fail (or did it)? `doctor log LOG`; is this Spark ready for its first serve?
    `doctor host`; does a running server split reasoning and tool calls right? `doctor serving URL`."""


_variant_help = "Judge against this variant's expectations (quantprobe, speculator, KV pool, weights)."


@doctor.command("log")
@click.argument("log")
@click.option("--variant", help=_variant_help)
@click.option("--quantprobe/--no-quantprobe", default=None,
              help="The boot ran with PATCHKIT_QUANTPROBE=1 on an image carrying the quantprobe patch (its lines "
              "are then required) / did not (default: unknown; lines are judged when present).")
@click.option("--booted/--cut-short", default=True, show_default=True,
              help="--cut-short judges a log that ends before startup on purpose, e.g. captured mid-boot (no "
              "startup/KV failures, no end-of-log cause); by default such a log is a boot that did not come up.")
@patches_option
@images_option
@json_option
def doctor_log(log, variant, quantprobe, booted, patches_dir, images_dir, as_json):
    """Judge a recorded vLLM boot log (LOG, or - for stdin): the fatal cause with its line and fix, the
    speculator and its acceptance."""
    from patchkit.bootlog.judge import judge_log
    from patchkit.variants.definitions import find_variant

    # Unknown by default: every image carries the patch, but only the live smoke knows the switch was on.
    chosen = find_variant(variant, images_dir) if variant else None
    extras = None  # what the variant's image carries decides the advice on a slow weight load
    if chosen is not None:
        from patchkit.images.definitions import load_image
        from patchkit.patching.patchset import load_patchset

        extras = set(load_image(images_dir, chosen.image, load_patchset(patches_dir)).wheels)
    verdict = judge_log(_read(log), chosen, quantprobe, booted=booted, extras=extras)
    if as_json:
        click.echo(json.dumps({"log": log, "variant": chosen.name if chosen else None, **verdict.to_dict()}, indent=2))
    else:
        _render(verdict, chosen.name if chosen else None)
    sys.exit(0 if verdict.ok else 1)


@doctor.command("host")
@click.argument("hosts", nargs=-1, metavar="[HOST]...")
@click.option("--variant", help="Hold the hosts to this variant's per-rank memory need and KV-cache dtype.")
@click.option("--image", help="Check nvcc and the arch variables in this image (docker run on the host).")
@click.option("--checkpoint", help="The checkpoint's path, which must hold its files on every host.")
@click.option("--kv-cache-dtype", help="The KV-cache dtype to check (default: the variant's).")
@click.option("--vllm", "vllm_version", metavar="VERSION", help="The vLLM release to be served (default: unknown, "
              "held to 0.34.0's rules: DeepGEMM's nvcc, resolved as vLLM does, at 12.9 or newer).")
@images_option
@json_option
def doctor_host(hosts, variant, image, checkpoint, kv_cache_dtype, vllm_version, images_dir, as_json):
    """Is each HOST ready for its first serve: this machine (no HOST, or `local`) or
    ssh://[USER@]HOST[:PORT]; name every node. Each check comes with its fix."""
    _doctor_hosts(hosts, variant, image, checkpoint, kv_cache_dtype, vllm_version, images_dir, as_json)


@doctor.command("serving")
@click.argument("url")
@click.option("--model", help="The served model name (default: the --variant's).")
@click.option("--variant", help="The variant whose served model name to ask for.")
@images_option
@json_option
def doctor_serving(url, model, variant, images_dir, as_json):
    """Probe a running server (URL: http(s)://HOST[:PORT]): the reasoning split, tool calls and U+FFFD a
    client sees (the smoke's serving probes)."""
    _doctor_serving(url, model, variant, images_dir, as_json)
