"""The stock tree's outcomes remembered, so that a gate run whose inputs match an earlier one runs only the
patched tree (CI's gate: the stock half was ~6 of its 13 minutes, the same answer every run).

The stock tree is the installed release with no patch, so its outcomes are a function of what the key
holds: the release and its sdist, the installed vLLM's RECORD, the interpreter and every installed
distribution, the test paths and ids, the workers, the test environment, and the gate's own runner and
plugin. A remembered outcome cannot make a regression pass unseen where it differs from the patched tree:
every differing id reruns on both trees, fresh, before it counts (gate/__main__.py). What the key cannot
see is a stock outcome that changes with nothing in it changing (a flaky or clock-dependent test, a model
appearing in the Hub cache); `--fresh` runs stock every time, and the daily workflow passes it.

The file lives in the gate's workspace (patchkit's user cache): a file that does not decode as outcomes,
or whose key differs, is no memo and the stock tree runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from importlib.metadata import distribution, distributions
from pathlib import Path

import msgspec

from patchkit.errors import PatchkitError
from patchkit.gate import plugin, run
from patchkit.localfiles import atomic_write
from patchkit.untrusted import read_file

OUTCOMES = frozenset({"passed", "failed", "error", "skipped", "xfailed", "xpassed"})
# Environment variables that change what vLLM's tests do on CPU (devices, vLLM's own settings, the Hub).
_ENV_PREFIXES = ("VLLM_", "CUDA_", "HF_", "TRANSFORMERS_", "TORCH")


class Memo(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    finished: str
    seconds: int
    outcomes: dict[str, str]


def stock_key(ws: run.Workspace, paths: list[str], workers: int) -> str | None:
    """The sha256 of everything the stock tree's outcomes depend on (the module's docstring says what);
    None where the installed vLLM has no RECORD to say what its files are (then nothing is remembered)."""
    record = distribution("vllm").read_text("RECORD")
    if record is None:
        return None
    inputs = {
        "release": ws.release,
        "sdist": (ws.tests_root / ".patchkit-sdist").read_text(),
        "vllm_record": hashlib.sha256(record.encode()).hexdigest(),
        "python": sys.version,
        "distributions": sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()),
        "paths": paths, "workers": workers,
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)) + sorted(run.TEST_ENV.items()),
        "runner": [hashlib.sha256(Path(str(m.__file__)).read_bytes()).hexdigest() for m in (run, plugin)],
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _path(ws: run.Workspace) -> Path:
    return ws.root / "memo" / "stock.json"


def recall(ws: run.Workspace, key: str | None) -> Memo | None:
    """The remembered stock outcomes under `key`; None where there are none, another key's, or a file that
    does not decode as outcomes (then the stock tree runs and the file is written again)."""
    try:
        data = read_file(_path(ws), "run-record", "the gate's remembered stock outcomes")
        memo = msgspec.json.decode(data, type=Memo)
    except (PatchkitError, msgspec.ValidationError, msgspec.DecodeError):  # missing, oversized or not a memo
        return None
    if key is None or memo.key != key or not memo.outcomes or not set(memo.outcomes.values()) <= OUTCOMES:
        return None
    return memo


def remember(ws: run.Workspace, key: str | None, outcomes: dict[str, str], seconds: int) -> None:
    """Keep the stock tree's outcomes under `key` (written whole: a run cut off leaves the old file or none)."""
    if key is None:
        return
    finished = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    atomic_write(_path(ws), msgspec.json.encode(Memo(key, finished, seconds, outcomes)))
