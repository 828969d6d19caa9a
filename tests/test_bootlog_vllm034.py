"""The boot-log doctor on vLLM 0.34.0's new GB10 failures, from 0.34.0's own code and messages.

FlashKDA (the default KDA prefill on 12.x, imported without a fallback) and DeepGEMM switched off for
want of nvcc: each cause is read off lines made the way a real boot makes them. The statements and
format strings come out of the released 0.34.0 sdist (through patchkit.sources, cached); the failures
are raised by the real interpreter, the real torch and the real aarch64 `_flashkda_C.abi3.so` of the
0.34.0 wheel (which cannot load on this x86_64 machine: the loader's own words); and every line is
written by vLLM's own logger (the installed release's `vllm.logger`, whose format 0.34.0 keeps), the
traceback prefixed line by line as an engine core logs it. No GPU here, so the launch itself is not
run: its cause is read off the traceback line of the real op call.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from patchkit.bootlog.causes import CAUSE, find_causes
from patchkit.bootlog.judge import judge_log
from patchkit.sources import ArchiveCache
from patchkit.sources.release import open_release

KDA = "models/glm5next/common/kda.py"
DEEP_GEMM = "utils/deep_gemm.py"
ENGINE = "vllm.v1.engine.core"  # the logger an engine core's failure goes through


def _source(path: str) -> str:
    source = open_release("vllm", "0.34.0", cache=ArchiveCache(), progress=False)
    return (source.read_many("vllm", [path])[path] or b"").decode()


def _statement(tree: ast.Module, text: str, want) -> str:
    """The source of the first statement `want(node)` picks, as written in the release."""
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.stmt) and want(n))
    segment = ast.get_source_segment(text, node)
    assert segment, "no source segment"
    return segment


def _logged(script: str, tmp: Path, pythonpath: Path | None = None) -> str:
    """What vLLM's logger prints when `script` runs: in the vLLM environment's interpreter, a fresh process."""
    path = tmp / "boot.py"
    path.write_text("from vllm.logger import _configure_vllm_root_logger, init_logger\n"
                    "_configure_vllm_root_logger()  # vLLM's bootstrap logging, from the environment\n"
                    f"logger = init_logger({ENGINE!r})\n{script}")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "VLLM_LOGGING_LEVEL": "INFO", "VLLM_CONFIGURE_LOGGING": "1"}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _engine_failure(body: str) -> str:
    """`body` run as an engine core's start is, its exception logged with the traceback as core.py logs it."""
    return "try:\n" + textwrap.indent(body, "    ") + "\nexcept Exception:\n    logger.exception('EngineCore failed to start.')\n"


@pytest.fixture(scope="module")
def kda() -> tuple[str, ast.Module]:
    text = _source(KDA)
    return text, ast.parse(text)


@pytest.mark.network
@pytest.mark.vllm
def test_flashkdas_unguarded_import_failing_names_the_triton_fallback(kda, tmp_path):
    """0.34.0's own import statement run in the installed vLLM: its real `_flashkda_C` fails to load here for
    want of the driver's libcuda.so.1 (a container started without the GPU's driver libraries), an error
    that names no FlashKDA, so the traceback's source line names it; and in a vllm package that carries no
    `_flashkda_C` (a build whose architectures FlashKDA does not cover)."""
    text, tree = kda
    stmt = _statement(tree, text, lambda n: isinstance(n, ast.Import) and n.names[0].name == "vllm._flashkda_C")
    (tmp_path / "kda_excerpt.py").write_text(stmt + "\n")
    (tmp_path / "empty").mkdir()
    for setup, said in (("", "ImportError: libcuda.so.1: cannot open shared object file"),
                        (f"import vllm\nvllm.__path__[:] = [{str(tmp_path / 'empty')!r}]\n",
                         "ModuleNotFoundError: No module named 'vllm._flashkda_C'")):
        log = _logged(setup + _engine_failure("import kda_excerpt"), tmp_path, tmp_path)
        assert said in log and "ERROR" in log.splitlines()[-1], log[-2000:]
        found = find_causes(log)
        assert found[0].cause == "flashkda-import", [f.cause for f in found]
        assert "--kda-prefill-backend triton" in found[0].fix
        verdict = judge_log(log, None)
        assert not verdict.ok and verdict.cause.cause == "flashkda-import"


@pytest.mark.network
@pytest.mark.vllm
def test_the_wheels_own_flashkda_library_that_cannot_load_is_named(kda, tmp_path):
    """The real `_flashkda_C.abi3.so` of the 0.34.0 aarch64 wheel imported through 0.34.0's statement: the
    dynamic loader refuses it here (another machine), as it refuses one whose CUDA libraries are missing."""
    from patchkit.wheels.release import release_wheel

    text, tree = kda
    stmt = _statement(tree, text, lambda n: isinstance(n, ast.Import) and n.names[0].name == "vllm._flashkda_C")
    ext = tmp_path / "ext"  # where the wheel's vllm/ puts it, added to the installed vllm package's path
    ext.mkdir()
    with zipfile.ZipFile(release_wheel("0.34.0", "aarch64", progress=False)) as wheel:
        (ext / "_flashkda_C.abi3.so").write_bytes(wheel.read("vllm/_flashkda_C.abi3.so"))
    (tmp_path / "kda_excerpt.py").write_text(stmt + "\n")
    script = f"import vllm\nvllm.__path__.insert(0, {str(ext)!r})\n" + _engine_failure("import kda_excerpt")
    log = _logged(script, tmp_path, tmp_path)
    assert "_flashkda_C.abi3.so: " in log and "ImportError" in log
    found = find_causes(log)
    assert found[0].cause == "flashkda-import" and "--kda-prefill-backend triton" in found[0].fix


@pytest.mark.network
@pytest.mark.vllm
def test_a_flashkda_op_that_raises_names_the_triton_fallback(kda, tmp_path):
    """0.34.0's workspace query, the first FlashKDA op a KDA layer runs, executed with the real torch where
    the library registered no ops: torch's own AttributeError, through the source line of the call."""
    text, tree = kda
    stmt = _statement(tree, text, lambda n: isinstance(n, ast.Assign) and "torch.ops._flashkda_C.get_workspace_size"
                      in (ast.get_source_segment(text, n) or ""))
    body = ("import torch, types\nmax_tokens, max_seqs = 8192, 256\nself = types.SimpleNamespace(local_num_heads=32)\n"
            + textwrap.dedent(stmt) + "\n")
    (tmp_path / "kda_excerpt.py").write_text(body)
    log = _logged(_engine_failure("import kda_excerpt"), tmp_path, tmp_path)
    assert "'_OpNamespace' '_flashkda_C' object has no attribute 'get_workspace_size'" in log
    found = find_causes(log)
    assert found[0].cause == "flashkda-launch", [f.cause for f in found]
    # The prefill launch's own call in 0.34.0 is the other line the cause reads.
    fwd = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.ops._flashkda_C.fwd")
    first = text.splitlines()[fwd.lineno - 1].strip()
    assert find_causes(f"ERROR 12-04 10:00:00 [core.py:1584]     {first}")[0].cause == "flashkda-launch"


def _deep_gemm_warnings() -> list[str]:
    """The format strings of the warnings 0.34.0's is_deep_gemm_supported logs (implicit concatenation joined)."""
    tree = ast.parse(_source(DEEP_GEMM))
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "is_deep_gemm_supported")
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and ast.unparse(n.func) == "logger.warning_once"]
    return [c.args[0].value for c in calls if isinstance(c.args[0], ast.Constant)]


@pytest.mark.network
@pytest.mark.vllm
def test_both_deep_gemm_disabled_warnings_are_read_with_the_nvcc_fix(tmp_path):
    formats = _deep_gemm_warnings()
    assert len(formats) == 2 and any("missing" in f for f in formats) and any("12.9" in f for f in formats)
    args = (12, 8, "/usr/local/cuda-12.8/bin/nvcc")  # the version warning's %d.%d at %s
    script = "".join(f"logger.warning_once({f!r}, *{args!r})\n" if "%" in f else f"logger.warning_once({f!r})\n"
                     for f in formats)
    # A boot that dies after it: the warning is the root cause, ahead of the engine's own death line.
    script += _engine_failure("raise RuntimeError('DeepGEMM JIT: CUDA toolkit not found')")
    log = _logged(script, tmp_path)
    lines = [line for line in log.splitlines() if "DeepGEMM kernels are disabled" in line]
    assert len(lines) == 2 and "found 12.8 at /usr/local/cuda-12.8/bin/nvcc" in lines[1]
    for line in lines:
        [found] = find_causes(line)
        assert found.cause == "deep-gemm-disabled" and "CUDA 13 toolkit" in found.fix and "CUDA_HOME" in found.fix
    verdict = judge_log(log, None)
    assert verdict.cause.cause == "deep-gemm-disabled" and not verdict.ok


def test_a_boot_that_survives_deep_gemm_disabled_warns_with_the_fix():
    """Not definitive: a boot that comes up is not failed by it, but the finding says what is off and the fix."""
    good = (Path(__file__).parent / "data" / "boot-logs" / "lab-good.log").read_text()
    verdict = judge_log(CAUSE["deep-gemm-disabled"].sample + "\n" + good, None)
    assert verdict.ok and verdict.cause is None
    [warned] = [f for f in verdict.findings if f.what == "deep gemm"]
    assert warned.level == "warn" and "install the CUDA 13 toolkit" in warned.detail


@pytest.mark.network
def test_the_deep_gemm_cause_names_no_release_before_0_34_0():
    """DeepGEMM's warning is 0.34.0's: absent from 0.33.0's same file. (FlashKDA's default on 12.x and its
    unguarded import are not new: every release from 0.30.0 carries them, which test_markers asserts.)"""
    source = open_release("vllm", "0.33.0", cache=ArchiveCache(), progress=False)
    for name in ("deep-gemm-disabled",):
        cause = CAUSE[name]
        assert cause.releases[0] == "0.34.0"
        paths = [f.removeprefix("vllm/") for f in cause.files]
        texts = [(d or b"").decode() for d in source.read_many("vllm", paths).values()]
        assert not any(cause.literal in t for t in texts), name


def test_doctor_names_the_flashkda_cause_and_fix_end_to_end(tmp_path):
    log = tmp_path / "boot.log"
    log.write_text(CAUSE["flashkda-import"].sample + "\n")
    run = subprocess.run([sys.executable, "-m", "patchkit", "doctor", "log", str(log), "--json"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    data = json.loads(run.stdout)
    assert data["cause"]["cause"] == "flashkda-import" and "--kda-prefill-backend triton" in data["cause"]["fix"]


@pytest.mark.network
def test_the_lines_0_34_0_stopped_printing_are_gone_from_its_sources():
    """The markers whose range ends before 0.34.0 (the V1 runner's lines, 0.34.0 removed that runner) stand
    in none of their files in 0.34.0: the range is the release's own evidence, not a guess."""
    from patchkit.bootlog.markers import MARKER, releases_before

    ended = [MARKER[name] for name in ("v2-runner", "mtp-v1", "drafter-v1")]
    assert all(m.releases == releases_before("0.34.0") and "0.34.0" not in m.releases for m in ended)
    source = open_release("vllm", "0.34.0", cache=ArchiveCache(), progress=False)
    for marker in ended:
        texts = source.read_many("vllm", [f.removeprefix("vllm/") for f in marker.files])
        assert not any(marker.literal in (d or b"").decode() for d in texts.values()), marker.name
