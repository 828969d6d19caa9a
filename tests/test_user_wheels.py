"""A wheel a person gives (`patchkit check --source x.whl`, `diff`) is verified against its RECORD as a
release wheel is (issue 32): one wheel source, sources.wheel over sources.verified_wheel.

Every wheel here is vLLM 0.33.0's real x86_64 release wheel (the user cache's copy of the index's file, as
in test_wheels.py, hence `network`), copied and tampered with by zipfile's append mode from outside
patchkit: a member replaced or added is written after the others and the central directory rewritten,
the other 5,800 members' bytes untouched. The real CLI runs on each: the untampered copy plans the real
series; each tampered one is refused with exit 2 before any patch is planned, the message naming the
wheel, the member, what RECORD says and what was found.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from patchkit.cli.main import main
from patchkit.sources.spec import open_source
from patchkit.sources.verified_wheel import BadWheel
from patchkit.wheels.release import release_wheel
from wheel_files import record_hash

pytestmark = [pytest.mark.network, pytest.mark.vllm]

VERSION = "0.33.0"
DIST_INFO = f"vllm-{VERSION}.dist-info"
RECORD = f"{DIST_INFO}/RECORD"
TARGET = "vllm/models/glm5next/common/model.py"  # a file the series patches (naming-shim, kda-fp32-taps)


@pytest.fixture(scope="module")
def real_wheel() -> Path:
    return release_wheel(VERSION, "x86_64", progress=False)


@pytest.fixture
def folder(tmp_path):
    """Where a tampered copy (336 MB) is written; removed after the test, not kept for three runs."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def tampered(real: Path, folder: Path, *, replace: dict[str, bytes] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of `real` under its own file name, `drop` left out of its central directory and `replace`
    (name -> bytes) written after the other members (a name already there: the old entry left out)."""
    path = folder / real.name
    shutil.copyfile(real, path)
    replace = replace or {}
    with zipfile.ZipFile(path, "a") as archive:
        for name in (*drop, *replace):
            if name in archive.NameToInfo:  # out of the central directory zipfile writes at close
                archive.filelist.remove(archive.NameToInfo.pop(name))
        archive._didModify = True  # zipfile's own flag: it rewrites the central directory only after a write
        for name, data in replace.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return path


def read(real: Path, name: str) -> bytes:
    with zipfile.ZipFile(real) as archive:
        return archive.read(name)


def rows(real: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(read(real, RECORD).decode())))


def as_record(table: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    return out.getvalue().encode()


def run(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "10000"})


def assert_refused(result, path: Path, *needles: str) -> None:
    """Exit 2, one message naming the wheel and each needle, no report and no traceback."""
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    for needle in (str(path), *needles):
        assert needle in message, (needle, message)
    assert "Traceback" not in result.output and "applies" not in result.stdout


def check_json(path: Path) -> dict:
    result = run("check", "--source", str(path), "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_untampered_real_wheel_plans_the_series(real_wheel):
    report = check_json(real_wheel)
    assert report["ok"] and report["versions"] == {"vllm": VERSION}
    assert report["source"] == f"vllm {VERSION} wheel ({real_wheel})"
    change = next(c for c in report["changes"] if f"vllm/{c['path']}" == TARGET)
    assert change["old_sha256"] == hashlib.sha256(read(real_wheel, TARGET)).hexdigest()  # planned on its bytes


def test_a_member_rewritten_with_its_own_bytes_still_plans(real_wheel, folder):
    """The control for every attack below: the tampering itself (a member moved to the end, deflated
    afresh, the central directory rewritten) leaves a wheel that verifies; only what changes is refused."""
    path = tampered(real_wheel, folder, replace={TARGET: read(real_wheel, TARGET)})
    assert check_json(path)["changes"] == check_json(real_wheel)["changes"]


def test_a_member_whose_bytes_differ_from_its_record_row_is_refused(real_wheel, folder):
    stock = read(real_wheel, TARGET)
    changed = stock + b"\nimport os; os.system('echo owned')\n"
    listed = next(r for r in rows(real_wheel) if r[0] == TARGET)[1]
    path = tampered(real_wheel, folder, replace={TARGET: changed})
    for command in ("check", "diff"):
        result = run(command, "--source", str(path))
        assert_refused(result, path, f"member {TARGET!r}", f"RECORD says {listed}",
                       f"its bytes hash to {record_hash(changed)}")
    assert result.stdout == ""  # diff: not a line of a patch printed


def test_a_member_record_does_not_list_is_refused(real_wheel, folder):
    path = tampered(real_wheel, folder, replace={"vllm/backdoor.py": b"import os\n"})
    assert_refused(run("check", "--source", str(path)), path, "member 'vllm/backdoor.py'",
                   f"not in {RECORD} (1 such, first ['vllm/backdoor.py'])")


def test_a_wheel_without_record_is_refused(real_wheel, folder):
    path = tampered(real_wheel, folder, drop=(RECORD,))
    assert_refused(run("check", "--source", str(path)), path, f"no {RECORD}: nothing to verify its members against")


def test_a_member_record_lists_but_the_wheel_lacks_is_refused(real_wheel, folder):
    path = tampered(real_wheel, folder, drop=(TARGET,))
    assert_refused(run("check", "--source", str(path)), path, f"member {TARGET!r}",
                   f"{RECORD} lists 1 file(s) the zip does not hold")


@pytest.mark.parametrize("bad", ["md5=" + "A" * 22, "sha256=not+base64/url", "sha256"])
def test_a_record_row_without_a_sha256_or_better_hash_is_refused(real_wheel, folder, bad):
    """md5 is what pip's hash checking refuses; a digest not urlsafe base64, or none, verifies nothing."""
    table = [[name, bad if name == TARGET else digest, size] for name, digest, size in rows(real_wheel)]
    path = tampered(real_wheel, folder, replace={RECORD: as_record(table)})
    assert_refused(run("check", "--source", str(path)), path, f"{RECORD}'s row for {TARGET!r} is not",
                   repr(bad))


@pytest.mark.parametrize("name", ["../../outside/sitecustomize.py", "/etc/cron.d/patchkit", "vllm/../../evil.py"])
def test_a_member_path_that_escapes_is_refused(real_wheel, folder, name):
    table = [*rows(real_wheel)[:-1], [name, record_hash(b"x\n"), "2"], [RECORD, "", ""]]
    path = tampered(real_wheel, folder, replace={name: b"x\n", RECORD: as_record(table)})
    result = run("check", "--source", str(path))
    assert_refused(result, path, f"member {name!r}")
    assert "'..' part" in result.stderr or "absolute path" in result.stderr


def test_a_refusal_is_a_bad_wheel_with_its_fields_and_the_users_file_stays(real_wheel, folder):
    changed = read(real_wheel, TARGET).replace(b"def ", b"def  ", 1)
    path = tampered(real_wheel, folder, replace={TARGET: changed})
    with pytest.raises(BadWheel) as refused:
        open_source(str(path))
    assert (refused.value.wheel, refused.value.problem, refused.value.member, refused.value.removed) == (
        str(path), "hash", TARGET, False)
    assert path.is_file()  # a person's file is never deleted
