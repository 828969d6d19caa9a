"""`patchkit doctor LOG [--variant V] [--json]`: judge a recorded boot log offline; `patchkit doctor --host
[ssh://HOST]`: check a Spark's prerequisites before the first serve (spark/checks.py); `patchkit doctor
--serving URL`: what a client of a running server sees (the smoke's serving probes, smoke/serving.py).

The same judgement the live smoke makes (patchkit.bootlog.judge): the fatal cause with the line that
showed it and its fix, the weight and KV markers in every format the base and the releases print, the
speculator that attached and its acceptance, and, with --variant, the variant's expectations.
A recorded log is all there is, so one that ends without 'Application startup complete' is a boot that
did not come up: with no error line it was killed from outside (cause `ended-without-error`, with the
phase it reached); --cut-short judges a log captured while the boot was still running.
Exit 0 when the log shows a good boot (every host check passes), 1 when it does not (one fails), 2 on
bad input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import click

from patchkit.cli.common import console, images_option, json_option, patches_option
from patchkit.errors import PatchkitError

LEVEL_COLOUR = {"fail": "red", "warn": "yellow", "ok": "green"}  # a finding's level, as every table shows it


def _read(log: str) -> Iterator[tuple[str, bool]]:
    """The log's lines, streamed (never read whole): a regular file within the boot-log limit, or stdin;
    each line cut at the log-line limit (patchkit.untrusted.lines). Opening fails here, before judging."""
    from patchkit.untrusted import lines, open_regular

    if log == "-":
        if sys.stdin is None:  # started with its standard input closed
            raise PatchkitError("cannot read the log on stdin: standard input is closed")
        return lines(sys.stdin.buffer, "the log on stdin")
    what = f"cannot read the log {log}"
    stream = open_regular(log, "boot-log", what)

    def streamed() -> Iterator[tuple[str, bool]]:
        with stream:
            try:
                yield from lines(stream, f"the log {log}")
            except OSError as exc:
                raise PatchkitError(f"{what}: {exc.strerror or exc}") from None

    return streamed()


def _render(verdict, variant_name: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = f"doctor{f' ({variant_name})' if variant_name else ''}: {'GOOD BOOT' if verdict.ok else 'FAILED BOOT'}"
    table = Table(title=title, title_justify="left")
    for col in ("level", "what", "detail"):
        table.add_column(col)
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
        table = Table(title=f"doctor --host {report.host}: {'READY' if report.ok else 'NOT READY'}", title_justify="left")
        for col in ("level", "check", "found", "fix"):
            table.add_column(col)
        for c in report.checks:
            table.add_row(f"[{LEVEL_COLOUR[c.level]}]{c.level}[/]", c.name, escape(c.found), escape(c.fix))
        console.print(table)


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
        raise PatchkitError(f"--serving {url!r}: give the server's base URL, http(s)://HOST[:PORT] (no path)")
    if model is None:
        if not variant:
            raise PatchkitError("--serving needs the served model name: give --model NAME or --variant V")
        model = find_variant(variant, images_dir).serve.served_model_name
    probes = serving_probes(url.rstrip("/"), model)
    ok = all(p["ok"] for p in probes.values())
    if as_json:
        click.echo(json.dumps({"serving": url, "model": model, "ok": ok, "probes": probes}, indent=2))
        sys.exit(0 if ok else 1)
    table = Table(title=f"doctor --serving {url} ({model}): {'SPLITS RIGHT' if ok else 'MIS-SPLITS'}",
                  title_justify="left")
    for col in ("probe", "level", "what", "detail"):
        table.add_column(col)
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
    runners = [commands_for(h) for h in hosts]  # every --host parsed before any command runs
    reports = [check_host(r, chosen, image, checkpoint, kv_cache_dtype, vllm) for r in runners]
    ok = all(r.ok for r in reports)
    if as_json:
        click.echo(json.dumps({"ok": ok, "variant": chosen.name if chosen else None,
                               "hosts": [r.to_dict() for r in reports]}, indent=2))
    else:
        _render_hosts(reports)
    sys.exit(0 if ok else 1)


@click.command("doctor")
@click.argument("log", required=False)
@click.option("--host", "hosts", multiple=True, is_flag=False, flag_value="local", metavar="[ssh://HOST]",
              help="Check a host's prerequisites for the first serve instead of judging a log: this machine "
              "(--host alone, or `local`) or ssh://[USER@]HOST[:PORT]; repeat for every node.")
@click.option("--serving", metavar="URL", help="Probe a running server (http://HOST:PORT) instead of judging a log: "
              "the reasoning split, tool calls and U+FFFD a client sees (the smoke's serving probes).")
@click.option("--model", help="With --serving: the served model name (default: the --variant's).")
@click.option("--image", help="With --host: check nvcc and the arch variables in this image (docker run on the host).")
@click.option("--checkpoint", help="With --host: the checkpoint's path, which must hold its files on every host.")
@click.option("--kv-cache-dtype", help="With --host: the KV-cache dtype to check (default: the variant's).")
@click.option("--vllm", "vllm_version", metavar="VERSION", help="With --host: the vLLM release to be served (default: "
              "unknown, held to 0.34.0's rules: DeepGEMM's nvcc, resolved as vLLM does, at 12.9 or newer).")
@click.option("--variant", help="Judge against this variant's expectations (quantprobe, speculator, KV pool, weights); "
              "with --host, hold the hosts to its per-rank memory need and KV-cache dtype.")
@click.option("--quantprobe/--no-quantprobe", default=None,
              help="The boot ran with PATCHKIT_QUANTPROBE=1 on an image carrying the quantprobe patch (its lines "
              "are then required) / did not (default: unknown; lines are judged when present).")
@click.option("--booted/--cut-short", default=True, show_default=True,
              help="--cut-short judges a log that ends before startup on purpose, e.g. captured mid-boot (no "
              "startup/KV failures, no end-of-log cause); by default such a log is a boot that did not come up.")
@patches_option
@images_option
@json_option
def doctor(log, hosts, serving, model, image, checkpoint, kv_cache_dtype, vllm_version, variant, quantprobe, booted,
           patches_dir, images_dir, as_json):
    """Why did this boot fail (or did it)? Judge a recorded vLLM boot log (LOG, or - for stdin); or, with
    --host, is this Spark ready for its first serve; or, with --serving, does a running server split
    reasoning and tool calls right?"""
    if serving:
        if log is not None or hosts:
            raise PatchkitError("give one of LOG, --host or --serving")
        return _doctor_serving(serving, model, variant, images_dir, as_json)
    if model:
        raise PatchkitError("--model goes with --serving")
    if hosts:
        if log is not None:
            raise PatchkitError(f"give a LOG or --host, not both (LOG {log!r})")
        return _doctor_hosts(hosts, variant, image, checkpoint, kv_cache_dtype, vllm_version, images_dir, as_json)
    if log is None:
        raise PatchkitError("give a LOG to judge (or - for stdin), or --host to check a host")
    if image or checkpoint or kv_cache_dtype or vllm_version:
        raise PatchkitError("--image, --checkpoint, --kv-cache-dtype and --vllm go with --host")
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
