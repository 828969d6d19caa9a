"""An image's pinned extra wheels (images.extras): installed into the layer byte for byte as pip installs
them, refused when the index or the bytes are not what the definition pins, on every build route.

Real artifacts from the package index, fetched through patchkit's own verified cache into the user
cache (downloaded once; marked `network`): instanttensor 0.2.2's cp312 manylinux aarch64 wheel, the one
the lab image pins (its compiled extension is only read, never run), and wheel 0.48.0's py3-none-any
wheel, a real wheel with a console script (instanttensor has none). pip is the reference: `pip install
--target` (and `--prefix`, for where scripts are recorded) of the same files, `--no-compile` because
images ship no bytecode (images.build), umask 022. The one wheel made here is a real one tampered with.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from engines import client, podman, podman_service  # noqa: F401
from patchkit.checkpoint.serve import serve_command
from patchkit.errors import PatchkitError
from patchkit.images.build import build
from patchkit.images.definitions import WheelPin, load_image, load_images
from patchkit.images.engine import render_context
from patchkit.images.extras import (
    DIR_MODE,
    InstalledTwice,
    LoaderNotCarried,
    Scheme,
    UnknownInstallScheme,
    WheelPinMismatch,
    check_load_format,
    extra_layer,
    fetch,
    install,
)
from patchkit.patching.patchset import load_patchset
from patchkit.sources.verified_wheel import BadWheel
from patchkit.variants.definitions import find_variant, load_variants
from registry import flatten, make_base, push_base, registry_server, vllm_sdist  # noqa: F401
from test_sources import FakeIndex

REPO = Path(__file__).resolve().parents[1]
LAB = "glm53-flash-nvfp4-lab"
SITE = "/usr/local/lib/python3.12/dist-packages"
PLATFORM = "linux/arm64"
# wheel 0.48.0 as https://pypi.org/simple/wheel/ lists it (read with patchkit.sources.index.project_files)
WHEEL_PIN = WheelPin("wheel", "0.48.0", {PLATFORM: ("wheel-0.48.0-py3-none-any.whl",
                                                    "3217dcc807155e45db462d7ef2431f5ddda0d7273b700d05a67b271ceb1287ab")},
                     why="a real wheel with a console script")
PIP_TARGET = ["--no-deps", "--no-compile", "--no-index", "--only-binary=:all:", "--platform", "manylinux_2_28_aarch64",
              "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]


@pytest.fixture(scope="module")
def patchset():
    return load_patchset(REPO / "patches")


@pytest.fixture(scope="module")
def lab(patchset):
    return load_image(REPO / "images", LAB, patchset)


@pytest.fixture(scope="module")
def wheels(lab, tmp_path_factory):
    """The two real wheels in one folder pip can read (--find-links), fetched by patchkit."""
    folder = tmp_path_factory.mktemp("wheels")
    for pin in (lab.wheels["instanttensor"], WHEEL_PIN):
        shutil.copy(fetch(pin, PLATFORM), folder)
    return folder


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], check=True, capture_output=True,
                   preexec_fn=lambda: os.umask(0o022))


def tree(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """path under root -> (bytes, or None for a directory; permission bits)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mode & 0o7777)
            for p in sorted(root.rglob("*"))}


def layer_tree(installed, root: str) -> dict[str, tuple[bytes | None, int]]:
    out = {}
    for wheel in installed:
        out.update({d.removeprefix(root + "/"): (None, DIR_MODE) for d in wheel.dirs})
        out.update({f.path.removeprefix(root + "/"): (f.data, f.mode) for f in wheel.files
                    if f.path.startswith(root + "/")})
    return out


def record(data: bytes) -> set[str]:
    return set(data.decode().splitlines())


def run_script(script: Path, site: Path) -> str:
    """A console script run by this machine's Python (its shebang is the image's), importing from `site`."""
    proc = subprocess.run([sys.executable, str(script), "version"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    return proc.stdout.strip()


@pytest.mark.network
def test_the_layer_holds_what_pip_install_target_writes(lab, wheels, tmp_path):
    scheme = Scheme.of(lab)
    assert (scheme.site, scheme.scripts, scheme.interpreter) == (SITE, "/usr/local/bin", "/usr/bin/python3.12")
    installed = [install(wheels / pin.files[PLATFORM][0], pin, PLATFORM, scheme)
                 for pin in (lab.wheels["instanttensor"], WHEEL_PIN)]
    target = tmp_path / "target"
    pip("--target", str(target), "--find-links", str(wheels), *PIP_TARGET, "instanttensor==0.2.2", "wheel==0.48.0")
    theirs, ours = tree(target), layer_tree(installed, SITE)

    # pip --target puts scripts in <target>/bin; the image's are in /usr/local/bin, beside its site-packages
    their_bin = {k: v for k, v in theirs.items() if k == "bin" or k.startswith("bin/")}
    our_bin = {f.path: (f.data, f.mode) for w in installed for f in w.files if not f.path.startswith(SITE + "/")}
    assert set(our_bin) == {"/usr/local/bin/wheel"} and set(their_bin) == {"bin", "bin/wheel"}
    theirs = {k: v for k, v in theirs.items() if k not in their_bin}
    assert set(ours) == set(theirs), "the same files and directories"
    assert {k: v[1] for k, v in ours.items()} == {k: v[1] for k, v in theirs.items()}, "the same modes"
    assert ours["instanttensor/_C.cpython-312-aarch64-linux-gnu.so"][1] == 0o755  # executable in the zip

    # the same bytes, but for INSTALLER (the tool's name) and RECORD, which lists it and the script
    differ = {k for k in ours if ours[k][0] != theirs[k][0]}
    assert differ == {f"{d}/{n}" for d in ("instanttensor-0.2.2.dist-info", "wheel-0.48.0.dist-info")
                      for n in ("INSTALLER", "RECORD")}
    assert {theirs[k][0] for k in differ if k.endswith("INSTALLER")} == {b"pip\n"}
    assert {ours[k][0] for k in differ if k.endswith("INSTALLER")} == {b"patchkit\n"}
    for dist_info in ("instanttensor-0.2.2.dist-info", "wheel-0.48.0.dist-info"):
        ours_rows, their_rows = record(ours[f"{dist_info}/RECORD"][0]), record(theirs[f"{dist_info}/RECORD"][0])
        installer_row = next(r for r in ours_rows if r.startswith(f"{dist_info}/INSTALLER,"))
        assert installer_row == f"{dist_info}/INSTALLER,sha256=3z9hdB5rPecHAR7exfqnDjg6fO0RSGMnXDttdAwpd44,9"
        same = {r for r in their_rows if not r.startswith((f"{dist_info}/INSTALLER,", "../../bin/"))}
        assert ours_rows - same == {installer_row} | {r for r in ours_rows if r.startswith("../../../bin/")}
        assert same <= ours_rows

    # the console script: the entry point's, with the image's interpreter; pip --target records it two
    # folders up (its home scheme's lib/python), the image three (lib/python3.12/dist-packages)
    script, mode = our_bin["/usr/local/bin/wheel"]
    assert mode == their_bin["bin/wheel"][1] == 0o755
    assert script.startswith(b"#!/usr/bin/python3.12\n") and b"from wheel._commands import main" in script
    digest = hashlib.sha256(script).digest()
    row = f"../../../bin/wheel,sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(script)}"
    assert row in record(ours["wheel-0.48.0.dist-info/RECORD"][0])
    assert any(r.startswith("../../bin/wheel,") for r in record(theirs["wheel-0.48.0.dist-info/RECORD"][0]))
    # the launchers' text differs (installer's template, pip's vendored distlib's): both run the same entry point
    unpacked = tmp_path / "layer"
    for path, (data, _mode) in {**{SITE + "/" + k: v for k, v in ours.items()}, **our_bin}.items():
        if data is not None:
            (unpacked / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (unpacked / path.lstrip("/")).write_bytes(data)
    assert run_script(unpacked / "usr/local/bin/wheel", unpacked / SITE.lstrip("/")) == \
           run_script(target / "bin" / "wheel", target) == "wheel 0.48.0"


@pytest.mark.network
def test_pip_install_prefix_records_the_script_where_the_image_does(lab, wheels, tmp_path):
    """pip --prefix (the pure wheel: pip takes no platform options there) lays out <prefix>/lib/pythonX.Y/
    site-packages and <prefix>/bin as the image does: its RECORD is ours but for INSTALLER and the script's
    hash (the interpreter in the shebang, the launcher's template)."""
    (installed,) = [install(wheels / WHEEL_PIN.files[PLATFORM][0], WHEEL_PIN, PLATFORM, Scheme.of(lab))]
    prefix = tmp_path / "prefix"
    pip("--prefix", str(prefix), "--no-deps", "--no-compile", "--no-index", "--find-links", str(wheels), "wheel==0.48.0")
    (theirs,) = prefix.glob("lib/python3*/site-packages/wheel-0.48.0.dist-info/RECORD")
    ours = next(f.data for f in installed.files if f.path.endswith("wheel-0.48.0.dist-info/RECORD"))

    def strip(rows):
        return {r.split(",")[0] if r.startswith(("../../../bin/", "wheel-0.48.0.dist-info/INSTALLER,")) else r
                for r in rows}

    assert strip(record(ours)) == strip(record(theirs.read_bytes()))
    assert "../../../bin/wheel" in strip(record(ours))


@pytest.mark.network
def test_a_sha256_the_index_does_not_list_is_refused_and_nothing_is_built(base, tmp_path):
    images = _images_copy(tmp_path, "94dabc13981fe89982a807572593c4f697a3a3bae02fa13cb469960885901247", "0" * 64)
    proc = _cli_build(images, base, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "lists instanttensor-0.2.2-cp312-cp312-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl with sha256 " \
           "94dabc13981fe89982a807572593c4f697a3a3bae02fa13cb469960885901247, the image definition pins 000" in \
           " ".join(proc.stdout.split() + proc.stderr.split())
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.network
def test_a_tampered_wheel_is_refused_by_its_record(lab, wheels, base, tmp_path):
    real = wheels / lab.wheels["instanttensor"].files[PLATFORM][0]
    tampered = tmp_path / real.name
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(tampered, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, data + b"import os\n" if info.filename == "instanttensor/__init__.py" else data)
    sha = hashlib.sha256(tampered.read_bytes()).hexdigest()
    pin = WheelPin("instanttensor", "0.2.2", {PLATFORM: (real.name, sha)}, why="tampered")
    with pytest.raises(BadWheel) as refused:
        install(tampered, pin, PLATFORM, Scheme.of(lab))
    assert (refused.value.problem, refused.value.member) == ("hash", "instanttensor/__init__.py")
    with pytest.raises(WheelPinMismatch, match=f"its bytes hash to sha256 {sha}") as mismatch:
        install(tampered, lab.wheels["instanttensor"], PLATFORM, Scheme.of(lab))
    assert (mismatch.value.filename, mismatch.value.found) == (tampered.name, sha)
    assert mismatch.value.pinned == lab.wheels["instanttensor"].files[PLATFORM][1]

    # the same through a build: an index serving it under the sha256 a definition pins; nothing is built
    index = FakeIndex()
    try:
        index.add("instanttensor", real.name, tampered.read_bytes())
        images = _images_copy(tmp_path, "94dabc13981fe89982a807572593c4f697a3a3bae02fa13cb469960885901247", sha)
        proc = _cli_build(images, base, tmp_path, PATCHKIT_INDEX_URL=index.url, PATCHKIT_CACHE_DIR=str(tmp_path / "cache"))
    finally:
        index.server.shutdown()
    assert proc.returncode == 2, proc.stderr
    assert "member 'instanttensor/__init__.py': RECORD says sha256=" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def _images_copy(tmp_path: Path, old: str, new: str) -> Path:
    images = tmp_path / "images"
    shutil.copytree(REPO / "images", images)
    toml = images / LAB / "image.toml"
    assert toml.read_text().count(old) == 1
    toml.write_text(toml.read_text().replace(old, new))
    return images


def _cli_build(images: Path, base: dict, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`patchkit build` of the lab image into an OCI layout, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "patchkit", "build", LAB, "--base", f"{base['layout']}:base",
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATCHKIT_IMAGES": str(images), **env})


def test_a_loader_the_image_lacks_and_a_site_pip_cannot_place_are_refused_with_their_kind(patchset):
    plain = load_image(REPO / "images", "glm53-flash-nvfp4", patchset)
    with pytest.raises(LoaderNotCarried) as lacks:
        check_load_format(plain, "instanttensor")
    assert (lacks.value.load_format, lacks.value.package, lacks.value.image, lacks.value.carried) == \
           ("instanttensor", "instanttensor", "glm53-flash-nvfp4", ())
    check_load_format(plain, None)  # the variant's own loader needs nothing
    vllm = plain.packages["vllm"]
    elsewhere = dataclasses.replace(plain, packages={"vllm": dataclasses.replace(vllm, path="/opt/vllm")})
    with pytest.raises(UnknownInstallScheme) as site:
        Scheme.of(elsewhere)
    assert (site.value.image, site.value.site) == ("glm53-flash-nvfp4", "/opt")


def test_two_pinned_wheels_installing_one_file_are_refused(lab):
    twice = dataclasses.replace(lab, wheels={"a": WHEEL_PIN, "b": WHEEL_PIN})
    with pytest.raises(InstalledTwice) as both:
        extra_layer(twice)
    assert (both.value.image, both.value.first, both.value.second) == (LAB, "wheel", "wheel")
    assert both.value.path.startswith((SITE + "/", "/usr/local/bin/"))


def test_children_inherit_the_wheels_and_bad_pins_are_refused(patchset, tmp_path):
    images = load_images(REPO / "images", patchset)
    assert images["glm53-flash-nvfp4-4p67"].wheels == images[LAB].wheels
    assert set(images[LAB].wheels) == {"instanttensor"} and not images["glm53-flash-nvfp4"].wheels
    assert images[LAB].wheels["instanttensor"].requirement == (
        "instanttensor==0.2.2 --hash=sha256:94dabc13981fe89982a807572593c4f697a3a3bae02fa13cb469960885901247 "
        "--hash=sha256:382954f2329fc085ff298ce0205a06ce0fc8c67a704fc032613931a5ae9018d5")
    arm = "instanttensor-0.2.2-cp312-cp312-manylinux_2_26_aarch64.manylinux_2_28_aarch64.whl"
    for old, new, message in [
        (arm, arm.replace("aarch64", "x86_64"), "is for manylinux_2_26_x86_64, manylinux_2_28_x86_64, not linux aarch64"),
        (arm, arm.replace("cp312-cp312", "cp313-cp313"), "does not install on the image's Python 3.12"),
        (arm, arm.replace("0.2.2", "0.2.1"), "is instanttensor 0.2.1's, not instanttensor 0.2.2's"),
        ('files."linux/arm64"', 'files."linux/riscv64"', "no file for the image's platform linux/arm64"),
        ("[wheels.instanttensor]", "[wheels.InstantTensor]", "write the project name as the index does"),
    ]:
        copy = _images_copy(tmp_path / message[:12].replace(" ", "_").replace("'", ""), old, new)
        with pytest.raises(PatchkitError, match=message):
            load_images(copy, patchset)


# -- every build route -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """vLLM 0.33.0's files at the images' dist-packages path, as an OCI layout (tests/bases.py)."""
    return make_base(vllm_sdist(), tmp_path_factory.mktemp("base") / "layout")


def expected_files(lab) -> dict[str, tuple[bytes, int]]:
    return {f.path.lstrip("/"): (f.data, f.mode) for f in extra_layer(lab).files}


@pytest.mark.network
def test_the_daemonless_layout_carries_the_wheel(lab, base, tmp_path):
    result = build(LAB, base=f"{base['layout']}:base", output=tmp_path / "out", cache=tmp_path / "cache",
                   revision="0" * 40, source_url="https://example.invalid/patchkit", epoch=1_700_000_000)
    out = tmp_path / "out"
    manifest = json.loads((out / "blobs/sha256" / result.built.digest[7:]).read_bytes())
    blobs = [(out / "blobs/sha256" / layer["digest"][7:]).read_bytes() for layer in manifest["layers"]]
    fs, top = flatten(blobs), flatten(blobs[-1:])
    expected = expected_files(lab)
    assert len(expected) == 11 and all(p in top for p in expected), "in the new layer itself"
    for path, (data, mode) in expected.items():
        assert fs[path][0] == data and fs[path][1].mode == mode and (fs[path][1].uid, fs[path][1].gid) == (0, 0)
    for folder in ("instanttensor", "instanttensor-0.2.2.dist-info", "instanttensor-0.2.2.dist-info/licenses"):
        assert top[f"{SITE.lstrip('/')}/{folder}"][1].isdir() and top[f"{SITE.lstrip('/')}/{folder}"][1].mode == 0o755
    assert not [p for p in top if "__pycache__/instanttensor" in p or (p.endswith(".pyc") and "instanttensor" in p)]


@pytest.mark.network
@pytest.mark.registry
def test_the_engine_routes_carry_the_same_files(lab, base, registry_server, client, podman, tmp_path):
    """--load through podman (the base in the engine: layer.tar), and the --engine route's rendered context."""
    ref = push_base(base, registry_server.host, "vllm/extras-base")
    expected = expected_files(lab)
    dry = build(LAB, base=ref, dry_run=True, cache=tmp_path / "cache")
    context = render_context(dry.built, tmp_path / "context")
    for path, (data, mode) in expected.items():
        copied = context / "rootfs" / path
        assert copied.read_bytes() == data and copied.stat().st_mode & 0o7777 == mode
    assert (context / "rootfs" / SITE.lstrip("/") / "instanttensor").stat().st_mode & 0o7777 == 0o755

    client.api.pull(ref.split(":base@")[0], tag=base["index"], platform="linux/arm64")
    loaded = build(LAB, base=ref, load=True, engine_url=podman, cache=tmp_path / "cache").built
    assert loaded.image_id
    container = client.containers.create(loaded.image_id, command=["/x"], entrypoint=[])
    try:
        chunks, _ = container.get_archive(SITE)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            found = {f"{os.path.dirname(SITE).lstrip('/')}/{i.name}": (tar.extractfile(i).read(), i.mode & 0o7777)
                     for i in tar if i.isreg() and "instanttensor" in i.name}
    finally:
        container.remove(force=True)
    assert found == expected


@pytest.mark.network
def test_the_wheel_path_names_the_images_extra_wheels_for_pip(wheels, tmp_path):
    """The patched vLLM wheel is vLLM alone: `patchkit wheel build` of an image's series says which pinned
    wheels its image carries beside it, and how pip installs them (the pinned release's x86_64 wheel, cached)."""
    proc = subprocess.run([sys.executable, "-m", "patchkit", "wheel", "build", "--series", LAB, "--platform", "x86_64",
                           "--output", str(tmp_path / "out"), "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    (summary,) = json.loads(proc.stdout)
    requirement = ("instanttensor==0.2.2 --hash=sha256:94dabc13981fe89982a807572593c4f697a3a3bae02fa13cb469960885901247 "
                   "--hash=sha256:382954f2329fc085ff298ce0205a06ce0fc8c67a704fc032613931a5ae9018d5")
    assert summary["series"] == LAB and summary["extras"] == [requirement]
    said = " ".join(proc.stderr.split())
    assert "its image also carries instanttensor==0.2.2: `pip install instanttensor==0.2.2`" in said
    assert f"`{requirement}` in a requirements file for `pip install --require-hashes -r`" in said
    # the line, as pip reads it, installs exactly the pinned file
    (tmp_path / "requirements.txt").write_text(requirement + "\n")
    pip("--target", str(tmp_path / "pinned"), "--find-links", str(wheels), *PIP_TARGET, "--require-hashes",
        "-r", str(tmp_path / "requirements.txt"))
    assert (tmp_path / "pinned" / "instanttensor-0.2.2.dist-info" / "RECORD").is_file()


# -- the serve contract: `serve-args VARIANT --load-format instanttensor` --------------------------------


def serve_args(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patchkit", "serve-args", *args, "--json"], capture_output=True,
                          text=True, timeout=120)


def test_serve_args_asks_for_instanttensor_only_where_the_image_carries_it(patchset):
    images = load_images(REPO / "images", patchset)
    variants = load_variants(REPO / "images")
    assert {v.image for v in variants.values() if "instanttensor" in images[v.image].wheels} == \
           {LAB, "glm53-flash-nvfp4-4p67"}
    for name, variant in sorted(variants.items()):
        assert "instanttensor" not in serve_command(variant).argv, "off by default"
        proc = serve_args(name, "--load-format", "instanttensor")
        if "instanttensor" in images[variant.image].wheels:
            argv = json.loads(proc.stdout)["argv"]
            assert proc.returncode == (0 if not variant.checkpoint.exclude_mtp_from_quant else 1), proc.stderr
            assert [argv[i + 1] for i, a in enumerate(argv) if a == "--load-format"] == ["instanttensor"]
        else:
            assert proc.returncode == 2, proc.stdout
            error = json.loads(proc.stdout)["error"]
            assert error["exit_code"] == 2 and "argv" not in proc.stdout
            assert f"imports the instanttensor package, which image {variant.image} does not carry" in error["message"]


INSTANTTENSOR_X86_64 = {  # instanttensor 0.2.2 on pypi.org/simple (read with patchkit.sources.index), this machine's
    (3, 11): ("instanttensor-0.2.2-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
              "78ba35382f42e81d18aa9ab59485ff1d1764c846de68bc5de8b894b37ee14996"),
    (3, 12): ("instanttensor-0.2.2-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
              "382954f2329fc085ff298ce0205a06ce0fc8c67a704fc032613931a5ae9018d5"),
}


@pytest.mark.vllm
@pytest.mark.network
def test_vllm_parses_the_command_and_its_loader_imports_the_package_patchkit_installed(stock_vllm, tmp_path):
    """On CPU, as far as it goes without a GPU: vLLM's own serve parser takes the lab command with
    `--load-format instanttensor`, its loader table maps it to the default loader, and its instanttensor
    weights iterator imports the package patchkit installed (this machine's build of the same release: the
    image's aarch64 cp312 one cannot load here) and stops only at its CUDA check; without it, ImportError."""
    argv = list(serve_command(find_variant("lab", REPO / "images"), load_format="instanttensor").argv[2:])
    filename, sha = INSTANTTENSOR_X86_64[sys.version_info[:2]]
    pin = WheelPin("instanttensor", "0.2.2", {"linux/amd64": (filename, sha)}, why="this machine's")
    site = tmp_path / "site"
    scheme = Scheme(str(site), str(tmp_path / "bin"), str(tmp_path), str(tmp_path / "include"), sys.executable)
    for f in install(fetch(pin, "linux/amd64"), pin, "linux/amd64", scheme).files:
        Path(f.path).parent.mkdir(parents=True, exist_ok=True)
        Path(f.path).write_bytes(f.data)
        os.chmod(f.path, f.mode)
    code = f"""
import json
from vllm.config.load import LoadConfig
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.weight_utils import instanttensor_weights_iterator
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers())
ns = parser.parse_args(["serve", *json.loads({json.dumps(json.dumps(argv))})])
loader = type(get_model_loader(LoadConfig(load_format=ns.load_format))).__name__
try:
    next(instanttensor_weights_iterator([], False))
    stopped = None
except (ImportError, ValueError) as e:
    stopped = [type(e).__name__, str(e)]
print(json.dumps([ns.load_format, loader, stopped]))
"""
    env = {"VLLM_TARGET_DEVICE": "cpu"}
    assert stock_vllm.run(code, env={**env, "PYTHONPATH": str(site)}, timeout=300) == \
           ["instanttensor", "DefaultModelLoader", ["ValueError", "InstantTensor requires NVIDIA GPUs"]]
    without = stock_vllm.run(code, env=env, timeout=300)
    assert without[:2] == ["instanttensor", "DefaultModelLoader"] and without[2][0] == "ImportError"
    assert "Please install instanttensor" in without[2][1]
