"""pytest plugin: the patch behaviour tests against a patched wheel pip installed into another environment.

tests/test_wheels.py runs `pytest --noconftest -p installed_wheel tests/patches/test_<patch>.py` with
PATCHKIT_WHEEL_PYTHON (that environment's interpreter) and PATCHKIT_WHEEL_SITE (its site-packages). This
plugin takes the place of tests/conftest.py: it registers every fixture and hook of it, and replaces one,
`patched_vllm`, by the installed wheel (probes run in its interpreter); `stock_vllm` stays this
interpreter's own, unpatched vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # probes, builders: as for tests/conftest.py

from conftest import *  # noqa: F403  # its fixtures and hooks, registered through this plugin
from conftest import VllmTree


@pytest.fixture(scope="session")
def patched_vllm() -> VllmTree:
    python, site = os.environ["PATCHKIT_WHEEL_PYTHON"], Path(os.environ["PATCHKIT_WHEEL_SITE"])
    code = "import json, vllm, importlib.metadata as m; print(json.dumps([vllm.__file__, m.version('vllm')]))"
    where, version = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                               check=True).stdout)
    assert Path(where).is_relative_to(site) and "+glm53." in version, (where, version)
    return VllmTree(root=site, python=python)
