"""`nox -s bench`: patchkit's verify and apply against the obvious route, measured in the same run.

The obvious route extracts the whole sdist with tarfile and runs the same engine on the extracted
directory. patchkit reads only the files the patches name: cold, one pass over each archive that
keeps them (and caches them, content-addressed); warm, the member cache alone.

Printed, not asserted: timings on a shared machine are for people. The floor is one streaming
decompression of each sdist (gzip read to its end, nothing kept): no route can read an archive for
less. Cold runs use a fresh temporary cache whose archives are hard links to the user cache's
(downloaded once), so no run measures the network. CPU time (this process and its children) is printed
beside wall time, since other work on a shared machine inflates the latter; the warm CLI process is
the number a user sees (a repeat inside one process may also reuse what that process memoised).

Patched wheels: `patchkit wheel build` from the cached release wheel against `wheel unpack` + apply +
`wheel pack` of the same wheel and series (the `wheel` package: `nox -s bench` installs it).

Image builds on the realistic base (tests/bench_images.py): the Spark route (`--load`) against a layout
plus `skopeo copy`, and the daemonless push against `buildah bud`. `--json FILE` writes every number.

Rebase on real history (`--only rebase`): each patch with its later releases' edits and paths stripped,
re-derived by `patchkit rebase` from the earlier release and the real later sources, compared with the
hand-written edits (identical, or the same effect on the release), and the rebased patches' behaviour
tests run in the release's test environment where it is built. Figures per patch, not timed.

    python tests/bench.py [--patches DIR] [--images DIR] [--versions 0.30.0,...] [--repeat N] [--only verify|wheels|images|rebase]
                          [--image IMAGE] [--scale 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from patchkit import PINNED_VLLM
from patchkit.images.definitions import every_series
from patchkit.patching import planner
from patchkit.patching.patchset import load_patchset
from patchkit.sources import ArchiveCache, DirectorySource, open_source
from patchkit.sources.pins import pinned_flashinfer
from patchkit.verify.matrix import compute as compute_matrix
from patchkit.verify.render import to_dict
from patchkit.verify.targets import Target, index_targets, parse_versions

REPO = Path(__file__).resolve().parents[1]
CLI = (
    "import sys; from patchkit.cli.main import main; from patchkit.cli.verify import verify_command\n"
    "if 'verify' not in main.commands: main.add_command(verify_command)\n"
    "main()"
)


CPU = {}  # label -> best CPU seconds (this process and its children): wall time lies on a shared machine


def cpu_now() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn, repeat: int = 1, label: str | None = None) -> tuple[float, object]:
    """Best wall time of `repeat` calls, and the last result; the best CPU time goes to CPU[label]."""
    best, best_cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), cpu_now()
        result = fn()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, cpu_now() - start_cpu)
    if label:
        CPU[label] = best_cpu
    return best, result


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def decompress(path: Path) -> None:
    with gzip.open(path) as stream:
        while stream.read(1 << 20):
            pass


def tar_pass(path: Path) -> None:
    """What reading a member list costs through tarfile: every header parsed, no member kept."""
    with tarfile.open(path) as tar:
        for _ in tar:
            pass


def fresh_cache(user: ArchiveCache, versions: list[str], root: Path, companions: dict[str, str]) -> ArchiveCache:
    """A cache with the archives (linked, not copied or downloaded) and nothing read out of them yet: each
    vLLM release and the FlashInfer release it pins, which verify reads beside it."""
    shutil.rmtree(root, ignore_errors=True)
    cache = ArchiveCache(root)
    cache.downloads.mkdir(parents=True)
    wanted = [*(("vllm", v) for v in versions), *(("flashinfer-python", companions[v]) for v in versions)]
    for dist, version in dict.fromkeys(wanted):  # 0.31 and 0.32 pin the same FlashInfer
        archive = user.lookup(dist, version)
        link(archive.path, cache.downloads / archive.path.name)
        shutil.copy(user.downloads / f"{dist}-{version}.json", cache.downloads)
    return cache


def link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy(source, target)


def extracted(user: ArchiveCache, work: Path):
    """The obvious route's opener: extract the whole sdist, read the directory."""

    def opener(target: Target) -> DirectorySource:
        archive = user.lookup("vllm", target.ref).path
        into = work / target.ref
        shutil.rmtree(into, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
        (top,) = into.iterdir()
        return DirectorySource(top)

    return opener


def write_new(changes: list[planner.FileChange], where) -> None:
    """Plain writes in both routes (no journal, no fsync): the comparison is about reading."""
    for change in changes:
        path = where(change)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(change.new)


def bench_wheels(tmp: Path, series, version: str, repeat: int) -> list[tuple[str, str, float, str]]:
    """A patched wheel from the cached release wheel (x86_64): `patchkit wheel build`'s library call against
    `wheel unpack` + the same planner and series on the tree + `wheel pack --local-version` (wheel from PyPI)."""
    from patchkit.wheels.build import build_wheel
    from patchkit.wheels.release import release_wheel

    release = release_wheel(version, "x86_64")  # downloaded once, outside any measurement
    ours, built = timed(lambda: build_wheel(release, series, "full", tmp / "wheel-patchkit"), repeat, "wheel-patchkit")
    local = built.manifest.version.split("+", 1)[1]

    def unpack_apply_pack() -> Path:
        work = tmp / "wheel-obvious"
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "wheel", "unpack", str(release), "-d", str(work)], check=True,
                       capture_output=True)
        (tree,) = work.iterdir()
        source = DirectorySource(tree)
        plan = planner.plan(series, source)
        plan.raise_for_errors()
        write_new(plan.changes, lambda c: source.package_root(c.package) / c.path)
        (work / "out").mkdir()
        subprocess.run([sys.executable, "-m", "wheel", "pack", str(tree), "-d", str(work / "out"), "--local-version",
                        local], check=True, capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"})
        return next((work / "out").glob("*.whl"))

    obvious, packed = timed(unpack_apply_pack, 1, "wheel-obvious")
    with zipfile.ZipFile(built.path) as a, zipfile.ZipFile(packed) as b:
        same = {(i.filename, i.CRC) for i in a.infolist() if i.filename.startswith("vllm/")} == {
            (i.filename, i.CRC) for i in b.infolist() if i.filename.startswith("vllm/")}
    return [
        ("wheel-patchkit", (f"patched wheel of {version} x86_64, full series (package files identical to the "
                            f"obvious route's: {'yes' if same else 'NO'})"), ours,
         f"{CPU['wheel-obvious'] / CPU['wheel-patchkit']:.2f}x faster than obvious"),
        ("wheel-obvious", "obvious: wheel unpack + apply + wheel pack", obvious, ""),
    ]


def print_rows(rows) -> None:
    width = max(len(r[1]) for r in rows)
    print(f"{'':<{width}}  {'wall':>8}    {'CPU':>8}    ratios (of CPU time)")
    for key, name, seconds, note in rows:
        print(f"{name:<{width}}  {seconds:8.3f} s  {CPU[key]:8.3f} s  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=Path, default=REPO / "patches")
    parser.add_argument("--images", type=Path, default=REPO / "images")
    parser.add_argument("--versions", default="0.30.0,0.31.0,0.32.0,0.33.0")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs (the best is kept)")
    parser.add_argument("--only", choices=["verify", "wheels", "images", "rebase"],
                        help="one benchmark: verify (and apply), the patched wheel, or the image builds")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every number here, for CI to keep")
    parser.add_argument("--image", default="glm53-flash-nvfp4-4p67", help="image of the build benchmarks")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="realistic base size (1.0: ~10 GB uncompressed; 0 skips the build benchmarks)")
    args = parser.parse_args()
    if args.only == "rebase":
        report = {"machine": {"cores": os.cpu_count(), "load": os.getloadavg()}}
        report["rebase"], report["goals"] = rebase_bench(args.patches)
        write_report(report, args.json)
        return
    if args.only == "wheels":
        with tempfile.TemporaryDirectory(prefix="patchkit-bench-") as tmp:
            print_rows(bench_wheels(Path(tmp), load_patchset(args.patches).series(), PINNED_VLLM,
                                    min(args.repeat, 3)))
        return
    if args.only == "images":
        from bench_images import images_bench

        report = {"machine": {"cores": os.cpu_count(), "load": os.getloadavg()}}
        report["images"], report["goals"] = images_bench(args.image, args.scale)
        write_report(report, args.json)
        return

    versions = args.versions.split(",")
    pinned = PINNED_VLLM
    if pinned not in versions:
        versions.append(pinned)
    patchset = load_patchset(args.patches)
    images = every_series(args.images, patchset)
    targets = index_targets(parse_versions(",".join(versions)))
    user = ArchiveCache()
    companions = {}
    for version in versions:  # downloads, once, outside any measurement
        companions[version] = pinned_flashinfer(open_source(f"vllm=={version}", cache=user, progress=True))
        open_source(f"flashinfer-python=={companions[version]}", cache=user, progress=True)
    # The floor: decompressing what verify must read, each vLLM sdist and its pinned FlashInfer sdist.
    archives = {v: [user.lookup("vllm", v).path, user.lookup("flashinfer-python", companions[v]).path]
                for v in versions}

    with tempfile.TemporaryDirectory(prefix="patchkit-bench-") as tmp:
        tmp = Path(tmp)
        floor_pin, _ = timed(lambda: [decompress(a) for a in archives[pinned]], 3, "floor-pin")
        every = list(dict.fromkeys(a for v in versions for a in archives[v]))
        floor, _ = timed(lambda: [decompress(a) for a in every], 1, "floor")
        tar_pin, _ = timed(lambda: [tar_pass(a) for a in archives[pinned]], 3, "tar-pin")

        def compute(cache=None, opener=None, subset=targets):
            return compute_matrix(patchset, subset, image_series=images, cache=cache, opener=opener)

        # Cold, the pinned release alone: the ratio the issue sets (within 20% of one decompression).
        pin_target = [t for t in targets if t.ref == pinned]
        cold_pin, _ = timed(lambda: compute(fresh_cache(user, [pinned], tmp / "cold-pin", companions), subset=pin_target),
                            3, "cold-pin")
        cache = fresh_cache(user, versions, tmp / "cache", companions)
        cold, matrix = timed(lambda: compute(cache), 1, "cold")
        warm, _ = timed(lambda: compute(cache), args.repeat, "warm")
        env = {**os.environ, "PATCHKIT_CACHE_DIR": str(cache.root)}
        command = [sys.executable, "-c", CLI, "verify", "--patches", str(args.patches), "--images", str(args.images),
                   "--versions", ",".join(versions), "--json"]
        warm_cli, _ = timed(lambda: subprocess.run(command, env=env, capture_output=True, check=False),
                            args.repeat, "warm-cli")
        imports, _ = timed(
            lambda: subprocess.run([sys.executable, "-c", "import patchkit.cli.verify, patchkit.cli.main, rich.table"],
                                   check=True),
            args.repeat, "imports",
        )
        # Cache integrity: a lookup re-hashes an archive only when its file is not the one last verified
        # (stamp in the record); this is that hash for every archive, against the warm stat-only lookups.
        sha_all, _ = timed(lambda: [_sha256_file(a) for a in every], 3, "sha-all")
        lookups, _ = timed(lambda: [cache.lookup(d, v) for v in versions
                                    for d, v in (("vllm", v), ("flashinfer-python", companions[v]))],
                           args.repeat, "lookup-warm")

        obvious_opener = extracted(user, tmp / "extracted")
        obvious, obvious_matrix = timed(lambda: compute(opener=obvious_opener), 1, "obvious")
        trees = {t.ref: DirectorySource(next((tmp / "extracted" / t.ref).iterdir())) for t in targets}
        kept, _ = timed(lambda: compute(opener=lambda t: trees[t.ref]), args.repeat, "kept")
        same = to_dict(matrix)["patches"] == to_dict(obvious_matrix)["patches"]

        # Full-series apply on the pinned release: patchkit writes the changed files into an empty
        # directory (what an image layer holds); the obvious route extracts everything, patches the tree.
        series = patchset.series()

        def apply_patchkit(cache: ArchiveCache) -> int:
            source = open_source(f"vllm=={pinned}", cache=cache, progress=False)
            plan = planner.plan(series, source)
            out = tmp / "layer"
            shutil.rmtree(out, ignore_errors=True)
            write_new(plan.changes, lambda c: out / c.package / c.path)
            return len(plan.changes)

        def apply_obvious() -> int:
            source = obvious_opener(pin_target[0])
            plan = planner.plan(series, source)
            write_new(plan.changes, lambda c: source.package_root(c.package) / c.path)
            return len(plan.changes)

        apply_cold, changed = timed(lambda: apply_patchkit(fresh_cache(user, [pinned], tmp / "apply-cold", companions)),
                                    3, "apply-cold")
        apply_warm, _ = timed(lambda: apply_patchkit(cache), args.repeat, "apply-warm")
        apply_obv, _ = timed(apply_obvious, 1, "apply-obvious")
        wheel_rows = bench_wheels(tmp, series, pinned, min(args.repeat, 3)) if args.only is None else []

    n = len(versions)
    print(f"patchkit bench: {len(patchset.order)} patches, {len(images)} series, vLLM {', '.join(versions)}")
    print(f"machine: {os.cpu_count()} cores, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("matrix identical through both routes:", "yes" if same else "NO")
    print()

    def ratio(a: str, b: str) -> str:
        return f"{CPU[a] / CPU[b]:.2f}x"

    rows = [
        ("floor-pin", "decompressing the pinned vLLM + FlashInfer sdists (floor)", floor_pin, ""),
        ("tar-pin", "one tarfile pass over them (headers only)", tar_pin, f"{ratio('tar-pin', 'floor-pin')} floor"),
        ("floor", f"decompressing {n} vLLM sdists and their FlashInfers", floor, ""),
        ("cold-pin", "cold verify, pinned release", cold_pin,
         f"{ratio('cold-pin', 'floor-pin')} floor (issue: <= 1.20x); {ratio('cold-pin', 'tar-pin')} tarfile pass"),
        ("cold", f"cold verify, {n} releases", cold, f"{ratio('cold', 'floor')} floor"),
        ("warm", f"warm verify, {n} releases, repeated in one process", warm, f"best of {args.repeat}"),
        ("warm-cli", f"warm verify, {n} releases, CLI process", warm_cli, f"of it, Python + imports: {imports:.3f} s"),
        ("sha-all", f"sha256 of all {len(every)} cached archives (a lookup after a file changed)", sha_all,
         f"{ratio('sha-all', 'floor')} floor"),
        ("lookup-warm", f"warm cache lookups, {2 * n} archives (stat against the verified stamp)", lookups,
         f"{CPU['lookup-warm'] / CPU['sha-all']:.4f}x re-hashing"),
        ("obvious", f"obvious: extract all + verify, {n} releases", obvious,
         f"patchkit cold {ratio('obvious', 'cold')} faster, warm {ratio('obvious', 'warm')} faster"),
        ("kept", "obvious, trees kept extracted (no extraction)", kept,
         f"patchkit warm takes {ratio('warm', 'kept')} its time"),
        ("apply-cold", f"apply full series on {pinned}, cold ({changed} files)", apply_cold,
         f"{ratio('apply-obvious', 'apply-cold')} faster than obvious"),
        ("apply-warm", f"apply full series on {pinned}, warm", apply_warm,
         f"{ratio('apply-obvious', 'apply-warm')} faster than obvious"),
        ("apply-obvious", f"obvious: extract all + apply on {pinned}", apply_obv, ""),
        *wheel_rows,
    ]
    print_rows(rows)
    report = {"machine": {"cores": os.cpu_count(), "load": os.getloadavg()}, "versions": versions,
              "timings": {key: {"wall_s": round(seconds, 4), "cpu_s": round(CPU[key], 4)}
                          for key, _, seconds, _ in rows}}
    report["goals"] = verify_goals(report["timings"], n)
    if args.scale > 0 and args.only is None:
        from bench_images import images_bench

        report["images"], image_goals = images_bench(args.image, args.scale)
        report["goals"].update(image_goals)
    if args.only is None:
        report["rebase"], rebase_goals = rebase_bench(args.patches)
        report["goals"].update(rebase_goals)
    write_report(report, args.json)


# (from, to) of the real history: vLLM's nvidia/ -> common/ layout (0.30 -> 0.31+), FlashInfer 0.6.x -> 0.7.x
REBASE_HISTORY = [("vllm==0.30.0", "vllm==0.31.0"), ("vllm==0.30.0", "vllm==0.32.0"), ("vllm==0.30.0", "vllm==0.33.0"),
                  ("flashinfer-python==0.6.18.post1", "flashinfer-python==0.7.2.post1"),
                  ("flashinfer-python==0.6.18.post1", "flashinfer-python==0.7.4")]
# The hand-written set itself moved forwards where it has no stripped edits to recover: it must hold.
REBASE_FORWARD = [("flashinfer-python==0.7.2.post1", "flashinfer-python==0.7.4")]


def rebase_bench(patches_dir: Path) -> tuple[dict, dict]:
    """Per history step and patch: later edits, recovered (identical / same effect), needing a person,
    behaviour tests on the rebased set where the release's environment exists."""
    from patchkit.cache_root import default_cache_root
    from patchkit.patching import rebase as rb

    cache_dir = default_cache_root()
    out, totals = {}, {"later_edits": 0, "recovered": 0, "tested": 0, "recovered_and_passing": 0}
    print(f"{'history':<52} {'patch':<24} {'later':>5} {'ident':>5} {'recov':>5}  tests / needs a person")
    with tempfile.TemporaryDirectory(prefix="patchkit-bench-rebase-") as tmp:
        for n, (old_spec, new_spec) in enumerate(REBASE_HISTORY):
            old, new = open_source(old_spec, progress=True), open_source(new_spec, progress=True)
            start = time.perf_counter()
            measured = rb.measure(patches_dir, old, new, Path(tmp) / str(n))
            seconds = time.perf_counter() - start
            version = new.versions().get("vllm")
            python = rb.test_environment(cache_dir, version) if version else None
            runs = {}
            if python is not None:
                rebased = [p for p in measured["rebased"] if p in measured["patches"]]
                runs = {t.patch_id: t for t in rb.run_behaviour_tests(rebased, Path(measured["rebased_dir"]), python,
                                                                      REPO / "tests")}
            step = f"{old_spec} -> {new_spec}"
            out[step] = {"seconds": round(seconds, 1), "tests_env": str(python) if python else None, "patches": {}}
            for patch_id, fig in measured["patches"].items():
                run = runs.get(patch_id)
                fig = dict(fig, tests=None if run is None else ("passed" if run.passed else "failed"))
                if run is not None and not run.passed:
                    fig["tests_tail"] = run.tail
                out[step]["patches"][patch_id] = fig
                totals["later_edits"] += fig["later_edits"]
                totals["recovered"] += fig["recovered"]
                if run is not None:
                    totals["tested"] += fig["recovered"]
                    totals["recovered_and_passing"] += fig["recovered"] if run.passed else 0
                people = "; ".join(f"edit {p['edit']}: {p['reason'][:70]}" for p in fig["needs_person"])
                tests = fig["tests"] or ("no vLLM" if not version else "no env" if python is None else "not rebased")
                print(f"{step:<52} {patch_id:<24} {fig['later_edits']:>5} {fig['identical']:>5} {fig['recovered']:>5}  "
                      f"{tests}{' / ' + people if people else ''}")
        for old_spec, new_spec in REBASE_FORWARD:
            result = rb.rebase(load_patchset(patches_dir).series(), open_source(old_spec), open_source(new_spec))
            step = f"{old_spec} -> {new_spec} (hand-written set)"
            out[step] = {r.patch.id: r.state for r in result.results if r.state != "unchanged" or r.patch.id == "nope-mla-pad"}
            print(f"{step:<52} {out[step]}")
    share = totals["recovered"] / max(1, totals["later_edits"])
    goals = {"rebase_recovered_share": round(share, 3), **totals}
    print(f"\nrecovered {totals['recovered']} of {totals['later_edits']} hand-written later-release edits ({share:.0%}; "
          f"goal >= 80%); behaviour-tested {totals['tested']}, passing {totals['recovered_and_passing']}")
    return out, goals


def write_report(report: dict, path: Path | None) -> None:
    if path:
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")


def verify_goals(timings: dict, n: int) -> dict:
    """Cold verify against the zlib floor (the same archives decompressed by Python's zlib, in this run)."""
    cold, floor, cli = timings["cold"], timings["floor"], timings["warm-cli"]
    goals = {"cold_verify_vs_zlib_floor_wall": round(cold["wall_s"] / floor["wall_s"], 2),
             "cold_verify_vs_zlib_floor_cpu": round(cold["cpu_s"] / floor["cpu_s"], 2),
             "warm_verify_cli_s": cli["wall_s"]}
    print()
    print(f"cold verify, {n} releases: {goals['cold_verify_vs_zlib_floor_wall']:.2f}x the zlib floor in wall time, "
          f"{goals['cold_verify_vs_zlib_floor_cpu']:.2f}x in CPU time (goal: <= 1.0x)")
    print(f"warm verify, {n} releases, as a CLI process: {cli['wall_s']:.3f} s (goal: < 1 s)")
    return goals


if __name__ == "__main__":
    main()
