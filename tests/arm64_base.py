"""A linux/arm64 base from real parts, for the in-image proof (patchkit.smoke.image_proof): Debian's
arm64 packages for the OS and its Python, PyPI's aarch64 release wheels of vLLM 0.30.0 (the day-0
base's proxy: the same 0.30.0 file layout) and the whole closure it declares, torch 2.13.0's CUDA 13
stack included. Built daemonlessly, on this x86 machine, with no emulation except one question (the
image's own Python asked its bytecode magic number, so vLLM's bytecode is compiled in its format, as pip
compiles after an install), and cached.

- OS: Debian 13 (trixie) arm64, `python3` (3.13), the C++ runtime and OpenMP torch links, and
  base-files (os-release, the merged-/usr links), resolved and downloaded by apt itself under a private
  configuration in the cache (nothing of this machine's apt is changed; the archive's signature is
  checked by apt with the host's Debian keyring), pinned by version and sha256 in
  tests/data/arm64-base/debs.lock, unpacked with `dpkg-deb -x`. Why not debootstrap --foreign and a
  second stage under qemu: that stage runs every maintainer script under emulation (minutes) for
  things the proof never reads (users, alternatives, ldconfig's cache); the files dpkg unpacks are what
  the Python executes.
- Python: Debian's 3.13.5. The real base runs Ubuntu 24.04's 3.12, which no registry reachable here
  serves for arm64 (Debian carries 3.11 and 3.13), and CPython's source is not reachable either, so
  3.12 cannot be cross-built from real parts here. What that leaves unproven: the definitions'
  python3.12 dist-packages path (the proof builds through definitions whose package paths name this
  base's python3.13 directory, images/ otherwise unchanged), cpython-312 bytecode tags, and the cp312
  ABI of the extra wheels (the proof installs their cp313 build of the same release).
- Wheels: `vllm==0.30.0` resolved by uv for cp313 manylinux_2_39 aarch64 (glibc 2.39: Ubuntu 24.04's,
  which the real base runs; trixie has 2.41), with one override, nvidia-nccl-cu13 2.32.6 for the
  2.29.7 torch 2.13.0 pins (the index serves no aarch64 file of 2.29.7; libnccl.so.2 either way);
  pinned with sha256 in tests/data/arm64-base/wheels.lock, downloaded by pip (`--require-hashes`) and
  installed by pypa/installer (the reference installer of the wheel spec pip follows) into
  /usr/local/lib/python3.13/dist-packages, the directory Debian's Python gives `pip install` as root.

Layers, bottom first: the Debian packages; `pip install torch` (torch, triton and the CUDA/NVIDIA
wheels); `pip install vllm` (everything else, vLLM's checked-hash bytecode); a clean-up made
of whiteouts (docs and man pages, as slim images remove them). Deterministic tars (sorted entries,
fixed mtime, numeric owners, one gzip level), so the same locks give the same digest: the nox session
`arm64-base` checks it against tests/data/arm64-base/PINNED.

    python tests/arm64_base.py lock      # resolve afresh and rewrite the two locks (then update PINNED)
    python tests/arm64_base.py build     # the layout (cached); prints its directory and digest
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from realistic_base import LayerSink  # one gzip+sha256 sink for both bases' layers

DATA = Path(__file__).resolve().parent / "data" / "arm64-base"
DEBS_LOCK, WHEELS_LOCK, PINNED = DATA / "debs.lock", DATA / "wheels.lock", DATA / "PINNED"
GENERATION = "v1"           # bump when the shape changes: cached layouts are keyed by it and the locks
SUITE = "trixie"
DEBIAN = "http://deb.debian.org/debian"
PACKAGES = ("python3", "base-files", "libstdc++6", "libgomp1")
VLLM = "vllm==0.30.0"
OVERRIDES = ("nvidia-nccl-cu13==2.32.6",)   # torch 2.13.0 pins 2.29.7: no aarch64 file on the index
PYTHON_TAG = "3.13"
SITE = f"usr/local/lib/python{PYTHON_TAG}/dist-packages"
MANYLINUX = "2_39"
EPOCH = 1_767_225_600       # 2026-01-01T00:00:00Z: every mtime in the layers
TORCH_LAYER = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|triton|nvidia[-_].*|cuda[-_].*)$")
CLEANUP = ("usr/share/doc", "usr/share/man")
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


class BaseBuildError(Exception):
    """A step of the base build failed; the message names the step and what to do."""


def cache_root() -> Path:
    from patchkit.cache_root import default_cache_root

    return default_cache_root() / "arm64-base"


def _run(args: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise BaseBuildError(f"{what} failed (exit {proc.returncode}): {' '.join(args[:4])} ...\n{proc.stderr[-2000:]}")
    return proc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# ---- Debian packages: apt under a private configuration --------------------------------------------------

def _apt(root: Path) -> list[str]:
    for sub in ("state/lists/partial", "cache/archives/partial", "etc"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    (root / "etc" / "sources.list").write_text(f"deb {DEBIAN} {SUITE} main\n")
    opts = {"Dir::State": root / "state", "Dir::State::status": root / "status", "Dir::Cache": root / "cache",
            "Dir::Etc::SourceList": root / "etc" / "sources.list", "Dir::Etc::SourceParts": root / "etc" / "parts",
            "Dir::Etc::Preferences": root / "etc" / "preferences", "Dir::Etc::PreferencesParts": root / "etc" / "parts",
            "APT::Architecture": "arm64", "APT::Architectures::": "arm64", "Debug::NoLocking": "1",
            "APT::Sandbox::User": "root"}
    (root / "etc" / "parts").mkdir(exist_ok=True)
    return ["apt-get", *[a for k, v in opts.items() for a in ("-o", f"{k}={v}")]]


def fetch_debs(root: Path, wanted: list[str]) -> list[Path]:
    """apt resolves `wanted` (names or name=version) for arm64 against an empty status and downloads the
    closure; the .debs it holds afterwards, one per package."""
    apt = _apt(root)
    _run([*apt, "update"], "apt-get update (Debian trixie, arm64)")
    archives = root / "cache" / "archives"
    for old in archives.glob("*.deb"):
        old.unlink()
    _run([*apt, "install", "-y", "-d", "--no-install-recommends", *wanted], "apt-get install --download-only")
    return sorted(archives.glob("*.deb"))


def _deb_field(deb: Path, field: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), field], f"dpkg-deb -f {deb.name}").stdout.strip()


def lock_debs(root: Path) -> list[str]:
    lines = [f"{_deb_field(d, 'Package')}={_deb_field(d, 'Version')} sha256={_sha256(d)}" for d in fetch_debs(root, list(PACKAGES))]
    return sorted(lines)


def locked_debs(root: Path) -> list[Path]:
    """The lock's .debs, downloaded by apt at exactly the locked versions, each checked against its sha256."""
    locked = [line.split() for line in DEBS_LOCK.read_text().splitlines() if line.strip()]
    debs = fetch_debs(root, [spec for spec, _ in locked])
    by_name = {_deb_field(d, "Package"): d for d in debs}
    for spec, sha in locked:
        name = spec.split("=")[0]
        if name not in by_name:
            raise BaseBuildError(f"apt did not download {spec} (debs.lock): the archive no longer holds it; run `lock`")
        if _sha256(by_name[name]) != sha.removeprefix("sha256="):
            raise BaseBuildError(f"{by_name[name].name}: sha256 differs from debs.lock")
    extra = set(by_name) - {spec.split("=")[0] for spec, _ in locked}
    if extra:
        raise BaseBuildError(f"apt pulled packages debs.lock does not hold: {sorted(extra)}; run `lock`")
    return [by_name[spec.split("=")[0]] for spec, _ in locked]


# ---- wheels: uv resolves, pip downloads with hashes --------------------------------------------------------

def _platforms() -> list[str]:
    tags = [f"manylinux_2_{m}_aarch64" for m in range(17, int(MANYLINUX.split("_")[1]) + 1)]
    return [a for t in [*tags, "manylinux2014_aarch64", "linux_aarch64"] for a in ("--platform", t)]


def lock_wheels(root: Path) -> list[str]:
    work = root / "lock"
    work.mkdir(parents=True, exist_ok=True)
    (work / "want.in").write_text(VLLM + "\n")
    (work / "overrides.txt").write_text("\n".join(OVERRIDES) + "\n")
    _run(["uv", "pip", "compile", str(work / "want.in"), "--python-platform", f"aarch64-manylinux_{MANYLINUX}",
          "--python-version", PYTHON_TAG, "--override", str(work / "overrides.txt"), "--no-header", "--no-annotate",
          "--index-url", "https://pypi.org/simple", "-o", str(work / "resolved.txt")], "uv pip compile")
    pins = [line.strip() for line in (work / "resolved.txt").read_text().splitlines() if "==" in line]
    wheels = download_wheels(root, pins)
    by_name = {_wheel_name(w): w for w in wheels}
    return [f"{pin} --hash=sha256:{_sha256(by_name[_norm(pin.split('==')[0])])}" for pin in pins]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wheel_name(path: Path) -> str:
    return _norm(path.name.split("-")[0])


def download_wheels(root: Path, lines: list[str]) -> list[Path]:
    dest = root / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    req = root / "download.txt"
    req.write_text("\n".join(lines) + "\n")
    hashed = ["--require-hashes"] if all("--hash=" in line for line in lines) else []
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *_platforms(),
          "--python-version", PYTHON_TAG, "--implementation", "cp", "--index-url", "https://pypi.org/simple",
          *hashed, "-r", str(req), "-d", str(dest)], "pip download (aarch64 wheels)")
    names = {_norm(line.split("==")[0]) for line in lines}
    versions = {_norm(line.split("==")[0]): line.split("==")[1].split()[0] for line in lines}
    chosen = [w for w in sorted(dest.glob("*.whl")) if _wheel_name(w) in names and w.name.split("-")[1] == versions[_wheel_name(w)]]
    missing = names - {_wheel_name(w) for w in chosen}
    if missing:
        raise BaseBuildError(f"pip downloaded no wheel for {sorted(missing)}")
    return chosen


# ---- stages: a directory per layer -------------------------------------------------------------------------

def unpack_debs(debs: list[Path], stage: Path) -> None:
    stage.mkdir(parents=True)
    for deb in debs:
        _run(["dpkg-deb", "-x", str(deb), str(stage)], f"dpkg-deb -x {deb.name}")


def install_wheels(wheels: list[Path], stage: Path) -> None:
    """pypa/installer into the /usr/local scheme of the image's Python, as `pip install --no-compile` as
    root does on Debian (its dist-packages): RECORD with every file's sha256, INSTALLER (`installer`, the tool that wrote it), console scripts
    with the image's interpreter in their shebang."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    prefix = stage / "usr" / "local"
    scheme = {"purelib": str(prefix / SITE.removeprefix("usr/local/")), "platlib": str(prefix / SITE.removeprefix("usr/local/")),
              "headers": str(prefix / "include" / f"python{PYTHON_TAG}"), "scripts": str(prefix / "bin"),
              "data": str(prefix)}
    old = os.umask(0o022)
    try:
        for wheel in wheels:
            destination = SchemeDictionaryDestination(scheme, interpreter=f"/usr/bin/python{PYTHON_TAG}",
                                                      script_kind="posix", bytecode_optimization_levels=(),
                                                      overwrite_existing=True)  # pip replaces a file two wheels ship
            with WheelFile.open(wheel) as source:
                install(source, destination, {"INSTALLER": b"installer\n"})
    finally:
        os.umask(old)
    # installer writes RECORD paths relative to site-packages with the staging prefix resolved away already
    # (its destination is relative); nothing else of the stage names the build machine.


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _host_python() -> str | None:
    """A CPython of the image's minor version on this machine (its compiler writes the same bytecode
    format, checked against the image's own magic number below), else None."""
    found = shutil.which(f"python{PYTHON_TAG}")
    candidates = [found] if found else []
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{PYTHON_TAG}.*/bin/python{PYTHON_TAG}"))
    for candidate in candidates:
        if subprocess.run([candidate, "-c", ""], capture_output=True, check=False).returncode == 0:
            return candidate
    return None


def compile_vllm(rootfs_layers: list[Path], vllm_stage: Path, scratch: Path) -> None:
    """vLLM's bytecode, checked-hash .pyc files as pip writes under SOURCE_DATE_EPOCH, named by their
    image paths. By a host CPython of the image's minor version when there is one whose magic number is
    the image Python's (asked under qemu-user: ~20 s), else by the image's own Python under qemu-user
    in a scratch root merged from the stages (hard links): ~30 min for vLLM's 2,700 modules on two
    shared cores, which is why the host's is preferred."""
    from patchkit.smoke.image_rootfs import emulator, run_inside  # the proof's own runner

    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for layer in rootfs_layers:
        _run(["cp", "-al", f"{layer}/.", str(scratch)], "merging stages")
    magic = run_inside(scratch, ["/usr/bin/python3", "-c", "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"],
                       timeout=600, qemu=emulator())
    if magic.returncode != 0:
        raise BaseBuildError(f"the image's Python does not start:\n{magic.stderr[-2000:]}")
    host = _host_python()
    if host and _run([host, "-c", "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"],
                     "host python").stdout.strip() == magic.stdout.strip():
        shutil.rmtree(scratch)
        _run([host, "-m", "compileall", "-q", "-j", "1", "--invalidation-mode", "checked-hash", "-s", str(vllm_stage),
              "-p", "/", str(vllm_stage / SITE / "vllm")], f"compileall by {host}")
        return
    proc = run_inside(scratch, ["/usr/bin/python3", "-m", "compileall", "-q", "-j", "1",
                                "--invalidation-mode", "checked-hash", f"/{SITE}/vllm"], timeout=3600, qemu=emulator())
    if proc.returncode != 0:
        raise BaseBuildError(f"compileall in the image failed:\n{proc.stderr[-2000:]}")
    for pyc in (scratch / SITE / "vllm").rglob("*.pyc"):
        target = vllm_stage / pyc.relative_to(scratch)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pyc, target)
    shutil.rmtree(scratch)


def cleanup_stage(stage: Path) -> None:
    stage.mkdir(parents=True)
    for path in CLEANUP:
        head, _, tail = path.rpartition("/")
        (stage / head).mkdir(parents=True, exist_ok=True)
        (stage / head / f".wh.{tail}").touch()


# ---- deterministic layers ----------------------------------------------------------------------------------

def _walk(stage: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(stage):
        for name in dirnames + filenames:
            found.append(Path(dirpath) / name)
    return sorted(found, key=lambda p: p.relative_to(stage).parts)


def write_layer(stage: Path, blobs: Path, created_by: str) -> dict:
    """One stage directory as a layer: entries sorted, mtime EPOCH, owner 0:0, modes as on disk."""
    tmp = blobs / "layer.partial"
    with open(tmp, "wb") as out:
        sink = LayerSink(out)
        for path in _walk(stage):
            st = path.lstat()
            info = tarfile.TarInfo(path.relative_to(stage).as_posix())
            info.mtime, info.mode, info.uid, info.gid = EPOCH, st.st_mode & 0o7777, 0, 0
            if path.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
            elif path.is_dir():
                info.type = tarfile.DIRTYPE
            else:
                info.size = st.st_size
            sink.write(info.tobuf(tarfile.PAX_FORMAT))
            if info.isreg():
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        sink.write(chunk)
                if info.size % 512:
                    sink.write(bytes(512 - info.size % 512))
        sink.write(bytes(1024))
        digest, diff_id = sink.close()
    os.replace(tmp, blobs / digest[7:])
    return {"mediaType": DOCKER_LAYER, "digest": digest, "size": (blobs / digest[7:]).stat().st_size,
            "diff_id": diff_id, "uncompressed": sink.raw, "created_by": created_by}


def write_layout(dest: Path, layers: list[dict]) -> dict:
    blobs = dest / "blobs" / "sha256"

    def put(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / digest[7:]).write_bytes(data)
        return {"digest": digest, "size": len(data)}

    config = json.dumps({
        "architecture": "arm64", "variant": "v8", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"], "Cmd": ["python3"]},
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": layer["created_by"]} for layer in layers],
    }, sort_keys=True).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                           "config": {"mediaType": DOCKER_CONFIG, **put(config)},
                           "layers": [{k: layer[k] for k in ("mediaType", "digest", "size")} for layer in layers]},
                          sort_keys=True).encode()
    top = put(manifest)
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": DOCKER_MANIFEST, **top, "annotations": {"org.opencontainers.image.ref.name": "base"}}]}))
    return top


def lock_digest() -> str:
    return hashlib.sha256(DEBS_LOCK.read_bytes() + WHEELS_LOCK.read_bytes() + GENERATION.encode()).hexdigest()[:16]


def arm64_layout(root: Path | None = None) -> dict:
    """The base as an OCI layout (built once per lock, then reused): {"layout", "manifest", "layers"}."""
    root = root or cache_root()
    dest = root / f"layout-{GENERATION}-{lock_digest()}"
    summary = dest / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text()) | {"layout": str(dest)}
    debs = locked_debs(root / "apt")
    lines = [line for line in WHEELS_LOCK.read_text().splitlines() if line.strip()]
    wheels = download_wheels(root, lines)
    stages = root / "stages"
    key = stages / "lock"   # stages left by an interrupted build of the same locks are reused, each once done
    if not key.is_file() or key.read_text() != lock_digest():
        shutil.rmtree(stages, ignore_errors=True)
        stages.mkdir(parents=True)
        key.write_text(lock_digest())
    os_stage, torch_stage, vllm_stage, clean_stage = (stages / n for n in ("debian", "torch", "vllm", "cleanup"))

    def step(stage: Path, make) -> None:
        done = stage.with_name(stage.name + ".done")
        if not done.is_file():
            shutil.rmtree(stage, ignore_errors=True)
            make()
            done.touch()

    step(os_stage, lambda: unpack_debs(debs, os_stage))
    step(torch_stage, lambda: install_wheels([w for w in wheels if TORCH_LAYER.match(_wheel_name(w).replace("_", "-"))],
                                             _mkdir(torch_stage)))
    step(vllm_stage, lambda: install_wheels([w for w in wheels if not TORCH_LAYER.match(_wheel_name(w).replace("_", "-"))],
                                            _mkdir(vllm_stage)))
    pyc_done = stages / "bytecode.done"
    if not pyc_done.is_file():
        compile_vllm([os_stage, torch_stage, vllm_stage], vllm_stage, stages / "scratch")
        pyc_done.touch()
    shutil.rmtree(clean_stage, ignore_errors=True)
    cleanup_stage(clean_stage)
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "blobs" / "sha256").mkdir(parents=True)
    layers = [
        write_layer(os_stage, dest / "blobs" / "sha256", f"debian {SUITE} arm64: {' '.join(PACKAGES)} (dpkg-deb -x, debs.lock)"),
        write_layer(torch_stage, dest / "blobs" / "sha256", "pip install torch==2.13.0 (CUDA 13 aarch64 stack, wheels.lock)"),
        write_layer(vllm_stage, dest / "blobs" / "sha256", f"pip install {VLLM} (wheels.lock; vllm bytecode compiled in the image)"),
        write_layer(clean_stage, dest / "blobs" / "sha256", f"rm -rf {' '.join('/' + p for p in CLEANUP)}"),
    ]
    top = write_layout(dest, layers)
    shutil.rmtree(stages)
    result = {"manifest": top["digest"], "layers": layers, "python": PYTHON_TAG, "site": "/" + SITE}
    summary.write_text(json.dumps(result, indent=1))
    return result | {"layout": str(dest)}


def _cp313_file(root: Path, name: str, version: str) -> Path:
    """The index's cp313 aarch64 file of `name==version`, downloaded once by pip."""
    dest = root / "extras"
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *_platforms(),
          "--python-version", PYTHON_TAG, "--implementation", "cp", "--index-url", "https://pypi.org/simple",
          f"{name}=={version}", "-d", str(dest)], f"pip download {name}=={version} (cp313 aarch64)")
    found = [w for w in dest.glob("*.whl") if _wheel_name(w) == _norm(name) and w.name.split("-")[1] == version]
    if not found:
        raise BaseBuildError(f"pip found no cp313 aarch64 wheel of {name}=={version}")
    return found[0]


_ARM64_PIN = re.compile(r'^files\."linux/arm64" = \{ filename = "(?P<file>[^"]+)", sha256 = "(?P<sha>[0-9a-f]{64})" \}$')


def derived_images(source: Path, dest: Path, root: Path | None = None) -> Path:
    """`source` (images/) for this base's Python, everything else unchanged: [packages] paths in the
    python3.13 dist-packages directory, each extra wheel's linux/arm64 pin the cp313 file of the same
    release (the index's, its sha256 as downloaded), other platforms' pins dropped (no such image is
    built on this base). What this leaves unproven is said in this module's docstring."""
    root = root or cache_root()
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    for toml in sorted(dest.glob("*/image.toml")):
        out, version = [], None
        for line in toml.read_text().splitlines():
            line = line.replace("/python3.12/", f"/python{PYTHON_TAG}/")
            if line.startswith("version = "):
                version = line.split('"')[1]
            if line.startswith('files."linux/') and not line.startswith('files."linux/arm64"'):
                continue
            pin = _ARM64_PIN.match(line)
            if pin:
                name = pin["file"].split("-")[0]
                wheel = _cp313_file(root, name, version or pin["file"].split("-")[1])
                line = f'files."linux/arm64" = {{ filename = "{wheel.name}", sha256 = "{_sha256(wheel)}" }}'
            out.append(line)
        toml.write_text("\n".join(out) + "\n")
    return dest


def check_pinned(made: dict) -> None:
    pinned = PINNED.read_text().split()[0] if PINNED.is_file() else None
    if pinned != made["manifest"]:
        raise BaseBuildError(f"the arm64 base built as {made['manifest']}, tests/data/arm64-base/PINNED says {pinned}: "
                             "the build is not reproducible or the locks changed (then update PINNED)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["lock", "build"])
    parser.add_argument("--no-pin-check", action="store_true", help="build without comparing with PINNED")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            root = cache_root()
            DATA.mkdir(parents=True, exist_ok=True)
            DEBS_LOCK.write_text("\n".join(lock_debs(root / "apt")) + "\n")
            WHEELS_LOCK.write_text("\n".join(lock_wheels(root)) + "\n")
            print(f"wrote {DEBS_LOCK} and {WHEELS_LOCK}")
            return 0
        made = arm64_layout()
        if not args.no_pin_check:
            check_pinned(made)
        total = sum(layer["uncompressed"] for layer in made["layers"])
        print(f"{made['layout']}:base  linux/arm64, {len(made['layers'])} layers, {total / 2**30:.2f} GiB, manifest {made['manifest']}")
        return 0
    except BaseBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
