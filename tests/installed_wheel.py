"""pytest plugin: the patch behaviour tests against a patched wheel pip installed into another environment.

tests/test_wheels.py runs `pytest --noconftest -p installed_wheel tests/patches/test_<patch>.py` with
PATCHKIT_WHEEL_PYTHON (that environment's interpreter) and PATCHKIT_WHEEL_SITE (its site-packages). The
fixtures tests/conftest.py gives otherwise are replaced: `patched_vllm` is the installed wheel (probes run
in its interpreter), `stock_vllm` this interpreter's own, unpatched vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probes, builders: what tests/conftest.py provides

from conftest import VllmTree  # noqa: E402  (the class only; its fixtures are not registered)


@pytest.fixture(scope="session")
def stock_vllm() -> VllmTree:
    return VllmTree(root=None, python=sys.executable)


@pytest.fixture(scope="session")
def patched_vllm() -> VllmTree:
    python, site = os.environ["PATCHKIT_WHEEL_PYTHON"], Path(os.environ["PATCHKIT_WHEEL_SITE"])
    code = "import json, vllm, importlib.metadata as m; print(json.dumps([vllm.__file__, m.version('vllm')]))"
    where, version = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                               check=True).stdout)
    assert Path(where).is_relative_to(site) and "+glm53." in version, (where, version)
    return VllmTree(root=site, python=python)
