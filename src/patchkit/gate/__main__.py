"""`python -m patchkit.gate`: vLLM's own tests, stock against patched, on the installed release.

Run by `nox -s vllm-tests-<release>` inside that release's test environment. Exit 0: every id the same;
1: a difference the series made (each named with its patch); 2: the gate could not run.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from patchkit.cache_root import default_cache_root
from patchkit.errors import PatchkitError
from patchkit.gate import memo
from patchkit.gate.blame import blame
from patchkit.gate.compare import compare
from patchkit.gate.run import build_tree, edited_files, prepare, run_tests, series_for
from patchkit.gate.selection import SUBSETS, NothingSelected, select
from patchkit.sources.cache import ArchiveCache

REPO = Path(__file__).resolve().parents[3]


@click.command()
@click.option("--patches", "patches_dir", type=click.Path(file_okay=False, path_type=Path), default=REPO / "patches",
              show_default=True, help="The patch set (a planted or rebased copy to try one).")
@click.option("--subset", type=click.Choice(sorted(SUBSETS)), help="Only this named part of the selection.")
@click.option("--narrow", multiple=True, metavar="PATH",
              help="Only the selected tests under PATH (relative to the sdist, e.g. tests/parser/engine).")
@click.option("--exclude", multiple=True, help="Leave this patch out of the patched tree (as the necessity run does).")
@click.option("--record", type=click.Path(dir_okay=False, path_type=Path), help="Write the figures here (JSON).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the trees and the sdist's tests go [default: patchkit's cache, gate/vllm-RELEASE].")
# 6 on two cores: vLLM's serving tests spend half their time waiting (its tests/conftest.py's per-test
# cleanup, the Hub retries of offline model lookups); measured on test_serving_chat.py, 6 workers ran it in
# 157 s where the ci subset took ~400 s a tree with 2.
@click.option("--workers", type=int, default=6, show_default=True, help="pytest-xdist workers per tree.")
@click.option("--fresh", is_flag=True, help="Run the stock tree even where its outcomes for these inputs are "
              "remembered (gate/memo.py; the daily workflow's gate passes it).")
def main(patches_dir: Path, subset: str | None, narrow: tuple[str, ...], exclude: tuple[str, ...], record: Path | None,
         workdir: Path | None, workers: int, fresh: bool) -> None:
    """vLLM's own tests for every module the series edits, stock and patched, compared per test id."""
    console = Console(stderr=True)
    try:
        code = _gate(console, patches_dir, SUBSETS[subset] if subset else narrow, subset or "", set(exclude), record,
                     workdir, workers, fresh)
    except PatchkitError as e:
        console.print(f"[red]patchkit gate: {e}[/red]")
        sys.exit(2)
    sys.exit(code)


def _gate(console: Console, patches_dir: Path, narrow: tuple[str, ...], subset: str, exclude: set[str],
          record: Path | None, workdir: Path | None, workers: int, fresh: bool) -> int:
    release = version("vllm")
    ws = prepare(workdir or default_cache_root() / "gate" / f"vllm-{release}", release, ArchiveCache())
    series = series_for(patches_dir, exclude)
    edited, per_patch = edited_files(series)
    selection = select(ws.tests_root, edited)
    if narrow:
        selection = selection.narrowed(narrow)
    if not selection.paths:
        raise NothingSelected(release, narrow)
    paths = sorted(selection.paths)
    narrowed = f" (narrowed to {', '.join(narrow)})" if narrow else ""
    console.print(f"vLLM {release}: {len(paths)} test paths for {len(edited)} edited files{narrowed}", soft_wrap=True)
    for path in paths:
        console.print(f"  {path}  [dim]<- {', '.join(sorted(selection.paths[path]))}[/dim]", soft_wrap=True)
    trees = {"stock": build_tree(ws, "stock", []), "patched": build_tree(ws, "patched", series)}
    outcomes, seconds = {}, {}
    key = memo.stock_key(ws, paths, workers)
    remembered = None if fresh else memo.recall(ws, key)
    if remembered is not None:
        outcomes["stock"], seconds["stock"] = remembered.outcomes, remembered.seconds
        console.print(f"stock: {len(remembered.outcomes)} ids remembered from the run finished {remembered.finished} "
                      f"with the same inputs (key {remembered.key[:12]}; --fresh runs them again)", soft_wrap=True)
    for name, tree in trees.items():
        if name in outcomes:
            continue
        start = time.monotonic()
        outcomes[name] = run_tests(ws, tree, name, paths, workers=workers)
        seconds[name] = round(time.monotonic() - start)
        console.print(f"{name}: {len(outcomes[name])} ids in {seconds[name]} s")
        if name == "stock":
            memo.remember(ws, key, outcomes[name], seconds[name])
    first = compare(outcomes["stock"], outcomes["patched"])
    # A difference counts when it comes back: the differing ids rerun once on both trees.
    rerun = [d.test_id for d in first.differences]
    confirmed, flaky = first.differences, []
    if rerun:
        again = compare(*(run_tests(ws, trees[n], f"{n}-rerun", sorted({i.split("::")[0] for i in rerun}), only=rerun,
                                    workers=1) for n in ("stock", "patched")))
        still = {d.test_id for d in again.differences}
        confirmed = [d for d in first.differences if d.test_id in still]
        flaky = [d.test_id for d in first.differences if d.test_id not in still]
    writers = [p.id for p in series if p.id in per_patch and any(pkg == "vllm" for pkg, _ in per_patch[p.id])]
    # Suspects first: the patches whose edited files brought the differing tests into the selection.
    why = {w for d in confirmed for path, reasons in selection.paths.items()
           if d.test_id.split("::")[0] == path or d.test_id.startswith(path.rstrip("/") + "/") for w in reasons}
    writers.sort(key=lambda i: not any(f"{pkg}/{path}" in why for pkg, path in per_patch[i]))
    blamed = blame(ws, series, writers, confirmed, paths) if confirmed else {}
    _show(console, first, confirmed, flaky, blamed)
    if record:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({
            "release": release, "subset": subset or None, "narrow": list(narrow), "excluded": sorted(exclude),
            "paths": {p: sorted(w) for p, w in selection.paths.items()}, "untested": sorted(selection.untested),
            "ids": len(set(first.stock) | set(first.patched)), "same": first.same + len(flaky),
            "stock": dict(first.counts("stock")), "patched": dict(first.counts("patched")), "seconds": seconds,
            "stock_remembered_from": remembered.finished if remembered else None,
            "differences": [{"id": d.test_id, "stock": d.stock, "patched": d.patched, "patch": blamed.get(d.test_id)}
                            for d in confirmed],
            "flaky": flaky,
        }, indent=1, ensure_ascii=False) + "\n")
    return 1 if confirmed else 0


def _show(console: Console, comparison, confirmed, flaky, blamed) -> None:
    counts = Table(title="outcomes per tree (tests that cannot run on CPU fail or skip alike)")
    counts.add_column("outcome", overflow="fold")
    counts.add_column("stock", justify="right")
    counts.add_column("patched", justify="right")
    stock, patched = comparison.counts("stock"), comparison.counts("patched")
    for outcome in sorted(set(stock) | set(patched)):
        counts.add_row(outcome, str(stock[outcome]), str(patched[outcome]))
    console.print(counts)
    console.print(f"{comparison.same + len(flaky)} ids the same, {len(confirmed)} different"
                  + (f", {len(flaky)} differed once and not on the rerun: {', '.join(flaky)}" if flaky else ""))
    # One line each, never cut: a test id is what a person copies to rerun it.
    for d in confirmed:
        console.print(f"{d.test_id}: {d.stock} on stock, {d.patched} patched; {blamed.get(d.test_id, '?')}",
                      soft_wrap=True, markup=False, highlight=False)


if __name__ == "__main__":
    main()
