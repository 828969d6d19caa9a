"""Image builds at real scale, for `nox -s bench` (tests/bench.py): the realistic base
(tests/realistic_base.py; ~10 GB uncompressed at scale 1) in a real registry and in podman's engine.

- Spark route: `patchkit build IMAGE --load` with the base already in the engine, the first build on
  that base (its files read from the engine) and a rebuild (read from the cache of that base), against the
  README's old route, a daemonless build into an OCI layout (every base layer fetched) then
  `skopeo copy oci:... docker-daemon:...` into the same engine. Bytes moved, wall time.
- CI route: the daemonless push build (fresh blob cache: what a CI runner has), against `buildah bud` of
  the same rendered context on the same base (fresh storage, overlay): bytes fetched from the registry,
  layers read, peak disk, wall time.

Peak disk is sampled (every 0.2 s) over the directories each route writes to: its cache, output and
storage directories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from engines import PodmanService
from patchkit.images.build import build
from patchkit.images.engine import render_context
from patchkit.images.local import build_local
from realistic_base import push_layout, realistic_layout
from registry import Registry

REVISION = "bench"
SOURCE = "https://example.invalid/patchkit"


def tree_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


class PeakDisk:
    """The largest total size of `roots` seen while the block runs."""

    def __init__(self, *roots: Path):
        self.roots, self.peak = roots, 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(tree_size(r) for r in self.roots if r.exists()))
            self._stop.wait(0.2)

    def __enter__(self) -> PeakDisk:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, sum(tree_size(r) for r in self.roots if r.exists()))


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def layers_read(result) -> tuple[int, int]:
    """(layers read, their compressed bytes) by a daemonless build: each read layer is streamed whole once."""
    base = result.built.prepared.base
    read = sorted(result.built.prepared.source._listings)
    return len(read), sum(base.layers[i]["size"] for i in read)


def run(image: str, scale: float, workdir: Path) -> dict:
    import docker

    workdir.mkdir(parents=True, exist_ok=True)
    made = realistic_layout(scale)
    layers = made["layers"]
    out = {"scale": scale, "base_layers": len(layers),
           "base_uncompressed_bytes": sum(layer["uncompressed"] for layer in layers),
           "base_compressed_bytes": sum(layer["size"] for layer in layers)}
    with Registry(workdir / "registry") as reg:
        ref = push_layout(made, reg.host, "vllm/realistic")
        repo = ref.split(":base@")[0]
        # -- CI route: daemonless push, fresh cache ----------------------------------------------------
        cache = workdir / "ci-cache"
        with PeakDisk(cache) as disk:
            seconds, result = timed(lambda: build(image, base=ref, push=[f"{reg.host}/out/{image}"], cache=cache,
                                                  revision=REVISION, source_url=SOURCE))
        n_read, read_bytes = layers_read(result)
        holders = [i for i, layer in enumerate(layers) if "vllm" in layer["created_by"] or "flashinfer" in layer["created_by"]]
        out["ci"] = {"seconds": round(seconds, 3), "layers_read": n_read, "layers_read_bytes": read_bytes,
                     "lowest_layer_holding_a_target": min(holders), "peak_disk_bytes": disk.peak,
                     "layers_read_are_those_at_or_above_the_lowest_target_layer":
                         sorted(result.built.prepared.source._listings) == list(range(min(holders), len(layers)))}
        # -- buildah bud of the same context on the same base ----------------------------------------
        context = render_context(result.built, workdir / "context")
        storage = workdir / "buildah"
        cmd = ["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
               "--storage-driver", "overlay", "bud", "--isolation", "chroot", "--platform", "linux/arm64",
               "--tls-verify=false", "-t", f"bench/{image}", str(context)]
        with PeakDisk(storage) as disk:
            seconds, proc = timed(lambda: subprocess.run(cmd, capture_output=True, text=True))
        if proc.returncode != 0:
            raise RuntimeError(f"buildah bud failed: {proc.stderr[-2000:]}")
        out["buildah"] = {"seconds": round(seconds, 3), "peak_disk_bytes": disk.peak}
        subprocess.run(["buildah", "--root", str(storage / "root"), "--runroot", str(storage / "run"),
                        "--storage-driver", "overlay", "rmi", "--all", "--force"], capture_output=True)
        _remove(storage)
        out["ci"]["vs_buildah"] = round(out["buildah"]["seconds"] / out["ci"]["seconds"], 2)

        # -- Spark route: the base in the engine -----------------------------------------------------
        service = PodmanService(workdir / "podman")
        with service as url:
            client = docker.DockerClient(base_url=url, timeout=3600)
            client.api.pull(repo, tag=made["manifest"])          # what the Spark owner already did
            files = workdir / "spark-cache"                        # the engine reads are kept here

            def load():
                return build(image, base=ref, load=True, engine_url=url, revision=REVISION,
                             source_url=SOURCE, cache=files)

            seconds, first = timed(load)                           # first build on this base: reads the engine
            assert first.route == "local-engine", first.route
            again_s, again = timed(load)                           # a rebuild: the reads come from the cache
            source = again.built.prepared.source
            floor_s, _ = timed(lambda: build_local(again.built.prepared, client, revision=REVISION,
                                                   source_url=SOURCE))
            out["spark"] = {"seconds": round(seconds, 3), "transferred_bytes": first.built.transferred,
                            "engine_requests": first.built.prepared.source.requests,
                            "rebuild_seconds": round(again_s, 3), "rebuild_transferred_bytes": again.built.transferred,
                            "rebuild_engine_requests": source.requests, "engine_build_alone_seconds": round(floor_s, 3)}
            layout = workdir / "layout"
            cache = workdir / "layout-cache"

            def layout_plus_copy():
                built = build(image, base=ref, output=layout, cache=cache, revision=REVISION,
                              source_url=SOURCE)
                subprocess.run(["skopeo", "copy", "--quiet", "--dest-daemon-host", url, f"oci:{layout}:{built.built.tag}",
                                f"docker-daemon:patchkit/{image}:layout"], check=True, capture_output=True)
                return built

            seconds, _ = timed(layout_plus_copy)
            # fetched: measured (the layout's blobs, every one fetched); sent: every layer uncompressed, which is what skopeo's
            # docker-daemon destination streams (it asks for uncompressed layers)
            out["layout_plus_copy"] = {"seconds": round(seconds, 3), "fetched_bytes": tree_size(layout / "blobs"),
                                       "sent_to_engine_bytes": out["base_uncompressed_bytes"]}
            spark = out["spark"]
            spark["vs_layout_plus_copy"] = round(out["layout_plus_copy"]["seconds"] / spark["seconds"], 1)
            spark["rebuild_vs_layout_plus_copy"] = round(out["layout_plus_copy"]["seconds"] / spark["rebuild_seconds"], 1)
        service.remove_storage()
        _remove(layout, cache, workdir / "ci-cache")
    return out


def _remove(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def images_bench(image: str, scale: float) -> tuple[dict, dict]:
    """`run` in a temporary directory ($PATCHKIT_BENCH_DIR or /tmp), printed as ratios; (numbers, goals)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="patchkit-bench-images-", dir=os.environ.get("PATCHKIT_BENCH_DIR")) as tmp:
        out = run(image, scale, Path(tmp))
    mb = 1 << 20
    ci, bud, spark, old = out["ci"], out["buildah"], out["spark"], out["layout_plus_copy"]
    print()
    print(f"realistic base (scale {scale:g}): {out['base_layers']} layers, {out['base_uncompressed_bytes'] / mb:,.0f} MiB "
          f"uncompressed, {out['base_compressed_bytes'] / mb:,.0f} MiB compressed; image {image}")
    print(f"Spark route (--load, base in podman), first build on the base: {spark['seconds']:.2f} s, "
          f"{spark['transferred_bytes'] / 1024:,.0f} KiB moved ({spark['engine_requests']} file reads); rebuild: "
          f"{spark['rebuild_seconds']:.2f} s, {spark['rebuild_transferred_bytes'] / 1024:,.0f} KiB moved "
          f"({spark['rebuild_engine_requests']} reads; the engine's build of that context alone: "
          f"{spark['engine_build_alone_seconds']:.2f} s)")
    print(f"  layout + skopeo copy: {old['seconds']:.2f} s, {old['fetched_bytes'] / mb:,.0f} MiB fetched + "
          f"{old['sent_to_engine_bytes'] / mb:,.0f} MiB sent -> first build {spark['vs_layout_plus_copy']:.1f}x, "
          f"rebuild {spark['rebuild_vs_layout_plus_copy']:.1f}x faster (goal: >= 50x, < 1 MB)")
    print(f"CI route (daemonless push, fresh cache): {ci['seconds']:.2f} s, read {ci['layers_read']} of "
          f"{out['base_layers']} layers ({ci['layers_read_bytes'] / mb:,.0f} MiB), peak disk "
          f"{ci['peak_disk_bytes'] / mb:,.1f} MiB; buildah bud: {bud['seconds']:.2f} s, peak disk "
          f"{bud['peak_disk_bytes'] / mb:,.0f} MiB -> {ci['vs_buildah']:.2f}x faster (goal: > 1x)")
    goals = {"spark_transferred_bytes": spark["transferred_bytes"],
             "spark_vs_layout_plus_copy": spark["vs_layout_plus_copy"],
             "spark_rebuild_vs_layout_plus_copy": spark["rebuild_vs_layout_plus_copy"],
             "ci_vs_buildah_bud": ci["vs_buildah"],
             "ci_reads_only_layers_that_can_hold_a_target": ci["layers_read_are_those_at_or_above_the_lowest_target_layer"]}
    return out, goals
