"""`patchkit doctor`'s command line: one subcommand per question (log, host, serving), the spellings from
before them still run as the subcommand they mean (saying which to write), and every table's fix, finding
and path printed whole at any terminal width (folded, never cut with "…").

Through the real CLI in a fresh interpreter with COLUMNS set, as a terminal of that width would be read;
`doctor host` runs this machine's real tools (tests/test_doctor_host.py), `doctor log` a recorded log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hostile import run_patchkit
from rendered_tables import column, squeezed

LOGS = Path(__file__).parent / "data" / "boot-logs"
ENGINE_DIES = LOGS / "4p67-engine-dies.log"  # a KeyError naming a tensor longer than a narrow column


@pytest.mark.parametrize("columns", [80, 200])
def test_doctor_host_prints_every_fix_and_finding_whole(columns):
    """The fixes a user copies (`export TORCH_CUDA_ARCH_LIST=12.1a ...`) and what was found (a socket's
    path) are in the table whole, as --json has them, at 80 and at 200 columns."""
    data = json.loads(run_patchkit("doctor", "host", "--json", timeout=120).stdout)
    checks = data["hosts"][0]["checks"]
    table = run_patchkit("doctor", "host", env={"COLUMNS": str(columns)}, timeout=120)
    assert table.code == 1 and "doctor host local: NOT READY" in table.stdout, table.output[-3000:]
    assert "…" not in table.stdout, table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= columns
    fixes, found = column(table.stdout, "fix"), _figures_masked(column(table.stdout, "found"))
    arch = next(c for c in checks if c["name"] == "TORCH_CUDA_ARCH_LIST")
    assert arch["fix"].startswith("export TORCH_CUDA_ARCH_LIST=12.1a ")
    for check in checks:
        assert squeezed(check["fix"]) in fixes, (check, table.stdout)
        assert _figures_masked(squeezed(check["found"])) in found, (check, table.stdout)


def _figures_masked(text: str) -> str:
    """`text` with its numbers as `#`: the two runs measure this machine twice, and a live figure (the memory
    available: 19.0 GiB in one, 19.3 in the other, under CI's load) moves between them; the words are what
    must come back whole."""
    return re.sub(r"\d+(?:[.,]\d+)*", "#", text)


@pytest.mark.parametrize("columns", [80, 200])
def test_doctor_log_prints_the_failing_line_whole(columns):
    """A finding's detail holds the log line with the tensor's full name: at 80 columns it was cut to
    'in_proj_qkvb…'."""
    verdict = json.loads(run_patchkit("doctor", "log", str(ENGINE_DIES), "--json").stdout)
    tensor = "'language_model.model.layers.0.self_attn.in_proj_qkvbfg_a.weight_scale'"
    assert tensor in verdict["cause"]["line"]
    table = run_patchkit("doctor", "log", str(ENGINE_DIES), env={"COLUMNS": str(columns)})
    assert table.code == 1 and "FAILED BOOT" in table.stdout, table.output[-3000:]
    assert "…" not in table.stdout, table.stdout
    details = column(table.stdout, "detail")
    assert squeezed(tensor) in details
    for finding in verdict["findings"]:
        assert squeezed(finding["detail"]) in details, finding


@pytest.mark.parametrize(("old", "new"), [
    (["doctor", str(ENGINE_DIES), "--json"], ["doctor", "log", str(ENGINE_DIES), "--json"]),
    (["doctor", "-", "--json"], ["doctor", "log", "-", "--json"]),  # a log on stdin
    (["doctor", "--host", "--variant", "lab", "--json"], ["doctor", "host", "local", "--variant", "lab", "--json"]),
    (["doctor", "--host=ssh://spark1:x22", "--json"], ["doctor", "host", "ssh://spark1:x22", "--json"]),
    (["doctor", "--serving", "ftp://127.0.0.1:8000", "--model", "m"],
     ["doctor", "serving", "ftp://127.0.0.1:8000", "--model", "m"]),
])
def test_the_old_spellings_run_as_their_subcommand_and_say_so(old, new):
    """A script written before the subcommands gets the same exit code and output as the new spelling, and
    stderr names the command to write instead."""
    stdin = ENGINE_DIES.read_bytes()
    before, after = run_patchkit(*old, stdin=stdin, timeout=120), run_patchkit(*new, stdin=stdin, timeout=120)
    assert f"deprecated; use `patchkit {' '.join(new)}`" in before.stderr, before.stderr
    assert "deprecated" not in after.stderr
    assert before.code == after.code != 0, (before.output[-2000:], after.output[-2000:])
    if "--json" in new and "host" not in new:  # a host's free memory moves between two runs
        assert before.stdout == after.stdout
    elif "host" in new and before.code == 1:
        names = [[c["name"] for c in h["checks"]] for h in json.loads(before.stdout)["hosts"]]
        assert names == [[c["name"] for c in h["checks"]] for h in json.loads(after.stdout)["hosts"]]
    else:
        assert before.stderr.splitlines()[1:] == after.stderr.splitlines(), before.stderr


def test_each_subcommand_takes_only_its_own_options():
    for args, option in ((["log", "x.log", "--host"], "--host"), (["host", "--cut-short"], "--cut-short"),
                         (["serving", "http://127.0.0.1:1", "--image", "i"], "--image"),
                         (["log", "x.log", "--model", "m"], "--model")):
        refused = run_patchkit("doctor", *args)
        assert refused.code == 2 and f"No such option '{option}'" in refused.stderr, refused.output
    bare = run_patchkit("doctor")
    assert bare.code == 2 and all(name in bare.stderr for name in ("log", "host", "serving")), bare.output


def test_doctor_serving_refuses_what_is_no_server_url_and_a_missing_model():
    from patchkit.cli.doctor import NotAServerUrl, _doctor_serving

    for url in ("ftp://127.0.0.1:8000", "http://127.0.0.1:8000/v1", "http://"):
        with pytest.raises(NotAServerUrl) as refused:
            _doctor_serving(url, "m", None, None, False)
        assert refused.value.url == url
    bad = run_patchkit("doctor", "serving", "ftp://127.0.0.1:8000", "--model", "m", "--json")
    assert bad.code == 2 and json.loads(bad.stdout)["error"]["kind"] == "error"
    assert "give the server's base URL" in bad.stderr
    unnamed = run_patchkit("doctor", "serving", "http://127.0.0.1:1", "--json")  # a usage error: no model
    assert unnamed.code == 2 and json.loads(unnamed.stdout)["error"]["kind"] == "usage"
    assert "give --model NAME or --variant V" in unnamed.stderr and "Traceback" not in unnamed.stderr
