"""images/<name>/image.toml: the five real definitions, and every rule the loader enforces."""

import dataclasses
import textwrap
from pathlib import Path

import pytest

from builders import ENV_OK
from builders import image_toml as root
from patchkit.errors import PatchkitError
from patchkit.images.definitions import (
    ARCH_ENV,
    UnknownImage,
    UnknownSeries,
    load_image,
    load_images,
    mirrors,
    series_named,
)
from patchkit.images.schema import InvalidImageFile
from patchkit.patching.patchset import load_patchset
from patchkit.tomlschema import InvalidDefinition, NoDefinitionFiles

ROOT = Path(__file__).resolve().parents[1]
FIELD_DIGEST = "sha256:905c02933be6021301db2dc284e24e3727467aa3a0f63b41d609885778a07bce"
NAMES = {"glm53-flash-nvfp4", "glm53-flash-nvfp4-lab", "glm53-flash-nvfp4-4p67", "glm53-flash-nvidia-nvfp4",
         "glm53-flash-nvfp4-redhat"}


@pytest.fixture(scope="module")
def patchset():
    return load_patchset(ROOT / "patches")


@pytest.fixture(scope="module")
def images(patchset):
    return load_images(ROOT / "images", patchset)


def test_the_five_images_load(images, patchset):
    assert set(images) == NAMES
    for image in images.values():
        assert image.base == f"vllm/vllm-openai:glm53-flash-arm64-cu130@{FIELD_DIGEST}"
        assert image.platform == "linux/arm64"
        assert image.packages["vllm"].path == "/usr/local/lib/python3.12/dist-packages/vllm"
        assert image.engine_versions() == {"vllm": "0.30.0"}
        assert {k: image.env[k] for k in ARCH_ENV} == ARCH_ENV
        assert ("nope-mla-pad" in image.series) == (image.env.get("VLLM_MLA_NOPE_PAD_ROPE") == "1")
        for key in ("image", "base", "series", "env", "packages.vllm"):
            assert image.why.get(key, "").strip(), f"{image.name}: no why for {key}"
        order = [patchset.order.index(p) for p in image.series]
        assert order == sorted(order), "series must be in application order"


def test_inheritance_follows_the_images_table(images):
    root, lab, p467 = images["glm53-flash-nvfp4"], images["glm53-flash-nvfp4-lab"], images["glm53-flash-nvfp4-4p67"]
    assert "nope-mla-pad" in root.series
    assert set(lab.series) == set(root.series) | {"naming-shim", "modelopt-mtp-namespace"}
    assert p467.parent == "glm53-flash-nvfp4-lab"
    assert set(p467.series) == set(lab.series) | {"packed-modules-4p67"}
    assert images["glm53-flash-nvfp4-redhat"].series == root.series
    assert "modelopt-mtp-namespace" not in images["glm53-flash-nvidia-nvfp4"].series
    assert p467.env == lab.env == root.env
    assert p467.labels["dev.patchkit.checkpoint"] == "local-inference-lab/GLM-5.3-Flash-NVFP4-4p67"
    assert p467.labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def child(name, parent, add='["pool-topk-init"]'):
    return f'schema = 1\nname = "{name}"\ntitle = "t"\nwhy = "w"\nparent = "{parent}"\n[series]\nadd = {add}\nwhy = "w"\n'


def write(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / name / "image.toml").write_text(textwrap.dedent(text))
    return tmp_path



def test_a_valid_child_inherits(tmp_path, patchset):
    d = write(tmp_path, {"a": root(), "b": child("b", "a")})
    b = load_image(d, "b", patchset)
    assert b.series == ("nope-mla-pad", "pool-topk-init") and b.base.startswith("example.org/base:tag@")


@pytest.mark.parametrize("files, message", [
    ({"a": child("a", "b"), "b": child("b", "a")}, "inheritance cycle: a -> b -> a"),
    ({"a": child("a", "zz")}, "parent 'zz' has no"),
    ({"a": root(series='["nope-mla-pad", "no-such-patch"]')}, "unknown patches"),
    ({"a": root(series='["pool-topk-init", "nope-mla-pad"]')}, "not in the application order"),
    ({"a": root(series="[]")}, "patches is empty"),
    ({"a": root(), "b": child("b", "a", add='["nope-mla-pad"]')}, "already in the series"),
    ({"a": root(digest="abc")}, "must be pinned by digest"),
    ({"a": root().replace('example.org/base:tag@sha256:' + "0" * 64, "example.org/base:tag")}, "pinned by digest"),
    ({"a": root(env='{ TORCH_CUDA_ARCH_LIST = "12.1a" }')}, "FLASHINFER_CUDA_ARCH_LIST must be '12.1f'"),
    ({"a": root(series='["pool-topk-init"]')}, "VLLM_MLA_NOPE_PAD_ROPE switches nope-mla-pad"),
    ({"a": root(env=ENV_OK.replace('VLLM_MLA_NOPE_PAD_ROPE = "1"', 'X = "1"'))}, "set it to '1'"),
    ({"a": root().replace('name = "a"', 'name = "b"')}, "must equal the folder name"),
    ({"a": root().replace('title = "t"', 'title = "t"\ncolour = "red"')}, "top level: unknown key `colour`"),
    ({"a": root().replace('platform = "linux/arm64"', 'platform = "linux/amd64"')}, "platform 'linux/amd64'"),
    ({"a": root().replace('version = "0.33.0"', 'version = "0.33.0"\nlayout = "0.31.0.dev1"')}, "must name a release"),
    ({"a": root().replace('/site-packages/vllm"', '/site-packages/other"')}, "absolute directory of the vllm"),
    ({"a": root().replace('[series]\npatches', '[series]\nadd')}, "root image lists its series"),
    ({"a": root(), "b": child("b", "a").replace("add =", "patches =")}, "extends its parent's series"),
    ({"a": root().replace('why = "w"\n[base]', '[base]')}, "top level: missing required key `why`"),
])
def test_invalid_definitions_are_clear_errors(tmp_path, patchset, files, message):
    d = write(tmp_path, files)
    with pytest.raises(PatchkitError, match=message):
        load_images(d, patchset)


@pytest.mark.parametrize("files, at, problem, found", [
    ({"a": root(digest="abc")}, "[base], key 'ref'", "base-ref", "example.org/base:tag@sha256:abc"),
    ({"a": root().replace('name = "a"', 'name = "b"')}, "key 'name'", "folder-name", "name 'b'"),
    ({"a": root(env='{ TORCH_CUDA_ARCH_LIST = "12.1a" }')}, "[env.vars], key 'FLASHINFER_CUDA_ARCH_LIST'",
     "arch-env", "found None"),
    ({"a": root(series='["nope-mla-pad", "no-such-patch"]')}, "[series], key 'patches'", "series", "no-such-patch"),
    ({"a": root().replace('version = "0.33.0"', 'version = "0.33.0"\nlayout = "0.31.0.dev1"')},
     "[packages.vllm], key 'layout'", "layout", "'0.31.0.dev1'"),
    ({"a": child("a", "b"), "b": child("b", "a")}, "key 'parent'", "cycle", "a -> b -> a"),
])
def test_a_bad_definition_is_an_invalid_definition_naming_its_file_and_key(tmp_path, patchset, files, at, problem,
                                                                          found):
    """The rules between fields raise the same kind the schema does (tomlschema.InvalidDefinition), with the
    file, the table and key, the rule broken and what was found there as fields, and the message says them."""
    d = write(tmp_path, files)
    with pytest.raises(InvalidDefinition) as info:
        load_images(d, patchset)
    error = info.value
    assert isinstance(error, InvalidImageFile)
    assert (Path(error.path).parent.parent, error.at, error.problem) == (d, at, problem)
    assert found in error.detail and str(error) == f"{error.path}: {at}: {error.detail}"


def test_unknown_image_name(tmp_path, patchset):
    d = write(tmp_path, {"a": root()})
    with pytest.raises(UnknownImage, match="unknown image 'x'; ") as info:
        load_image(d, "x", patchset)
    assert (info.value.name, info.value.known) == ("x", ("a",))


def test_the_pinned_base_stand_in_follows_the_root_definition(images):
    """tests/registry.py's stand-in for vllm/vllm-openai:glm53-flash-arm64-cu130 (the base every image is
    built on in tests/test_build.py) carries what the definition says the real base carries, where it says."""
    from registry import pinned_stand_in

    stand_in, root = pinned_stand_in(), images["glm53-flash-nvfp4"]
    vllm, flashinfer = root.packages["vllm"], root.packages["flashinfer"]
    assert (stand_in.vllm_metadata, stand_in.vllm) == (vllm.version, vllm.layout) == ("0.1.dev20051+g487ecf187", "0.30.0")
    assert f"/{stand_in.site}/vllm" == vllm.path and f"/{stand_in.site}/flashinfer" == flashinfer.path
    assert stand_in.flashinfer == (flashinfer.version or "0.6.18.post1")
    # a real dev build writes its dev version into _version.py as into METADATA (tests/bases.version_py)
    assert stand_in.scm_version == vllm.version


# ------------------------------------------------------------ hostile copies of the real definitions

ROOT_IMAGE, LAB = "glm53-flash-nvfp4", "glm53-flash-nvfp4-lab"


def hostile(tmp_path, image: str, old: str, new: str, folder: str | None = None) -> Path:
    """The five real image.toml files copied under tmp_path, `image`'s broken by one edit (written as
    `folder` when given, the real ones left whole); the broken file's path."""
    for name in NAMES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "image.toml").write_bytes((ROOT / "images" / name / "image.toml").read_bytes())
    text = (ROOT / "images" / image / "image.toml").read_text()
    assert old in text, old
    target = tmp_path / (folder or image) / "image.toml"
    target.parent.mkdir(exist_ok=True)
    target.write_text(text.replace(old, new, 1))
    return target


@pytest.mark.parametrize("image, old, new, folder, at, problem", [
    (ROOT_IMAGE, f'name = "{ROOT_IMAGE}"', 'name = "other"', None, "key 'name'", "folder-name"),
    (ROOT_IMAGE, f'name = "{ROOT_IMAGE}"', 'name = "Upper"', "Upper", "key 'name'", "image-name"),
    (LAB, f'parent = "{ROOT_IMAGE}"', 'parent = "zz"', None, "key 'parent'", "parent"),
    (LAB, f'parent = "{ROOT_IMAGE}"', f'parent = "{LAB}"', None, "key 'parent'", "parent"),
    (ROOT_IMAGE, "title = ", f'parent = "{LAB}"\ntitle = ', None, "key 'parent'", "cycle"),
    (ROOT_IMAGE, "[packages.vllm]", "[packages.flashinfer2]", None, "[packages.vllm]", "missing-table"),
    (ROOT_IMAGE, "cu130@sha256:", "cu130@sha512:", None, "[base], key 'ref'", "base-ref"),
    (ROOT_IMAGE, 'platform = "linux/arm64"', 'platform = "linux/amd64"', None, "[base], key 'platform'", "platform"),
    (ROOT_IMAGE, "[packages.flashinfer]", "[packages.numpy]", None, "[packages.numpy]", "unknown-package"),
    (ROOT_IMAGE, 'path = "/usr', 'path = "usr', None, "[packages.vllm], key 'path'", "package-path"),
    (ROOT_IMAGE, 'version = "0.1.dev20051+g487ecf187"', 'version = "zero"', None, "[packages.vllm], key 'version'",
     "version"),
    (ROOT_IMAGE, 'version = "0.1.dev20051+g487ecf187"\n', "", None, "[packages.vllm]", "version"),
    (ROOT_IMAGE, 'layout = "0.30.0"', 'layout = "0.30.0rc1"', None, "[packages.vllm], key 'layout'", "layout"),
    (LAB, 'add = ["naming-shim"', 'add = ["nope-mla-pad", "naming-shim"', None, "[series], key 'add'", "series"),
    (ROOT_IMAGE, "vars = { ", 'vars = { "BAD-NAME" = "1", ', None, "[env.vars], key 'BAD-NAME'", "env-name"),
    (ROOT_IMAGE, 'CUTE_DSL_ARCH = "sm_121a"', 'CUTE_DSL_ARCH = "sm_90a"', None, "[env.vars], key 'CUTE_DSL_ARCH'",
     "arch-env"),
])
def test_each_rule_refuses_a_hostile_copy_of_a_real_image(tmp_path, patchset, image, old, new, folder, at, problem):
    broken = hostile(tmp_path, image, old, new, folder)
    # a cycle is found from the image that closes it: the lab, naming the root as its parent
    blamed = tmp_path / LAB / "image.toml" if problem == "cycle" else broken
    with pytest.raises(InvalidImageFile) as info:
        load_images(tmp_path, patchset)
    assert (info.value.path, info.value.at, info.value.problem) == (str(blamed), at, problem)
    assert str(info.value) == f"{blamed}: {at}: {info.value.detail}"


def test_names_no_image_defines_are_typed_with_what_is_known(tmp_path, patchset):
    with pytest.raises(NoDefinitionFiles) as none:
        load_images(tmp_path, patchset)
    assert (none.value.folder, none.value.file, str(none.value)) == (str(tmp_path), "image.toml",
                                                                     f"no image.toml under {tmp_path}")
    hostile(tmp_path, ROOT_IMAGE, "", "")  # the five, none broken
    with pytest.raises(UnknownSeries) as series:
        series_named("nope", tmp_path, patchset)
    assert (series.value.name, series.value.known) == ("nope", tuple(sorted(NAMES)))
    assert str(series.value).startswith(f"unknown series 'nope': use 'full' or an image name of {tmp_path} (")
    with pytest.raises(UnknownImage) as image:
        mirrors(load_images(tmp_path, patchset), "ghcr.io/owner", "nope")
    assert (image.value.name, image.value.images_dir, image.value.known) == ("nope", None, tuple(sorted(NAMES)))


def test_an_image_made_with_an_unpinned_base_refuses_its_digest(images):
    made = dataclasses.replace(images[ROOT_IMAGE], base="vllm/vllm-openai:latest")
    with pytest.raises(InvalidImageFile) as info:
        assert made.base_digest is None  # never reached: reading the digest raises
    assert (info.value.path, info.value.at, info.value.problem) == (
        str(ROOT / "images" / ROOT_IMAGE / "image.toml"), "[base], key 'ref'", "base-ref")


def test_the_cli_refuses_a_hostile_image_with_exit_2_and_the_place(tmp_path):
    from click.testing import CliRunner

    from patchkit.cli.main import main

    broken = hostile(tmp_path, ROOT_IMAGE, "cu130@sha256:", "cu130@sha512:")
    r = CliRunner().invoke(main, ["list", "--patches", str(ROOT / "patches"), "--series", LAB, "--images",
                                  str(tmp_path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"{broken}: [base], key 'ref': " in r.stderr and "must be pinned by digest" in r.stderr
