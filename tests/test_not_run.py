"""The closing summary names every skip reason, its count and the command that enables those tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_skips_are_summarised_with_the_enabling_command(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "def test_a(): pytest.skip('skopeo is not installed (apt-get install skopeo): layouts unchecked')\n"
        "def test_b(): pytest.skip('skopeo is not installed (apt-get install skopeo): layouts unchecked')\n"
        "def test_c(): pytest.skip('needs a GPU')\n"
        "def test_d(): pass\n"
    )
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "not_run", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(HERE), "PATH": ""}, check=False)
    out = proc.stdout
    assert "what did not run" in out
    assert "   2 test(s): skopeo is not installed (apt-get install skopeo): layouts unchecked" in out
    assert "to run them: apt-get install skopeo" in out
    assert "   1 test(s): needs a GPU" in out


def test_a_run_without_skips_prints_no_summary(tmp_path):
    (tmp_path / "test_some.py").write_text("def test_d(): pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "not_run", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(HERE), "PATH": ""}, check=False)
    assert proc.returncode == 0 and "what did not run" not in proc.stdout
