"""Patched wheels from the pinned vLLM's real x86_64 wheel (the package index's file, cached after one download),
built as `patchkit wheel build` builds them: the release's FlashInfer pin kept where it is published, the
companion policy's substitute required in its place where it is not (0.34.0's 0.7.3).

Everything the wheel claims is checked from outside the writer: the RECORD by hashing each member read
with zipfile, the contents against the planner's own plan on the release wheel, the bytes of two builds,
and the install by pip itself into a fresh environment through the static index, where the patch
behaviour tests then run against the installed package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit import PINNED_VLLM, __version__
from patchkit.cli.main import main
from patchkit.cli.wheel import wheel_group
from patchkit.patching import planner
from patchkit.patching.carry import ChangesNothing
from patchkit.patching.patchset import load_patchset
from patchkit.patching.planner import Mode, PlanFailed, State
from patchkit.patching.series import series_hash
from patchkit.sources.companion import How, resolve_pin
from patchkit.sources.verified_wheel import open_wheel
from patchkit.sources.wheel import WheelSource
from patchkit.wheels.build import build_wheel
from patchkit.wheels.index import write_index
from patchkit.wheels.release import (
    NoReleaseWheel,
    UnknownPlatform,
    UnverifiableWheel,
    choose_wheel,
    pinned_companion,
    release_wheel,
)
from patchkit.wheels.requires import Substitution, substitution_for
from test_companion import recorded_index  # noqa: F401  (the recorded flashinfer-python page)
from wheel_files import assert_record_matches, members

pytestmark = [pytest.mark.network, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[1]
VERSION = PINNED_VLLM  # the environment's own vLLM: the behaviour tests compare the wheel's with it
# Behaviour tests run against the installed wheel: the MTP draft's quant config and 4p67's fused projections.
BEHAVIOUR = ("test_modelopt_mtp_namespace.py", "test_packed_modules_4p67.py")


@pytest.fixture(scope="module")
def release() -> Path:
    return release_wheel(VERSION, "x86_64", progress=False)


@pytest.fixture(scope="module")
def series():
    return load_patchset(REPO / "patches").series()


@pytest.fixture(scope="module")
def companion(release):
    """The companion policy's answer for the release's FlashInfer pin (the index asked, as the command asks)."""
    pin = pinned_companion(release)
    return resolve_pin(pin) if pin is not None else None


@pytest.fixture(scope="module")
def substitution(companion) -> Substitution | None:
    return substitution_for(companion)


@pytest.fixture(scope="module")
def built(release, series, substitution, tmp_path_factory):
    return build_wheel(release, series, "full", tmp_path_factory.mktemp("wheels"), substitution=substitution)


def test_every_record_row_matches_its_member(built):
    files = members(built.path)
    dist_info = f"vllm-{built.manifest.version}.dist-info"
    assert_record_matches(files, dist_info)


def test_the_release_and_the_built_wheel_pass_the_release_checks(release, built):
    """The real release verifies whole (every member against its RECORD), and so does what was built from
    it: the output is a wheel patchkit itself would take as a release."""
    with open_wheel(release) as old, open_wheel(built.path) as new:
        assert (old.name, old.version, new.version) == ("vllm", VERSION, built.manifest.version)
        renamed = {n.replace(old.dist_info, new.dist_info) for n in old.members
                   if n.rsplit("/", 1)[-1] not in ("RECORD.jws", "RECORD.p7s")}
        assert set(new.members) == renamed | {f"{new.dist_info}/patchkit.json"}
        assert len(old.members) > 5000


def test_the_changes_are_exactly_the_planners_plan(release, series, built):
    plan = planner.plan(series, WheelSource(release))
    assert plan.ok and plan.changes
    before, after = members(release), members(built.path)
    old_info, new_info = f"vllm-{VERSION}.dist-info/", f"vllm-{built.manifest.version}.dist-info/"
    renamed = {(new_info + n.removeprefix(old_info) if n.startswith(old_info) else n): data
               for n, data in before.items()}
    assert set(after) - set(renamed) == {new_info + "patchkit.json"}
    assert set(renamed) == set(after) - {new_info + "patchkit.json"}
    changed = {n for n in renamed if not n.startswith(new_info) and renamed[n] != after[n]}
    assert changed == {f"{c.package}/{c.path}" for c in plan.changes}
    for change in plan.changes:
        assert after[f"{change.package}/{change.path}"] == change.new
    # The unified diff of the two wheels' package files is the series' diff.
    diff = "".join(planner.FileChange("vllm", n.removeprefix("vllm/"), renamed[n], after[n]).unified_diff()
                   for n in sorted(changed))
    assert diff == plan.diff()
    # Metadata: the version, the generator, the record and a substituted pin's requirement; nothing else.
    substituted = [(f"Requires-Dist: {s.release_requirement}", f"Requires-Dist: {s.requirement}")
                   for s in built.manifest.substituted]
    for name in ("METADATA", "WHEEL"):
        old, new = renamed[new_info + name].decode().splitlines(), after[new_info + name].decode().splitlines()
        differ = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
        if name == "METADATA":
            assert differ[0] == (f"Version: {VERSION}", f"Version: {built.manifest.version}")
            assert sorted(differ[1:]) == sorted(substituted)
        else:
            assert differ == [("Generator: setuptools (80.10.2)", f"Generator: patchkit {__version__}")]
    record = json.loads(after[new_info + "patchkit.json"])
    carried = [(r.patch.id, r.patch.digest) for r in plan.results if r.state in ("not-applied", "applied")]
    assert [(p["id"], p["digest"]) for p in record["patches"]] == carried
    # every patch it does not carry is skipped with its state (0.34.0: nope-mla-pad out of range)
    assert {p["id"]: p["state"] for p in record["skipped"]} == {
        r.patch.id: r.state for r in plan.results if r.state not in ("not-applied", "applied")}


def test_compiled_extensions_are_copied_byte_for_byte(release, built):
    with zipfile.ZipFile(release) as old, zipfile.ZipFile(built.path) as new:
        shared = [i for i in old.infolist() if i.filename.endswith(".so")]
        assert len(shared) >= 10
        for info in shared:
            copy = new.getinfo(info.filename)
            assert (copy.CRC, copy.compress_size, copy.compress_type) == (
                info.CRC, info.compress_size, info.compress_type)
            assert old.read(info) == new.read(copy)


def test_two_builds_give_the_same_wheel(release, series, substitution, built, tmp_path):
    again = build_wheel(release, series, "full", tmp_path, substitution=substitution)
    assert again.path.name == built.path.name
    assert again.sha256 == built.sha256 == hashlib.sha256(built.path.read_bytes()).hexdigest()


def test_the_command_keeps_a_published_pin_substitutes_an_unpublished_one_and_builds_the_same_wheel(
        release, companion, built, tmp_path):
    """A published pin (0.33.0's flashinfer-python 0.7.2.post1) is kept: no `substituted` in the record, none
    in the JSON. An unpublished one (0.34.0's 0.7.3) is required as the policy's substitute, recorded in
    both. Either way `wheel build` (default: the pinned release) writes the very file build_wheel writes."""
    assert companion is not None and companion.how in (How.PINNED, How.SUBSTITUTE), companion
    record = json.loads(members(built.path)[f"vllm-{built.manifest.version}.dist-info/patchkit.json"])
    if companion.how == How.PINNED:
        assert "substituted" not in record and built.summary()["substituted"] == []
    else:
        (substituted,) = record["substituted"]
        assert (substituted["pin"], substituted["substitute"]) == (companion.pin, companion.checked)
        assert built.summary()["substituted"] == record["substituted"]
    result = CliRunner().invoke(main, ["wheel", "build", "--series", "full", "--platform", "x86_64", "--output",
                                       str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert entry["companion"] == companion.to_dict() and entry["substituted"] == built.summary()["substituted"]
    assert (Path(entry["wheel"]).name, entry["sha256"]) == (built.path.name, built.sha256)


def test_a_series_that_does_not_apply_writes_no_wheel(release, tmp_path):
    patches = shutil.copytree(REPO / "patches", tmp_path / "patches")
    toml = patches / "modelopt-mtp-namespace" / "patch.toml"
    anchor = "        return tuple(dict.fromkeys(candidates))"
    assert toml.read_text().count(anchor) == 1
    toml.write_text(toml.read_text().replace(anchor, anchor.replace("candidates", "names")))  # upstream drifted
    out = tmp_path / "out"
    with pytest.raises(PlanFailed) as info:
        build_wheel(release, load_patchset(patches).series(), "full", out)
    assert info.value.failed == {"modelopt-mtp-namespace": State.BROKEN} and info.value.mode == Mode.APPLY
    assert not out.exists()  # not even the folder: the plan fails before anything is written
    result = CliRunner().invoke(main, ["wheel", "build", "--series", "full", "--platform", "x86_64",
                                       "--patches", str(patches), "--output", str(out)])
    assert result.exit_code == 1, result.output
    assert "modelopt-mtp-namespace" in result.output and "anchor expected 1x, found 0x" in result.output
    assert not out.exists()


def narrowed(tmp_path: Path, ranges: dict[str, str]) -> Path:
    """A copy of the patch set with the given patches' vLLM ranges replaced."""
    patches = shutil.copytree(REPO / "patches", tmp_path / "patches")
    for patch_id, spec in ranges.items():
        toml = patches / patch_id / "patch.toml"
        text, count = re.subn(r'(?m)^vllm = ">=0\.30\.0,<0\.3[45]"$', f'vllm = "{spec}"', toml.read_text())
        assert count == 1, toml  # every patch's range starts at 0.30.0 and ends at 0.34 or 0.35 today
        toml.write_text(text)
    return patches


def test_a_patch_out_of_range_is_left_out_of_the_wheel(release, built, tmp_path):
    """The carry rule wheels share with images (tests/test_build.py has the image's side): a patch whose
    range ends before the release is not carried: recorded in patchkit.json's skipped with its state, out
    of the patches, the hash and the files; the rest built as before."""
    patchset = load_patchset(narrowed(tmp_path, {"modelopt-mtp-namespace": ">=0.30.0,<0.33"}))
    wheel = build_wheel(release, patchset.series(), "full", tmp_path / "out")
    skipped = {p.id: p.state for p in wheel.manifest.skipped}
    assert skipped["modelopt-mtp-namespace"] == "out-of-range"
    carried = [p.id for p in wheel.manifest.patches]
    assert carried == [p.id for p in built.manifest.patches if p.id != "modelopt-mtp-namespace"]
    assert wheel.manifest.series_hash == series_hash([patchset.patch(i) for i in carried])
    assert wheel.manifest.series_hash != built.manifest.series_hash

    def files_of(*ids):
        return {f"vllm/{c}" for i in ids for e in patchset.patch(i).edits if e.package == "vllm" for c in e.candidates}

    its_own = files_of("modelopt-mtp-namespace") - files_of(*carried)
    assert its_own & {f["path"] for f in built.manifest.files}, "carried, the patch changes files of its own"
    assert not its_own & {f["path"] for f in wheel.manifest.files}


def test_a_release_outside_every_range_builds_no_wheel(release, tmp_path):
    patches = narrowed(tmp_path, {p.id: ">=0.30.0,<0.33" for p in load_patchset(REPO / "patches").series()})
    out = tmp_path / "out"
    with pytest.raises(ChangesNothing) as info:
        build_wheel(release, load_patchset(patches).series(), "full", out)
    assert (info.value.artifact, info.value.where, info.value.exit_code) == ("series full", release.name, 2)
    assert set(info.value.states.values()) == {State.OUT_OF_RANGE}
    assert f"series full changes nothing in {release.name} (" in str(info.value)
    assert "modelopt-mtp-namespace: out-of-range" in str(info.value)
    assert not out.exists()


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """A fresh venv that sees this environment's packages (torch: not downloaded again) through a .pth
    behind its own, and the patched wheel installed with pip from the static index, hash-checked."""
    index = write_index(built.path.parent, built.path.parent)
    assert [w.filename for w in index] == [built.path.name]
    env = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz-test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--index-url", (built.path.parent / "simple").as_uri(),
                    f"vllm=={built.manifest.version}"], check=True)
    return python, site


def test_the_index_links_the_wheel_with_its_hash(built, installed):
    """The pages pip read in `installed`: PEP 503 link with the file's sha256 and Requires-Python, the same
    in the PEP 691 JSON."""
    simple = built.path.parent / "simple"
    page = (simple / "vllm" / "index.html").read_text()
    href = f'href="../../{built.path.name.replace("+", "%2B")}#sha256={built.sha256}"'
    assert href in page and 'data-requires-python="&lt;3.15,&gt;=3.11"' in page
    listing = json.loads((simple / "vllm" / "index.json").read_text())
    assert listing["meta"]["api-version"] == "1.1"
    assert [(f["filename"], f["hashes"]["sha256"], f["size"]) for f in listing["files"]] == [
        (built.path.name, built.sha256, built.path.stat().st_size)]
    assert 'href="vllm/"' in (simple / "index.html").read_text()


def test_pip_installs_the_wheel_and_status_names_its_patches(built, installed):
    _, site = installed
    assert (site / f"vllm-{built.manifest.version}.dist-info" / "patchkit.json").is_file()
    result = CliRunner().invoke(main, ["status", "--target", str(site), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    states = {p["id"]: p["state"] for p in report["patches"]}
    assert {p.id: states[p.id] for p in built.manifest.patches} == {p.id: "applied" for p in built.manifest.patches}
    (wheel,) = report["wheels"]
    assert wheel["version"] == built.manifest.version
    assert [(p["id"], p["digest"]) for p in wheel["patches"]] == [(p.id, p.digest) for p in built.manifest.patches]
    text = CliRunner().invoke(main, ["status", "--target", str(site)]).output
    assert f"installed from a patched wheel: vllm {built.manifest.version}" in text
    assert all(f"carries {p.id} " in text for p in built.manifest.patches)


@pytest.mark.parametrize("module", BEHAVIOUR)
def test_behaviour_tests_pass_on_the_installed_wheel(installed, module):
    python, site = installed
    env = {**os.environ, "PATCHKIT_WHEEL_PYTHON": str(python), "PATCHKIT_WHEEL_SITE": str(site),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PATCHKIT_TEST_EXCLUDE", None)
    env.pop("PATCHKIT_RESULTS", None)  # a nested run must not overwrite the record of the run it is part of
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-p", "installed_wheel",
         str(REPO / "tests" / "patches" / module)],
        check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary, summary



def test_the_wheel_commands_in_the_publish_workflow_are_valid_invocations(tmp_path, monkeypatch):
    """Each `patchkit wheel ...` line of publish.yml parses with the real command's options."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dist" / "wheels").mkdir(parents=True)  # what the build step leaves for the index step
    text = (REPO / ".github" / "workflows" / "publish.yml").read_text().replace("\\\n", " ")
    lines = re.findall(r"patchkit wheel (build|index) ([^\n>]*)", text)
    assert {command for command, _ in lines} == {"build", "index"}, lines
    for command, args in lines:
        context = wheel_group.commands[command].make_context(command, shlex.split(args))
        assert context.params["output"] is not None


# --- the release wheel the index offers -------------------------------------------------------------------


def test_a_platform_patchkit_builds_no_wheels_for_is_refused(tmp_path):
    with pytest.raises(UnknownPlatform) as err:
        release_wheel(VERSION, "ppc64le", cache_root=tmp_path)
    assert err.value.arch == "ppc64le" and not (tmp_path / "wheels").exists()


def test_an_index_listing_no_or_several_wheels_for_the_platform_is_refused(recorded_index):
    """The recorded page (a real index's answer, served on 127.0.0.1) lists flashinfer-python's wheels, every
    one py3-none-any: none is manylinux aarch64. Then two manylinux aarch64 wheels of one version, in a page
    the fake index writes (HAND-WRITTEN: no recorded page lists two; a real index may, one per glibc)."""
    with pytest.raises(NoReleaseWheel) as err:
        choose_wheel("flashinfer-python", "0.7.2.post1", "aarch64")
    assert (err.value.page, err.value.dist, err.value.version, err.value.arch, err.value.found) == (
        f"{recorded_index.url}/flashinfer-python/", "flashinfer-python", "0.7.2.post1", "aarch64", 0)
    assert err.value.listed == ["flashinfer_python-0.7.2.post1-py3-none-any.whl"]
    twins = [f"vllm-0.34.0-cp38-abi3-manylinux_2_{glibc}_aarch64.whl" for glibc in (28, 34)]
    for name in twins:
        recorded_index.add("vllm", name, name.encode())
    with pytest.raises(NoReleaseWheel) as err:
        choose_wheel("vllm", "0.34.0", "aarch64")
    assert (err.value.found, err.value.listed) == (2, twins)


def test_a_wheel_the_index_gives_no_sha256_for_is_refused(recorded_index):
    """HAND-WRITTEN page entry: the one aarch64 wheel listed without a sha256 (PEP 691 lets `hashes` be empty;
    no recorded page here has such a file)."""
    name = "vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl"
    recorded_index.add("vllm", name, b"unverifiable")
    recorded_index.projects["vllm"][0]["hashes"] = {}
    with pytest.raises(UnverifiableWheel) as err:
        choose_wheel("vllm", "0.34.0", "aarch64")
    assert err.value.url == f"{recorded_index.url.removesuffix('/simple')}/files/{name}"  # resolved against the page
