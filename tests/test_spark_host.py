"""The DGX Spark owner's path, on this machine's real components: nox on the Python that is there (a Spark's
Ubuntu 24.04 has 3.12, no 3.11), a fresh user cache, the demo base in a layout; `patchkit load` putting
that layout into a real engine (podman's API service and the Docker Engine, tests/engines.py); `build
--load` on it with `--base` given as a tag, an image id and a short id, the labels naming the base
rightly each time; the pinned base's stand-in pulled into the engine and built through the image's own
definition."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bases import RELEASE, make_stand_in, pinned_stand_in
from engines import (  # noqa: F401
    client,
    dockerd_service,
    engine,
    engine_client,
    engine_service,
    podman,
    podman_service,
)
from hostile import assert_refused, run_patchkit
from patchkit.images.build import build
from patchkit.sources.installed_version import VersionsDisagree
from registry import push_base, registry_server  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "glm53-flash-nvfp4-4p67"
EPOCH = 1_700_000_000
BASE_NAME, BASE_DIGEST = "org.opencontainers.image.base.name", "org.opencontainers.image.base.digest"


def host_python() -> Path:
    """A Python 3.12 (the Spark's), from pyenv's versions or PATH; missing is a failure, not a skip."""
    pyenv = subprocess.run(["pyenv", "root"], capture_output=True, text=True) if shutil.which("pyenv") else None
    found = sorted(Path(pyenv.stdout.strip()).glob("versions/3.12*/bin/python3.12")) if pyenv and pyenv.returncode == 0 else []
    found += [Path(p) for p in [shutil.which("python3.12")] if p]
    if not found:
        pytest.fail("no Python 3.12 here (pyenv install 3.12, or apt-get install python3.12): the Spark's "
                    "interpreter is what this test runs nox on")
    return found[0]


NETWORK_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT", "PIP_INDEX_URL", "PATCHKIT_INDEX_URL",
               "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(scope="module")
def spark_env(tmp_path_factory):
    """The README's Spark set-up on Python 3.12: a virtualenv, `pip install nox -e .` (pip resolves the
    package's dependencies on 3.12 from the index), and a PATH holding that environment and git only, so
    no python3.11 is reachable."""
    where = tmp_path_factory.mktemp("spark")
    venv = where / "venv"
    subprocess.run([str(host_python()), "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "nox", "-e", str(ROOT)], capture_output=True,
                         text=True)
    assert pip.returncode == 0, f"pip install nox -e . failed on Python 3.12:\n{pip.stderr[-3000:]}"
    tools = where / "tools"
    tools.mkdir()
    (tools / "git").symlink_to(shutil.which("git"))
    assert not list(venv.glob("bin/python3.11")), "the 3.12 environment must hold no python3.11"
    env = {"HOME": str(where / "home"), "PATH": f"{venv / 'bin'}:{tools}", "LANG": "C.UTF-8",
           "XDG_CACHE_HOME": str(where / "cache"), "PIP_CACHE_DIR": str(where / "pip")}
    # The machine's way to the package index (its CA bundle, proxy, mirror), as a Spark's own shell has it:
    # a 4p67 build fetches the image's pinned instanttensor wheel into that fresh cache.
    env |= {k: v for k, v in os.environ.items() if k in NETWORK_ENV}
    return env


@pytest.fixture(scope="module")
def demo_layout(tmp_path_factory):
    """`nox -s demo-base`'s layout (vLLM 0.33.0 + FlashInfer 0.7.2.post1), made once per module."""
    made = make_stand_in(RELEASE, tmp_path_factory.mktemp("demo") / "layout")
    return made


def nox(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nox", "-f", str(ROOT / "noxfile.py"), *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_nox_build_runs_on_the_python_that_is_there(spark_env, demo_layout, tmp_path):
    """No python3.11 anywhere, a fresh user cache: `nox -s build-4p67` builds on nox's own 3.12 and
    writes the image (nox's default was "skipped: Python interpreter 3.11 not found", exit 0)."""
    out = tmp_path / "oci"
    done = nox(spark_env, "-s", "build-4p67", "--", "--base", f"{demo_layout['layout']}:base", "--output", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipped" not in done.stderr
    assert re.search(r"python3\.12 -m patchkit build glm53-flash-nvfp4-4p67", done.stderr)
    index = json.loads((out / "index.json").read_text())
    [entry] = index["manifests"]
    manifest = json.loads((out / "blobs" / "sha256" / entry["digest"][7:]).read_bytes())
    assert manifest["annotations"]["dev.patchkit.vllm.version"] == "0.33.0"
    assert manifest["annotations"][BASE_DIGEST] == demo_layout["index"]
    assert BASE_NAME not in manifest["annotations"], "a layout's path on the builder's disk is no base name"
    assert (Path(spark_env["XDG_CACHE_HOME"]) / "patchkit").is_dir(), "the user cache given was not the one used"


def test_a_missing_test_interpreter_is_an_error_not_a_skip(spark_env):
    done = nox(spark_env, "-s", "tests")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Python interpreter 3.11 not found" in done.stderr and "skipped" not in done.stderr


@pytest.fixture(scope="module")
def loaded(engine_client, engine, demo_layout, tmp_path_factory):
    """`patchkit load LAYOUT:base` into the engine, end to end (a fresh interpreter under a memory limit)."""
    outcome = run_patchkit("load", f"{demo_layout['layout']}:base", "--engine-url", engine, "--tag",
                           "patchkit/demo-base:base", "--json", timeout=300)
    assert outcome.code == 0, outcome.output
    return json.loads(outcome.stdout)


def test_load_puts_the_layout_arm64_image_in_the_engine(loaded, engine_client, demo_layout):
    arm64 = json.loads(demo_layout["blobs"][demo_layout["arm64"]])
    image = engine_client.images.get("patchkit/demo-base:base")
    # both engines' image id is the digest of the config sent: the layout's arm64 config, byte for byte
    assert image.id == loaded["image_id"] == arm64["config"]["digest"] == loaded["config"]
    assert (image.attrs["Os"], image.attrs["Architecture"]) == ("linux", "arm64")
    assert image.attrs["RootFS"]["Layers"] == json.loads(demo_layout["blobs"][arm64["config"]["digest"]])["rootfs"]["diff_ids"]


def test_build_load_names_the_base_rightly_however_it_is_given(loaded, engine_client, engine, tmp_path):
    """A tag, an image id, a short id: never `docker.io/library/sha256:...`; base.name and base.digest
    only from a repo digest the engine recorded (podman records one for every image it stores, Docker
    only for a pulled or pushed one), else left out; the image id always in dev.patchkit.base.image-id."""
    image_id = loaded["image_id"]
    recorded = engine_client.images.get(image_id).attrs.get("RepoDigests") or []
    tags = set()
    for spec in ("patchkit/demo-base:base", image_id, image_id[7:19]):
        result = build(IMAGE, base=spec, load=True, engine_url=engine, epoch=EPOCH,
                       cache=tmp_path / "cache")
        labels = engine_client.images.get(result.engine_image).labels
        assert labels["dev.patchkit.base.image-id"] == image_id
        assert "library/sha256" not in json.dumps(labels) and f"library/{image_id[7:19]}" not in json.dumps(labels)
        if recorded:
            repo, digest = recorded[0].split("@")
            assert labels[BASE_DIGEST] == digest and labels[BASE_NAME].startswith(repo)
        else:
            assert BASE_NAME not in labels and BASE_DIGEST not in labels
        tags.add(result.built.tag)
    # one base, one series: one tag, naming the base
    [tag] = tags
    assert tag.endswith("-" + (recorded[0].split("@sha256:")[1] if recorded else image_id[7:])[:12])


def test_an_unknown_image_id_is_refused_not_looked_up_in_a_registry(engine, tmp_path):
    unknown = "sha256:" + hashlib.sha256(b"no such image").hexdigest()
    env = {**os.environ, "PATCHKIT_CACHE_DIR": str(tmp_path / "cache")}
    for route in (["--load", "--engine-url", engine], []):
        outcome = run_patchkit("build", IMAGE, "--base", unknown, *route, "--output", str(tmp_path / "o"), env=env)
        assert_refused(outcome, unknown, "image id")
        assert "docker.io" not in outcome.output


def test_load_refuses_what_is_not_a_layout(tmp_path, engine):
    assert_refused(run_patchkit("load", str(tmp_path / "absent") + ":base", "--engine-url", engine), "OCI layout")
    (tmp_path / "layout").mkdir()
    assert_refused(run_patchkit("load", str(tmp_path / "layout"), "--engine-url", engine), "layout")


@pytest.mark.registry
def test_every_route_builds_the_pinned_base_stand_in_in_the_engine(registry_server, client, podman, tmp_path_factory,
                                                                   tmp_path):
    """The stand-in as a real dev build is (the same dev version in _version.py and METADATA), pulled by
    its digest into podman and built through the image's own definition: declared version and layout
    speak for it; and the stand-in as it was (0.30.0's _version.py under the dev dist-info) is refused by
    the one rule on both routes, daemonless and --load, for the same reason."""
    import dataclasses

    images = tmp_path_factory.mktemp("images") / "images"
    shutil.copytree(ROOT / "images", images)
    for name, stand_in in (("pinned", pinned_stand_in()),
                           ("mixed", dataclasses.replace(pinned_stand_in(), vllm_version_py="0.30.0"))):
        made = make_stand_in(stand_in, tmp_path_factory.mktemp(name) / "layout")
        ref = push_base(made, registry_server.host, f"vllm/{name}", tag="glm53-flash-arm64-cu130")
        client.api.pull(ref.split(":glm53")[0], tag=made["index"], platform="linux/arm64")  # as pinned: by digest
        root = ROOT / "images" / "glm53-flash-nvfp4" / "image.toml"
        text = re.sub(r'^ref = "vllm/vllm-openai:glm53-flash-arm64-cu130@sha256:[0-9a-f]{64}"$', f'ref = "{ref}"',
                      root.read_text(), flags=re.MULTILINE)
        (images / "glm53-flash-nvfp4" / "image.toml").write_text(text)
        kw = dict(images_dir=images, epoch=EPOCH, cache=tmp_path / name)
        if name == "mixed":
            for route in ({"load": True, "engine_url": podman}, {"output": tmp_path / "mixed-oci"}):
                with pytest.raises(VersionsDisagree) as err:
                    build(IMAGE, **route, **kw)
                assert (err.value.module_version, err.value.metadata) == ("0.30.0", stand_in.vllm_metadata)
            continue
        result = build(IMAGE, load=True, engine_url=podman, **kw)
        assert result.route == "local-engine"
        prepared = result.built.prepared
        assert prepared.versions["vllm"] == "0.1.dev20051+g487ecf187"
        assert prepared.engine_versions["vllm"] == "0.30.0"
        labels = client.images.get(result.engine_image).labels
        assert labels[BASE_DIGEST] == ref.split("@")[1] and labels[BASE_NAME].endswith("vllm/pinned:glm53-flash-arm64-cu130")
        assert labels["dev.patchkit.vllm.layout"] == "0.30.0"


def test_load_of_a_cu130_base_finds_its_suffixed_metadata(client, podman, tmp_path_factory, tmp_path):
    """A CUDA 13.0 build (METADATA 0.33.0+cu130, _version.py 0.33.0, Env CUDA_VERSION=13.0.1) loaded into
    the engine and given by its tag: the engine route finds vllm-0.33.0+cu130.dist-info from the image's
    CUDA_VERSION (it cannot list site-packages without moving it) and judges 0.33.0's layout."""
    from bases import CU130
    from patchkit.images.load import load_layout

    made = make_stand_in(CU130, tmp_path_factory.mktemp("cu130") / "layout")
    loaded = load_layout(f"{made['layout']}:base", tag="patchkit/cu130:base", engine_url=podman)
    result = build(IMAGE, base=loaded.tag, load=True, engine_url=podman, epoch=EPOCH,
                   cache=tmp_path / "cache")
    prepared = result.built.prepared
    assert prepared.versions["vllm"] == "0.33.0+cu130" and prepared.engine_versions["vllm"] == "0.33.0"
    assert client.images.get(result.engine_image).labels["dev.patchkit.vllm.layout"] == "0.33.0"


def _tar_of(name: str, data: bytes) -> bytes:
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def test_load_refuses_a_hostile_layout_before_asking_any_engine(tmp_path):
    """A gzip bomb (2 MiB of tar in a few KiB, over a 1 MiB PATCHKIT_LIMIT_LAYER_TAR) and a layer whose tar
    is not the diff_id its config names: exit 2 naming the layer, and no engine is needed to say so."""
    import gzip

    from bases import small_layout

    tar = _tar_of("zeros", bytes(2 << 20))
    bomb = tmp_path / "bomb"
    small_layout(bomb, [(gzip.compress(tar), "sha256:" + hashlib.sha256(tar).hexdigest())])
    lying = tmp_path / "lying"
    small_layout(lying, [(gzip.compress(tar), "sha256:" + "0" * 64)])
    nowhere = f"unix://{tmp_path / 'no-engine.sock'}"
    env = {**os.environ, "PATCHKIT_LIMIT_LAYER_TAR": str(1 << 20), "PATCHKIT_CACHE_DIR": str(tmp_path / "cache")}
    assert_refused(run_patchkit("load", str(bomb), "--engine-url", nowhere, env=env), "layer-tar", "PATCHKIT_LIMIT_LAYER_TAR")
    del env["PATCHKIT_LIMIT_LAYER_TAR"]
    assert_refused(run_patchkit("load", str(lying), "--engine-url", nowhere, env=env), "diff_id", "sha256:" + "0" * 64)
