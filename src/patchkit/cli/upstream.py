"""Following upstream: `rebase` (the patch set onto a new release, with evidence), `record` (a hand-edited
tree's difference as a patch's edits), `upstream` (UPSTREAM.md, and the state of each patch's tracked
upstream PRs and issues from GitHub's API), `retire` (which patches a release no longer needs, measured)
and `bump` (the pull request of a release bump: the new releases, its body). cli/main.py registers COMMANDS.

Exit codes: rebase 0 every patch that needed a change passed its checks (placed, applies on the new
release, behaviour tests passed or --no-tests) and, with --write, was written; 4 some edit needs a person
(named, with the reason and the closest candidates; that patch keeps its range and files) and every other
patch passed (and was written); 1 a check failed (a rebased patch does not apply, its tests failed or its
environment is missing: that patch is not written); 2 bad input. record 0 recorded and proven (applied onto ORIGINAL it gives EDITED byte for byte); 1 it
cannot be recorded as anchored edits; 2 bad input. Nothing is written without --write. upstream, retire
and bump: 0 shown (a retirement proposal is information, not a failure); 2 bad input, a GitHub answer or a
record of the wrong shape, gh failing. `bump body` is the exception for records: a record missing,
failed or of the wrong shape is a line of the body (exit 0); only its own arguments are bad input.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from patchkit import CHECKOUT, PINNED_VLLM
from patchkit.cli.common import assume_option, console, emit, json_option, parse_assumed, patches_option
from patchkit.cli.options import one_release
from patchkit.localfiles import atomic_write


def _open(spec: str):
    from patchkit.sources import open_source

    return open_source(spec)


@click.command(epilog="Exit status: 0 every patch that needed a change passed its checks (and was written, with "
               "--write); 4 some edit needs a person (listed with its closest candidates; that patch keeps its range "
               "and files) and every other patch passed (and was written); 1 a check failed (a rebased patch does "
               "not apply, its behaviour tests failed, or could not run without --no-tests; that patch is not "
               "written); 2 bad input (3 stays patchkit's internal error). A patch is \"rebased\" only once its behaviour tests passed on the new "
               "release; with --no-tests it is \"re-anchored, untested\".")
@click.option("--to", "to", required=True, metavar="SRC", help="The new release (0.34.0, flashinfer-python==0.7.4, a directory).")
@click.option("--from", "from_", default=PINNED_VLLM, show_default=True, metavar="SRC",
              help="The release the edits hold on (the old file of the three-way merge).")
@click.option("--patch", "patch_ids", multiple=True, metavar="ID", help="Only these patches (repeatable).")
@click.option("--write", is_flag=True,
              help="Write each patch whose checks passed (its patch.toml and text files, atomically); a patch with "
                   "an edit that needs a person, or a failed check, is left as it is.")
@click.option("--no-tests", is_flag=True,
              help="Do not run the behaviour tests (said in the result); without it a missing environment is exit 1.")
@patches_option
@json_option
def rebase(to, from_, patch_ids, write, no_tests, patches_dir, as_json):
    """Propose the new form of every edit broken, out of range or orphaned on a new release, check it, and
    (with --write) write each patch whose checks passed."""
    from patchkit.cache_root import default_cache_root  # --cache-dir / PATCHKIT_CACHE_DIR, as nox's
    from patchkit.patching import rebase as rb
    from patchkit.patching.patchset import load_patchset

    patchset = load_patchset(patches_dir)
    patches = [patchset.patch(i) for i in patch_ids] if patch_ids else patchset.series()
    old, new = _open(from_), _open(to)
    result = rb.rebase(patches, old, new)
    with tempfile.TemporaryDirectory(prefix="patchkit-rebase-") as tmp:
        rebased = Path(tmp) / "patches"
        plan = rb.check(result, patches_dir, new, rebased)
        rb.run_tests(result, rebased, new.versions().get("vllm"), run=not no_tests, cache=default_cache_root(),
                     tests_dir=CHECKOUT / "tests")
    if write:
        rb.write(result, patches_dir)
    if as_json:
        emit(True, rb.payload(result, plan, write=write))
    else:
        for line in rb.lines(result, plan, write=write):
            console.print(line, markup=False, highlight=False)
    sys.exit(result.exit_code)


@click.command()
@click.option("--patch", "patch_id", required=True, metavar="ID", help="The patch whose edits to record.")
@click.option("--from", "original", required=True, type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="The stock tree.")
@click.option("--to", "edited", required=True, type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="The same tree, edited by hand.")
@click.option("--write", is_flag=True, help="Write the recorded edits into patches/ID/patch.toml.")
@assume_option
@patches_option
@json_option
def record(patch_id, original, edited, write, assumed, patches_dir, as_json):
    """Record EDITED's difference from ORIGINAL as the patch's edits (shortest unique anchors), proven."""
    from patchkit.patching import record as rec
    from patchkit.patching.patchset import load_patchset

    if original.resolve() == edited.resolve():
        raise click.UsageError(f"--from and --to are the same directory ({original})")
    patch = load_patchset(patches_dir).patch(patch_id)
    recording = rec.record(patch, original, edited, versions=parse_assumed(assumed))
    if write:
        rec.write_recording(patch, recording)
    payload = recording.record(written=write)
    if as_json:
        emit(True, payload.to_dict())
    else:
        for e in payload.edits:
            console.print(f"{e.action} on {e.package}/{e.file}: anchor {e.anchor_lines} line(s), "
                          f"text {e.text_lines} line(s)" + (f" in {e.text_file}" if e.text_file else ""),
                          markup=False, highlight=False)
        console.print(f"{len(payload.edits)} edit(s); applied onto {original} they give {edited} byte for byte; "
                      + ("written" if write else "nothing written (use --write)"), markup=False, highlight=False)




@click.command("upstream")
@click.option("--write", is_flag=True, help="Rewrite UPSTREAM.md beside the patches folder from the patch metadata (no API call).")
@click.option("--answers", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Recorded GitHub REST API answers (DIR/repos/OWNER/NAME/pulls/N.json) instead of `gh api`.")
@click.option("--record", "record_to", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="With gh: keep each answer under DIR as well, to replay with --answers.")
@click.option("--gh", default="gh", show_default=True, help="GitHub's CLI (authenticated by GH_TOKEN in a workflow).")
@click.option("--patch", "patch_ids", multiple=True, metavar="ID", help="Only these patches (repeatable).")
@patches_option
@json_option
def upstream(write, answers, record_to, gh, patch_ids, patches_dir, as_json):
    """Each patch's tracked upstream PRs and issues with their state (open, closed, merged, and the release
    a merge shipped in where known), read from GitHub's API; or, with --write, UPSTREAM.md."""
    from patchkit.patching.patchset import load_patchset
    from patchkit.upstream import upstream_state as us
    from patchkit.upstream.upstream_md import render

    patchset = load_patchset(patches_dir)
    if write:
        atomic_write(patches_dir.parent / "UPSTREAM.md", render(patchset).encode())
        console.print(f"wrote {patches_dir.parent / 'UPSTREAM.md'}", markup=False, highlight=False)
        return
    if answers and record_to:
        raise click.UsageError("--record keeps live answers; it does not go with --answers")
    source = us.RecordedAnswers(answers) if answers else us.GhAnswers(gh, record_to)
    patches = [patchset.patch(i) for i in patch_ids] if patch_ids else patchset.series()
    states = us.tracked_states(patches, source)
    if as_json:
        emit(True, us.UpstreamRecord.of(states).to_dict())
        return
    from rich.table import Table

    table = Table(title="tracked upstream changes (GitHub's answers)", title_justify="left")
    for col in ("patch", "tracked", "title", "state", "released in"):
        table.add_column(col, overflow="fold")  # a patch id or repo#number is copied whole
    for s in states:  # what each would fix: patch.toml, UPSTREAM.md, --json
        released = f"{s.released_in} ({s.released_from})" if s.released_in else "-"
        table.add_row(s.patch_id, f"{s.tracked.repo}#{s.tracked.number} {s.tracked.kind}", s.title, s.words, released)
    console.print(table)
    untracked = [p.id for p in patches if not p.tracked]
    if untracked:
        console.print("no upstream change tracked: " + ", ".join(untracked), markup=False, highlight=False)


@click.command("retire")
@click.option("--release", required=True, metavar="VERSION", help="The vLLM release to measure the patches on.")
@click.option("--source", "sources", multiple=True, metavar="SRC",
              help="That release's sources for the [upstreamed] probes (default: vllm==VERSION from the index; repeatable).")
@click.option("--results", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="The test runs' records (default: ~/.cache/patchkit/results, where nox writes them).")
@patches_option
@json_option
def retire(release, sources, results, patches_dir, as_json):
    """Which patches RELEASE no longer needs: a fired [upstreamed] probe, or behaviour tests that pass without
    the patch (`nox -s patch-necessity`); each proposal names its evidence. A patch whose range excludes
    RELEASE is measured all the same (its probe, its records, its anchors planned there): what retire would
    propose once it is rebased."""
    from patchkit.cache_root import default_cache_root
    from patchkit.patching.patchset import load_patchset
    from patchkit.sources import combine_sources
    from patchkit.upstream.retire import RetireRecord, verdicts

    release = one_release(release, "--release")
    opened = [_open(s) for s in (sources or (f"vllm=={release}",))]
    source = opened[0] if len(opened) == 1 else combine_sources(opened)
    found = source.versions().get("vllm")
    if found != release:
        raise click.UsageError(f"--source is vLLM {found or '(none)'}, not the release {release} being measured")
    results = results or default_cache_root() / "results"
    found_verdicts = verdicts(load_patchset(patches_dir).series(), release, source, results)
    if as_json:
        emit(True, RetireRecord(release, str(results), found_verdicts).to_dict())
        return
    for v in found_verdicts:
        console.print(f"{v.patch_id}: {v.verdict}" + ("" if v.in_range else f" (proposed: {release} is outside its range)"),
                      markup=False, highlight=False)
        for e in v.evidence:
            console.print(f"  {e.kind}: {e.text}" + (f" ({e.where})" if e.where else ""), markup=False, highlight=False)


@click.group("bump")
def bump() -> None:
    """The pull request that bumps the patch set to a new vLLM release (the daily workflow opens it)."""


@bump.command("releases")
@click.option("--newer-than", default=PINNED_VLLM, show_default=True, metavar="VERSION")
def bump_releases(newer_than):
    """The final releases on the package index newer than VERSION, as a JSON list (the workflow's matrix)."""
    from packaging.specifiers import SpecifierSet

    from patchkit.sources.index import discover_releases

    found = discover_releases("vllm", SpecifierSet(f">{one_release(newer_than, '--newer-than')}"))
    click.echo(json.dumps([str(v) for v in found]))


def _file(name: str, help_text: str):
    # not `exists=True`: a record its step did not write is a line of the body, not a usage error
    return click.option(name, type=click.Path(path_type=Path), default=None, help=help_text)


@bump.command("body")
@click.option("--release", required=True, metavar="VERSION")
@click.option("--rebase", "rebase_json", type=click.Path(path_type=Path), required=True,
              help="`patchkit rebase --to VERSION --json`'s output.")
@click.option("--results", type=click.Path(path_type=Path), default=None,
              help="The test runs' records: vllm-VERSION.json and necessity/vllm-VERSION-*.json.")
@_file("--retire", "`patchkit retire --release VERSION --json`'s output.")
@_file("--verify", "`patchkit verify --versions VERSION --json`'s output.")
@_file("--kernels", "`patchkit census --release VERSION --json`'s output.")
@_file("--upstream", "`patchkit upstream --json`'s output.")
@_file("--upstream-diff", "The diff of UPSTREAM.md the bump makes (empty: unchanged).")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write here, not to stdout.")
def bump_body(release, rebase_json, results, retire, verify, kernels, upstream, upstream_diff, output):
    """The pull request body of a bump to VERSION, from the run's records (Markdown). A record that is
    missing, holds a failed command's error, does not validate or is of another release is a line of the
    body, not an exit: the body is written whatever the run produced."""
    from patchkit.upstream.bump import body, load_run

    run = load_run(one_release(release, "--release"), rebase_json, results=results, retire=retire, verify=verify, kernels=kernels,
                   upstream=upstream, upstream_diff=upstream_diff)
    text = body(run)
    if output:
        atomic_write(output, text.encode())
    else:
        click.echo(text, nl=False)


COMMANDS = (rebase, record, upstream, retire, bump)
