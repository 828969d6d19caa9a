"""Stock and patched copies of the real installed vLLM, each runnable in a fresh interpreter.

The patched copy is made the way a user makes one: the vLLM package is copied (hard links: patchkit
replaces files by rename, so the installed originals are never touched) and the default series is
applied by patchkit itself. Probes run in subprocesses because a module imported once cannot be
swapped for its patched twin in the same interpreter.

PATCHKIT_TEST_EXCLUDE=id1,id2 leaves patches out of the patched copy: each behaviour test must then fail.

The release under test is whichever vLLM is installed: noxfile.py builds one environment per supported
release and runs the release-sensitive tests in each. `vllm_release` and `vllm_layout` tell a test which
release and GLM source layout it is looking at; a test meaningful on only some releases skips on the
others with the reason in its code (tests/ran_where.py then refuses a release inside a patch's range
where none of its behaviour tests passed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from packaging.version import Version

from patchkit.patching.copies import patched_copy
from probes import GlmLayout, glm_layout, patches_under_test

REPO = Path(__file__).resolve().parents[1]
# Fuzz depth (tests/hostile.py): a bounded run in `nox -s tests`, a longer one in the daily `nox -s fuzz`.
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("daily", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# The registry client's retry waits (oci/transport.py: 0.5 s doubling) kept short for every test and the
# CLI runs they start: a test of an unreachable registry must not wait out the real backoff (the retry
# tests, tests/test_registry_faults.py, count the attempts; the policy's numbers are its own).
os.environ.setdefault("PATCHKIT_REGISTRY_BACKOFF_S", "0.01")
pytest_plugins = [
    "not_run",  # the closing "what did not run" summary
    "release_record",  # PATCHKIT_RESULTS: each test's outcome on the installed release, for tests/ran_where.py
]


@dataclass
class VllmTree:
    root: Path | None  # site-packages-like dir holding vllm/; None = the interpreter's own install
    python: str

    def run(self, code: str, *, env: dict[str, str] | None = None, timeout: int = 900):
        """Run code with this tree's vllm importable; return the JSON on its last stdout line."""
        full_env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", **(env or {})}
        if self.root is not None:
            full_env["PYTHONPATH"] = os.pathsep.join([str(self.root), full_env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [self.python, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout,
            cwd=self.root or REPO,
        )
        if proc.returncode != 0:
            raise AssertionError(f"probe failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if not lines:
            raise AssertionError(f"probe printed nothing; stderr:\n{proc.stderr[-4000:]}")
        return json.loads(lines[-1])


def _installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        message = "vLLM is not installed in this interpreter (run the tests through `nox -s tests`)"
        if os.environ.get("PATCHKIT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def stock_vllm() -> VllmTree:
    _installed_vllm()
    return VllmTree(root=None, python=sys.executable)


@pytest.fixture(scope="session")
def patched_vllm(tmp_path_factory) -> VllmTree:
    installed = _installed_vllm()
    site = tmp_path_factory.mktemp("patched-site")
    excluded = {i for i in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",") if i}
    patchset = patches_under_test()  # patchkit rebase: a rebased set
    patched_copy(installed, site, [p for p in patchset.series() if p.id not in excluded])
    return VllmTree(root=site, python=sys.executable)



@pytest.fixture(scope="session")
def vllm_release() -> Version:
    """The installed vLLM's version: the release under test (stock and patched trees are copies of it)."""
    from importlib.metadata import version

    _installed_vllm()
    return Version(version("vllm"))


@pytest.fixture(scope="session")
def vllm_layout() -> GlmLayout:
    """Where the release under test keeps GLM-5.3's model code (tests/probes.py GlmLayout)."""
    return glm_layout(_installed_vllm())
