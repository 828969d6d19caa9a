"""The in-image proof (`patchkit smoke-image`): a built linux/arm64 image executed, not only its tree.

From an OCI layout (what `patchkit build` writes), for the variants the image serves:
1. the root filesystem assembled from the layout's layers, whiteouts applied (smoke.image_rootfs);
2. patchkit's status of the image's own files (the planner reading the assembled site-packages, as
   `patchkit status` reads a tree): every patch the image's labels say it carries must be applied, and
   each file the series changes must hold exactly the bytes the series makes of the base's file (the
   base: the image's layers below its own, assembled the same way);
3. inside the image, under qemu-user on a non-arm64 machine, in the image's own Python
   (smoke.in_image): each patched file resolves through the import system to that path with no stub
   or shadow over it, vllm and each patched module import, each extra wheel's files match its RECORD
   and its modules import, native ones included;
4. in the same process, the variants' CPU load smoke: the tiny real-format checkpoints (packed on this
   machine by ModelOpt, as `patchkit smoke --cpu` packs them) resolved by the image's own vLLM and torch,
   each table judged against its variant (smoke.load_check).

An image without patchkit's labels (a base, the stock image) gets steps 1, 3 (imports) and 4 only: its
smoke shows what the patches fix. The receipt names the manifest digest it proved and how long each
step took; `proven_digest` reads it back for `patchkit build --proven` (the publish workflow pushes only
the digest its receipt proved).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from patchkit.errors import PatchFailed, PatchkitError
from patchkit.jsondata import decode
from patchkit.localfiles import atomic_write
from patchkit.oci.base import BaseImage, open_base
from patchkit.oci.media import Platform
from patchkit.smoke.image_rootfs import HELPER_DIR, Rootfs, RootfsError, assemble, chain_id, emulator, run_inside
from patchkit.smoke.load_check import SmokeReport, judge
from patchkit.untrusted import read_file

LABEL = "dev.patchkit"
SRC = Path(__file__).resolve().parents[2]  # the directory holding the patchkit package


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ImageProof:
    image: str
    digest: str
    platform: str
    patchkit_image: str | None
    series: list[str]
    python: str | None
    emulator: str | None
    checks: list[Check] = field(default_factory=list)
    smoke: list[SmokeReport] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    layers: dict[str, int] = field(default_factory=dict)   # how the root filesystem was assembled

    @property
    def problems(self) -> list[str]:
        return [c.detail for c in self.checks if not c.ok] + [p for r in self.smoke for p in r.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"image": self.image, "digest": self.digest, "platform": self.platform, "ok": self.ok,
                "patchkit_image": self.patchkit_image, "series": self.series, "python": self.python,
                "emulator": self.emulator, "problems": self.problems,
                "checks": [c.__dict__ for c in self.checks],
                "smoke": [json.loads(r.to_json()) for r in self.smoke], "seconds": self.seconds,
                "layers": self.layers}

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"in-image proof of {self.digest} ({self.platform}, Python {self.python}, "
                            f"{'qemu-user' if self.emulator else 'native'})")
        for col in ("check", "ok", "detail"):
            table.add_column(col, overflow="fold")  # never cut: a detail names the path or package at fault
        for c in self.checks:
            table.add_row(c.name, "[green]yes[/]" if c.ok else "[red]no[/]", c.detail if not c.ok else "")
        parts = [table, *self.smoke]
        parts.append(f"[green]proved {self.digest}[/]" if self.ok else
                     f"[red]{len(self.problems)} problem(s): {self.digest} is not proved[/]")
        parts.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items()))
        return Group(*parts)


class VariantNotServed(PatchkitError):
    """A `variant` asked for is served by another image (`wants`) than the one given, a build of `image`
    (exit 2)."""

    def __init__(self, variant: str, wants: str, image: str):
        super().__init__(f"variant {variant} is served by image {wants}; {image} is a build of another image")
        self.variant, self.wants, self.image = variant, wants, image


class NoVariantsToProve(PatchkitError):
    """No variant was named for the image at `spec`, and none can be read from it: it carries no
    dev.patchkit.image label (a base, a stock image), or its `image` serves no variant here (exit 2)."""

    def __init__(self, spec: str, image: str | None = None):
        why = (f"it is a build of {image}, which no variant.toml in the images directory names" if image else
               "it carries no dev.patchkit.image label (a base or a stock image): name the variants to smoke")
        super().__init__(f"{spec}: no variants to prove: {why}")
        self.spec, self.image = spec, image


def _labels(image: BaseImage) -> dict[str, str]:
    return dict((image.config.get("config") or {}).get("Labels") or {})


def _module(package: str, path: str) -> str:
    stem = path[:-3] if path.endswith(".py") else path
    parts = [package, *stem.split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def status_checks(patches: list, site: Path, base_site: Path, packages: dict) -> tuple[list[Check], list[dict]]:
    """patchkit's status of the image's files, and the series' bytes for each file it changes (the series
    applied in memory to the base's files). Returns the checks and the in-image entries of the files."""
    from patchkit.patching import planner
    from patchkit.sources.directory import DirectorySource

    checks = []
    status = planner.plan(patches, DirectorySource(site), diagnose=False)
    for result in status.results:
        files = sorted({f"{packages[e.package].path}/{c}" for e in result.patch.edits if e.package in packages
                        for c in e.candidates})
        ok = result.state == planner.State.APPLIED
        checks.append(Check(f"status {result.patch.id}", ok, f"patch {result.patch.id}: {result.state} in the image's "
                            f"files ({', '.join(files)})" + (f": {result.detail}" if result.detail else "")))
    expected = planner.plan(patches, DirectorySource(base_site), diagnose=False)
    if not expected.ok:
        bad = "; ".join(r.describe() for r in expected.results if not r.ok)
        checks.append(Check("series on the base", False, f"the series does not apply to the image's base layers: {bad}"))
    entries = []
    for change in expected.changes:
        path = f"{packages[change.package].path}/{change.path}"
        on_disk = site / posixpath.relpath(path, posixpath.dirname(packages["vllm"].path))
        ok = on_disk.is_file() and _sha256(on_disk.read_bytes()) == _sha256(change.new)
        checks.append(Check(f"file {path}", ok, "the series' bytes" if ok else
                            f"{path}: {'not the series bytes' if on_disk.is_file() else 'missing'} in the image's root filesystem"))
        entries.append({"module": _module(change.package, change.path), "path": path, "sha256": _sha256(change.new)})
    return checks, entries


def _wheel_entries(definition, site: str) -> list[dict]:
    out = []
    for pin in definition.wheels.values():
        dist = pin.name.replace("-", "_")
        out.append({"name": pin.name, "site": site, "dist_info": f"{dist}-{pin.version}.dist-info", "modules": [dist]})
    return out


def _put_helpers(root: Path, checkpoints: dict[str, Path]) -> None:
    helper = root / HELPER_DIR
    helper.mkdir(exist_ok=True)
    shutil.copytree(SRC / "patchkit", helper / "src" / "patchkit", ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True)
    for name, ckpt in checkpoints.items():
        shutil.copytree(ckpt, helper / "ckpt" / name, dirs_exist_ok=True)


def prove_image(spec: str, variants: list, *, images_dir: Path, patches_dir: Path, workdir: Path,
                modelopt_python: str, cache: Path | None = None, timeout: float = 3600) -> ImageProof:
    """Prove the image at `spec` (an OCI layout, `DIR` or `DIR:REF`) for `variants`."""
    from patchkit.cache_root import default_cache_root
    from patchkit.images.definitions import load_image
    from patchkit.patching.patchset import load_patchset
    from patchkit.smoke.cpu import _job, build_checkpoints

    started = time.monotonic()
    seconds: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        seconds[name] = round(now - since, 1)
        return now

    platform = Platform.parse("linux/arm64")
    image = open_base(spec, platform)
    labels = _labels(image)
    patchset = load_patchset(patches_dir)
    name = labels.get(f"{LABEL}.image")
    if not variants:   # every variant the image serves, read from its own label
        if not name:
            raise NoVariantsToProve(spec)
        from patchkit.variants.definitions import load_variants
        variants = [v for v in load_variants(images_dir).values() if v.image == name]
        if not variants:
            raise NoVariantsToProve(spec, name)
    for v in variants:
        if name and v.image != name:
            raise VariantNotServed(v.name, v.image, name)
    definition = load_image(images_dir, name or variants[0].image, patchset)
    carried = [p for p in (labels.get(f"{LABEL}.series") or "").split(",") if p]
    proof = ImageProof(spec, image.manifest_digest, str(platform), name, carried, None, emulator())
    cache = cache or default_cache_root() / "image-rootfs"
    work = workdir / f"rootfs-{image.manifest_digest.removeprefix('sha256:')[:16]}"
    shutil.rmtree(work, ignore_errors=True)
    mark = time.monotonic()
    rootfs: Rootfs = assemble(image, work, cache)
    proof.layers = {"applied": len(rootfs.layers), "from_cached_chain": rootfs.reused}
    mark = lap("assemble", mark)

    vllm_path = definition.packages["vllm"].path
    site = posixpath.dirname(vllm_path)
    entries: list[dict] = []
    if name:
        diff_ids = image.config["rootfs"]["diff_ids"]
        base_root = cache / chain_id(diff_ids[:-1]).removeprefix("sha256:")
        patches = patchset.series(carried)
        checks, entries = status_checks(patches, work / site.lstrip("/"), base_root / site.lstrip("/"), definition.packages)
        proof.checks += checks
    mark = lap("status", mark)

    build_checkpoints([v.name for v in variants], workdir, modelopt_python)
    jobs, stored = [], []
    for v in variants:
        job, kinds = _job(v, workdir)
        job["checkpoint"] = f"/{HELPER_DIR}/ckpt/{v.name}"
        jobs.append(job)
        stored.append(kinds)
    _put_helpers(work, {v.name: workdir / v.name for v in variants})
    job_doc = {"patched": entries, "imports": ["vllm", *dict.fromkeys(e["module"] for e in entries)],
               "wheels": _wheel_entries(definition, site) if name else [], "probe": jobs}
    (work / HELPER_DIR / "job.json").write_text(json.dumps(job_doc))
    mark = lap("checkpoints", mark)

    python = "/usr/bin/" + posixpath.basename(posixpath.dirname(site))  # .../lib/python3.X/dist-packages
    proc = run_inside(work, [python, "-m", "patchkit.smoke.in_image", f"/{HELPER_DIR}/job.json"], timeout=timeout,
                      env={"PYTHONPATH": f"/{HELPER_DIR}/src", "VLLM_LOGGING_LEVEL": "ERROR"}, qemu=proof.emulator)
    lap("in-image", mark)
    if proc.returncode != 0 or not proc.stdout.strip():
        proof.checks.append(Check("in-image run", False, f"{python} inside {image.manifest_digest} exited "
                                  f"{proc.returncode}: {proc.stderr.strip()[-1500:]}"))
    else:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        proof.python = answer["python"]
        proof.checks += [Check(c["name"], c["ok"], c["detail"]) for c in answer["checks"]]
        tables = answer.get("tables")
        if tables is not None:
            label = f"image {image.manifest_digest[:19]}"
            proof.smoke = [judge(v, rows, kinds, label) for v, rows, kinds in zip(variants, tables, stored, strict=True)]
    seconds["total"] = round(time.monotonic() - started, 1)
    proof.seconds = seconds
    shutil.rmtree(work, ignore_errors=True)
    return proof


def write_receipt(proof: ImageProof, path: Path) -> None:
    atomic_write(path, (json.dumps(proof.to_dict(), indent=2) + "\n").encode())  # a push reads it: whole or none


class Receipt(msgspec.Struct):
    """What `--proven` needs of a receipt (write_receipt writes more): the rest is for a person."""

    digest: str
    ok: bool
    patchkit_image: str | None
    problems: list[str]


class NotProved(PatchFailed):
    """The receipt at `receipt` does not prove a build of `image`: it `reason` (exit 1)."""

    def __init__(self, receipt: str, image: str, reason: str):
        super().__init__(f"{receipt} does not prove a build of {image}: it {reason}; nothing was written or pushed")
        self.receipt, self.image, self.reason = receipt, image, reason


def proven_digest(path: Path, image: str) -> str:
    """The manifest digest the receipt at `path` proved for a build of `image`; NotProved where the proof
    failed or was of another image (a base, a stock image, another variant's image)."""
    receipt = decode(read_file(path, "run-record", "the proof's receipt"), Receipt, f"receipt {path}")
    if not receipt.ok or receipt.problems:
        first = receipt.problems[0] if receipt.problems else "none named"
        raise NotProved(str(path), image, f"records a failed proof ({len(receipt.problems)} problem(s), the first: {first})")
    if receipt.patchkit_image != image:
        raise NotProved(str(path), image, f"proved {receipt.patchkit_image or 'an image without patchkit labels'}")
    return receipt.digest


__all__ = ["Check", "ImageProof", "NoVariantsToProve", "NotProved", "RootfsError", "VariantNotServed", "prove_image",
           "proven_digest", "write_receipt"]
