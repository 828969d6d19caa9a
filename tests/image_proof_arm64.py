"""The in-image proof of every image, built by `patchkit build` on the realistic arm64 base
(tests/arm64_base.py) and run under qemu-user here: the stock base fails the CPU load smoke where the
tree-level smoke (tests/test_smoke_cpu.py) shows stock fails, each image passes, and broken images fail
naming the file. Not collected by `nox -s tests` (the base is ~10 GB and each proof runs the image's torch
under emulation): `nox -s arm64-base -- prove` runs this file, after the base is built.

The images are built from images/ rewritten for this base's Python 3.13 (arm64_base.derived_images: the
package paths and the extra wheels' cp313 files; patches, series, env and variants unchanged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arm64_base import SITE, _cp313_file, _run, arm64_layout, cache_root, derived_images
from image_tamper import bytecode_stub, delete_in_base, move_file, swap_wheel, tampered, top_entries
from patchkit.variants.definitions import load_variants

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "images"
MAIN = "glm53-flash-nvfp4-4p67"   # the main command's image: the negative cases break builds of it


def _patchkit(*args: str, timeout: int = 5400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "patchkit", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@pytest.fixture(scope="session")
def base() -> str:
    return f"{arm64_layout()['layout']}:base"


@pytest.fixture(scope="session")
def images_dir(tmp_path_factory) -> Path:
    return derived_images(IMAGES, tmp_path_factory.mktemp("images") / "images")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("proof")


@pytest.fixture(scope="session")
def built(base, images_dir, tmp_path_factory):
    """Each image built once, on demand, by the route users take: its layout and build summary."""
    done: dict[str, tuple[Path, dict]] = {}

    def build(name: str) -> tuple[Path, dict]:
        if name not in done:
            out = tmp_path_factory.mktemp(f"build-{name}")
            summary = out / "summary.json"
            proc = _patchkit("build", name, "--base", base, "--images", str(images_dir), "--output", str(out / "oci"),
                             "--result-json", str(summary), "--revision", "test")
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[name] = (out / "oci", json.loads(summary.read_text()))
        return done[name]

    return build


def _variants_of(images_dir: Path, image: str) -> list[str]:
    return [v.name for v in load_variants(images_dir).values() if v.image == image]


def prove(layout: str, variants: list[str], images_dir: Path, workdir: Path) -> tuple[int, dict]:
    receipt = workdir / f"receipt-{abs(hash((layout, tuple(variants))))}.json"
    proc = _patchkit("smoke-image", layout, *variants, "--images", str(images_dir), "--workdir", str(workdir),
                     "--modelopt-python", sys.executable, "--receipt", str(receipt))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, json.loads(receipt.read_text())


def test_the_stock_base_fails_where_the_tree_level_smoke_does(base, images_dir, workdir):
    """The base itself is the stock image: no patch, so the smoke shows what the series fixes."""
    every = sorted(load_variants(images_dir))
    code, receipt = prove(base, every, images_dir, workdir)
    reports = {r["variant"]: r for r in receipt["smoke"]}
    assert code == 1 and receipt["patchkit_image"] is None
    assert all(c["ok"] for c in receipt["checks"]), [c for c in receipt["checks"] if not c["ok"]]  # vllm imports
    assert {n for n, r in reports.items() if r["ok"]} == {"nvidia-nvfp4", "redhat", "libertai"}
    assert reports["lab"]["problems"] == [
        "model.layers.45.mlp.experts: resolves to None: expected MXFP8; weights stored MXFP8 cannot load as None"]
    p4 = "\n".join(reports["4p67"]["problems"])
    assert "model.layers.45.mlp.experts: resolves to None: expected W4A16_NVFP4" in p4
    assert "language_model.model.layers.0.self_attn.in_proj_qkvbfg_a: resolves to None: expected MXFP8" in p4


@pytest.mark.parametrize("image", sorted(p.name for p in IMAGES.iterdir() if (p / "image.toml").is_file()))
def test_each_image_is_proved_in_its_own_python(image, built, images_dir, workdir):
    layout, summary = built(image)
    code, receipt = prove(str(layout), _variants_of(images_dir, image), images_dir, workdir)
    assert code == 0, receipt["problems"]
    assert receipt["digest"] == summary["digest"] and receipt["patchkit_image"] == image
    assert receipt["python"].startswith("3.13") and receipt["smoke"] and all(r["ok"] for r in receipt["smoke"])
    names = {c["name"] for c in receipt["checks"]}
    assert {"import vllm", *(f"status {p}" for p in receipt["series"])} <= names
    if image in (MAIN, "glm53-flash-nvfp4-lab"):   # the images that carry the instanttensor wheel
        assert any(n.startswith("import instanttensor.") for n in names), names   # its native module


def _python313() -> str:
    """A CPython 3.13 here that runs (the base's minor: its bytecode is the only kind the image's Python
    loads). The first python3.13 on PATH may be a pyenv shim that exits 127 where 3.13 is not pyenv's
    chosen version, so each candidate is asked its version."""
    import glob
    import shutil

    candidates = [shutil.which("python3.13"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")))]
    for python in filter(None, candidates):
        asked = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2] == (3, 13))"],
                               capture_output=True, text=True, timeout=60, check=False)
        if asked.stdout.strip() == "True":
            return python
    raise AssertionError(f"a CPython 3.13 is needed to write the stub (pyenv install 3.13, or Debian's python3.13); "
                         f"none of {candidates} runs as one")


def _broken(built, tmp_path, edit) -> str:
    layout, _ = built(MAIN)
    return str(tampered(layout, tmp_path / "broken", edit))


def _patched_paths(built) -> list[str]:
    layout, _ = built(MAIN)
    _, _, entries = top_entries(layout)
    return sorted(p for p, e in entries.items() if e.kind == "file" and p.startswith(f"{SITE}/vllm/") and p.endswith(".py"))


def test_a_patched_file_at_the_wrong_path_fails_naming_it(built, images_dir, workdir, tmp_path):
    victim = _patched_paths(built)[0]
    wrong = victim.replace("python3.13/", "python3.12/")   # the real base's directory: a build with the wrong site
    code, receipt = prove(_broken(built, tmp_path, move_file(victim, wrong)), _variants_of(images_dir, MAIN), images_dir, workdir)
    assert code == 1
    assert any(p.startswith(f"/{victim}: ") for p in receipt["problems"]), receipt["problems"]
    assert any(p.startswith("patch ") and f"/{victim}" in p for p in receipt["problems"]), receipt["problems"]


def _base_file(built, path: str, tmp_path: Path) -> bytes:
    """The base's own bytes of `path`: the proof's cached chain of the image's lower layers (the base)."""
    from patchkit.cache_root import default_cache_root
    from patchkit.oci.base import open_base
    from patchkit.oci.media import Platform
    from patchkit.smoke.image_rootfs import assemble, chain_id

    layout, _ = built(MAIN)
    image = open_base(str(layout), Platform.parse("linux/arm64"))
    cache = default_cache_root() / "image-rootfs"
    chain = cache / chain_id(image.config["rootfs"]["diff_ids"][:-1]).removeprefix("sha256:")
    if not (chain / ".complete").is_file():
        assemble(image, tmp_path / "assembled", cache)
    return (chain / path).read_bytes()


def test_a_bytecode_stub_over_a_patched_module_fails_naming_it(built, images_dir, workdir, tmp_path):
    victim = _patched_paths(built)[0]
    stock = _base_file(built, victim, tmp_path)
    assert stock != dict(top_entries(built(MAIN)[0])[2])[victim].data
    edit = bytecode_stub(victim, stock, _python313())
    code, receipt = prove(_broken(built, tmp_path, edit), _variants_of(images_dir, MAIN), images_dir, workdir)
    head, _, tail = victim.rpartition("/")
    pyc = f"/{head}/__pycache__/{tail[:-3]}.cpython-313.pyc"
    assert code == 1
    assert f"{pyc} is used instead of /{victim} and holds other code: a stub over the patched module" in receipt["problems"]


def test_an_extra_wheel_for_another_python_fails_naming_its_native_module(built, images_dir, workdir, tmp_path):
    dest = cache_root() / "extras-cp312"
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--platform",
          "manylinux_2_28_aarch64", "--python-version", "3.12", "--implementation", "cp", "instanttensor==0.2.2",
          "-d", str(dest)], "pip download instanttensor (cp312)")
    wheel = next(dest.glob("instanttensor-0.2.2-cp312-*.whl"))
    assert _cp313_file(cache_root(), "instanttensor", "0.2.2").name != wheel.name
    edit = swap_wheel("instanttensor", "instanttensor-0.2.2.dist-info", SITE, wheel)
    code, receipt = prove(_broken(built, tmp_path, edit), _variants_of(images_dir, MAIN), images_dir, workdir)
    assert code == 1
    wrong = [p for p in receipt["problems"] if "built for another Python" in p]
    assert wrong and all(p.startswith(f"/{SITE}/instanttensor/") and ".cpython-312-" in p.split(":")[0] for p in wrong), receipt["problems"]


def test_an_image_missing_a_dependency_fails_naming_the_importing_file(built, images_dir, workdir, tmp_path):
    edit = delete_in_base(f"{SITE}/transformers")
    code, receipt = prove(_broken(built, tmp_path, edit), _variants_of(images_dir, MAIN), images_dir, workdir)
    assert code == 1
    missing = [p for p in receipt["problems"] if "No module named 'transformers'" in p]
    assert missing and all(f'File "/{SITE}/' in p for p in missing), receipt["problems"]
