"""The in-image proof's parts that need no arm64 image: the root filesystem assembly (layers in order,
whiteouts and opaque markers applied, links resolved inside the root) against an independent reading
(tests/bases.flatten), and the in-image checks run by this machine's own Python on small trees through
the real import system. The proof of the built images themselves, under qemu-user on the realistic
arm64 base, is tests/image_proof_arm64.py (`nox -s arm64-base -- prove`: it takes the base's ~10 GB).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from bases import flatten, raw_layer, small_layout, tar_gz
from patchkit.oci.base import open_base
from patchkit.oci.media import Platform
from patchkit.smoke import in_image
from patchkit.smoke.image_rootfs import RootfsError, _inside, assemble, chain_id

ARM64 = Platform.parse("linux/arm64")


def _tree(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("->" + str(path.readlink())).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = None
    return out


def _layers(tmp_path: Path, layers: list[tuple[bytes, str]]) -> Path:
    layout = tmp_path / "layout"
    layout.mkdir()
    small_layout(layout, layers)
    return layout


def test_assembly_applies_whiteouts_as_an_independent_reading_does(tmp_path):
    layers = [
        tar_gz({"etc/os-release": b"ID=test\n", "etc/gone": b"x", "usr/lib/a/one.py": b"1", "usr/lib/a/two.py": b"2",
                "var/cache/big": b"cache", "usr/bin": None}),
        raw_layer([("etc/.wh.gone", b""), ("usr/lib/a/.wh..wh..opq", b""), ("usr/lib/a/three.py", b"3"),
                   ("var/.wh.cache", b""), ("usr/lib/a/one.py", b"replaced")]),
        raw_layer([("etc/motd", b"top\n")]),
    ]
    image = open_base(str(_layers(tmp_path, layers)), ARM64)
    made = assemble(image, tmp_path / "root", tmp_path / "cache")
    expected = {name: data for name, (data, info) in flatten([b for b, _ in layers]).items() if info.isreg()}
    got = {k: v for k, v in _tree(made.root).items() if v is not None}
    assert got == expected
    assert made.reused == 2 and not (made.root / "etc" / "gone").exists()
    # the second image on the same lower layers starts from the cached chain and does not change it
    chain = tmp_path / "cache" / chain_id(image.config["rootfs"]["diff_ids"][:2]).removeprefix("sha256:")
    before = _tree(chain)
    again = assemble(image, tmp_path / "root2", tmp_path / "cache")
    assert _tree(again.root) == _tree(made.root) and _tree(chain) == before
    # an image one layer taller (a build on this one) starts its own chain from the cached shorter one
    taller = [*layers, raw_layer([("etc/.wh.motd", b""), ("usr/lib/a/three.py", b"patched")])]
    (tmp_path / "taller").mkdir()
    small_layout(tmp_path / "taller", taller)
    top = assemble(open_base(str(tmp_path / "taller"), ARM64), tmp_path / "root3", tmp_path / "cache")
    expected = {name: data for name, (data, info) in flatten([b for b, _ in taller]).items() if info.isreg()}
    assert {k: v for k, v in _tree(top.root).items() if v is not None} == expected and top.reused == 3
    assert _tree(chain) == before and _tree(made.root)["usr/lib/a/three.py"] == b"3"


def test_a_link_to_an_absolute_path_stays_inside_the_root(tmp_path):
    outside = tmp_path / "host"
    outside.mkdir()
    layers = [tar_gz({"etc/placeholder": b""}, symlinks={"etc/escape": str(outside)}),
              raw_layer([("etc/escape/written", b"inside")])]
    made = assemble(open_base(str(_layers(tmp_path, layers)), ARM64), tmp_path / "root", tmp_path / "cache")
    assert not (outside / "written").exists()
    assert (made.root / str(outside).lstrip("/") / "written").read_bytes() == b"inside"


def test_a_link_loop_is_refused(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "loop").symlink_to("/a/loop")
    with pytest.raises(RootfsError, match="symbolic links"):
        _inside(root, "a/loop/x", follow_last=True)


def _package(site: Path, source: bytes) -> Path:
    pkg = site / "pkgunderproof"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "patched.py").write_bytes(source)
    return pkg / "patched.py"


def _check(site: Path, job: dict) -> list[dict]:
    """in_image's main in a fresh interpreter of this machine, `site` first on its path."""
    path = site / "job.json"
    path.write_text(json.dumps(job))
    src = Path(in_image.__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "patchkit.smoke.in_image", str(path)], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{site}:{src}", "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])["checks"]


PATCHED = b"VALUE = 'patched'\n"
STOCK = b"VALUE = 'stock'\n"


def _entry(path: Path, data: bytes = PATCHED) -> dict:
    return {"module": "pkgunderproof.patched", "path": str(path), "sha256": hashlib.sha256(data).hexdigest()}


def test_the_patched_module_resolving_to_its_file_passes(tmp_path):
    path = _package(tmp_path, PATCHED)
    checks = _check(tmp_path, {"patched": [_entry(path)], "imports": ["pkgunderproof.patched"]})
    assert all(c["ok"] for c in checks), checks


def test_an_unchecked_bytecode_stub_over_the_patched_module_fails_naming_it(tmp_path):
    path = _package(tmp_path, PATCHED)
    pyc = Path(importlib.util.cache_from_source(str(path)))
    pyc.parent.mkdir()
    code = compile(STOCK, str(path), "exec", dont_inherit=True)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little") + importlib.util.source_hash(STOCK)
                    + marshal.dumps(code))
    bad = [c for c in _check(tmp_path, {"patched": [_entry(path)]}) if not c["ok"]]
    assert [c["detail"] for c in bad] == [f"{pyc} is used instead of {path} and holds other code: a stub over the patched module"]


def test_a_package_shadowing_the_patched_module_fails_naming_both(tmp_path):
    path = _package(tmp_path, PATCHED)
    (path.parent / "patched").mkdir()
    (path.parent / "patched" / "__init__.py").write_bytes(STOCK)
    bad = [c["detail"] for c in _check(tmp_path, {"patched": [_entry(path)]}) if not c["ok"]]
    assert bad == [f"pkgunderproof.patched loads from {path.parent / 'patched' / '__init__.py'}, not the patched {path}: "
                   "something shadows it"]


def test_other_bytes_at_the_patched_path_fail_naming_the_file(tmp_path):
    path = _package(tmp_path, STOCK)
    bad = [c["detail"] for c in _check(tmp_path, {"patched": [_entry(path)]}) if not c["ok"]]
    assert bad == [f"{path}: sha256 {hashlib.sha256(STOCK).hexdigest()}, the series' is {hashlib.sha256(PATCHED).hexdigest()}"]


def test_a_missing_dependency_fails_the_import_naming_the_importing_file(tmp_path):
    path = _package(tmp_path, b"import dependency_the_image_lacks\n")
    bad = [c["detail"] for c in _check(tmp_path, {"imports": ["pkgunderproof.patched"]}) if not c["ok"]]
    assert len(bad) == 1 and str(path) in bad[0] and "No module named 'dependency_the_image_lacks'" in bad[0]


def _installed_wheel(site: Path, files: dict[str, bytes]) -> dict:
    """A wheel as pip lays it out: its files and a RECORD with each one's digest (the entry in_image reads)."""
    import base64

    rows = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(data)}")
    (site / "extrawheel-1.0.dist-info").mkdir()
    (site / "extrawheel-1.0.dist-info" / "RECORD").write_text("\n".join(rows) + "\n")
    return {"name": "extrawheel", "site": str(site), "dist_info": "extrawheel-1.0.dist-info"}


def test_a_native_module_of_another_python_fails_naming_it_not_as_a_missing_module(tmp_path):
    """HAND-WRITTEN wheel (the bytes are not loaded): `_C.cpython-312-*.so` ends in `.so`, a suffix every
    CPython loads, yet it is another Python's module. Under qemu the proof named it only as an import that
    failed (ModuleNotFoundError of `extrawheel._C.cpython-312-aarch64-linux-gnu`); the check names the file
    and the Python it is not for, and imports nothing of it."""
    other = "cpython-312" if sys.implementation.cache_tag != "cpython-312" else "cpython-311"
    so = f"extrawheel/_C.{other}-aarch64-linux-gnu.so"
    entry = _installed_wheel(tmp_path, {"extrawheel/__init__.py": b"", so: b"\x7fELF"})
    bad = [c["detail"] for c in _check(tmp_path, {"wheels": [entry]}) if not c["ok"]]
    assert len(bad) == 1 and bad[0].startswith(f"{tmp_path / so}: a native module this Python"), bad
    assert bad[0].endswith("built for another Python"), bad


def test_an_unlabelled_image_with_no_variant_named_is_refused_before_anything_runs(tmp_path):
    """`patchkit smoke-image LAYOUT` with no VARIANT proves what the image's dev.patchkit.image label serves;
    a base carries none, so there is nothing to choose from: exit 2 naming the layout, no root assembled."""
    from click.testing import CliRunner

    from patchkit.cli.main import main as cli

    blob, diff_id = tar_gz({"usr/bin/python3": b"#!"})
    small_layout(tmp_path / "base", [(blob, diff_id)])
    work = tmp_path / "work"
    result = CliRunner().invoke(cli, ["smoke-image", str(tmp_path / "base"), "--workdir", str(work), "--json"],
                                env={"COLUMNS": "10000"})
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "error" and "no dev.patchkit.image label" in error["message"], error
    assert str(tmp_path / "base") in error["message"]
    assert not any(work.glob("rootfs-*"))


def test_the_negative_cases_tampering_gives_a_readable_image_with_the_edit_in_its_top_layer(tmp_path):
    """tests/image_tamper.py (what the proof's negative cases under qemu break images with:
    tests/image_proof_arm64.py, outside this suite) writes a layout patchkit opens and assembles, with the edit
    in its top layer and the layers below untouched: so those cases fail for what they plant, not for a
    layout the tamperer broke (its index once lacked its mediaType and every case died on that)."""
    from image_tamper import delete_in_base, move_file, tampered

    layers = [tar_gz({"usr/lib/python3.13/dist-packages/dep/__init__.py": b"x = 1\n"}),
              tar_gz({"usr/lib/python3.13/dist-packages/vllm/a.py": b"patched\n"})]
    layout = _layers(tmp_path, layers)
    moved = tampered(layout, tmp_path / "moved", move_file("usr/lib/python3.13/dist-packages/vllm/a.py",
                                                           "usr/lib/python3.12/dist-packages/vllm/a.py"))
    root = assemble(open_base(str(moved), ARM64), tmp_path / "root", tmp_path / "cache").root
    assert (root / "usr/lib/python3.12/dist-packages/vllm/a.py").read_bytes() == b"patched\n"
    assert not (root / "usr/lib/python3.13/dist-packages/vllm/a.py").exists()
    assert (root / "usr/lib/python3.13/dist-packages/dep/__init__.py").read_bytes() == b"x = 1\n"
    gone = tampered(layout, tmp_path / "gone", delete_in_base("usr/lib/python3.13/dist-packages/dep"))
    root = assemble(open_base(str(gone), ARM64), tmp_path / "root2", tmp_path / "cache").root
    assert not (root / "usr/lib/python3.13/dist-packages/dep").exists()
    assert (root / "usr/lib/python3.13/dist-packages/vllm/a.py").read_bytes() == b"patched\n"
