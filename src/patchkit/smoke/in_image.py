"""The checks of the in-image proof that only the image's own Python can make, run inside the image
(`python3 -m patchkit.smoke.in_image JOB.json`, standard library only: it runs on whatever Python the
image has). One process, so the image's torch is imported once for everything:

- each patched file: its bytes are the series' (sha256), its module resolves to that very file through
  the image's import system (no package, extension module or earlier sys.path entry shadowing it), and
  bytecode the interpreter would use instead of the source (its __pycache__ entry, when valid for that
  source or unchecked) compiles to the same code as the source;
- the imports the job names (vllm itself, each patched module);
- each extra wheel: every file its RECORD lists is there with its sha256, every native module has a
  suffix this interpreter loads, and its modules import (native ones included);
- the CPU load smoke's quantprobe (patchkit.smoke.quantprobe.probe) on the job's checkpoints.

Prints one JSON object: {"python", "checks": [{"name", "ok", "detail"}], "tables"}.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import marshal
import os
import sys
import traceback
from pathlib import Path


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _error() -> str:
    lines = traceback.format_exc().strip().splitlines()
    return " | ".join(lines[-3:])


def _used_bytecode(source_path: str, source: bytes) -> tuple[str, bytes] | None:
    """(pyc path, its bytes) when the interpreter would run that cached bytecode for `source_path`."""
    try:
        cached = importlib.util.cache_from_source(source_path)
    except NotImplementedError:
        return None
    if not os.path.isfile(cached):
        return None
    data = Path(cached).read_bytes()
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags & 0b1:  # hash-based: used unchecked, or when its hash is the source's
        if not flags & 0b10:
            return cached, data
        return (cached, data) if data[8:16] == importlib.util.source_hash(source) else None
    st = os.stat(source_path)
    mtime, size = int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")
    return (cached, data) if (mtime, size) == (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF) else None


def check_patched(entry: dict) -> list[dict]:
    name, path, want = entry["module"], entry["path"], entry["sha256"]
    out = []
    if not os.path.isfile(path):
        return [{"name": f"file {path}", "ok": False, "detail": f"{path} is not in the image (the series patches it there)"}]
    got = _sha256(path)
    out.append({"name": f"file {path}", "ok": got == want,
                "detail": "the series' bytes" if got == want else f"{path}: sha256 {got}, the series' is {want}"})
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        return [*out, {"name": f"resolve {name}", "ok": False, "detail": f"{path}: resolving {name} failed: {_error()}"}]
    origin = spec.origin if spec else None
    if origin != path:
        out.append({"name": f"resolve {name}", "ok": False,
                    "detail": f"{name} loads from {origin}, not the patched {path}: something shadows it"})
        return out
    out.append({"name": f"resolve {name}", "ok": True, "detail": path})
    source = Path(path).read_bytes()
    used = _used_bytecode(path, source)
    if used is not None:
        pyc, data = used
        same = marshal.loads(data[16:]) == compile(source, path, "exec", dont_inherit=True)
        out.append({"name": f"bytecode {pyc}", "ok": same,
                    "detail": "compiles from the patched source" if same else
                    f"{pyc} is used instead of {path} and holds other code: a stub over the patched module"})
    return out


def check_import(name: str) -> dict:
    try:
        module = importlib.import_module(name)
    except Exception:
        return {"name": f"import {name}", "ok": False, "detail": f"import {name} failed: {_error()}"}
    return {"name": f"import {name}", "ok": True, "detail": str(getattr(module, "__file__", ""))}


def _record(dist_info: str) -> list[tuple[str, str]]:
    rows = []
    for line in Path(dist_info, "RECORD").read_text().splitlines():
        path, _, rest = line.partition(",")
        digest = rest.split(",")[0]
        if path:
            rows.append((path, digest))
    return rows


def check_wheel(entry: dict) -> list[dict]:
    """An extra wheel as installed: RECORD against the files, native suffixes, its modules imported."""
    site, dist_info = entry["site"], entry["dist_info"]
    label = f"wheel {entry['name']}"
    if not os.path.isdir(os.path.join(site, dist_info)):
        return [{"name": label, "ok": False, "detail": f"{site}/{dist_info} is not in the image"}]
    out = []
    bad = []
    natives = []
    for rel, digest in _record(os.path.join(site, dist_info)):
        full = os.path.normpath(os.path.join(site, rel))
        if not digest:
            continue
        algo, _, want = digest.partition("=")
        if not os.path.isfile(full):
            bad.append(f"{full} missing")
            continue
        got = base64.urlsafe_b64encode(hashlib.new(algo, Path(full).read_bytes()).digest()).rstrip(b"=").decode()
        if got != want:
            bad.append(f"{full}: {algo} differs from RECORD")
        if full.endswith(".so") and full.startswith(site + "/"):
            natives.append(full)
    out.append({"name": f"{label} RECORD", "ok": not bad, "detail": "; ".join(bad) or "every file as RECORD lists it"})
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    modules = list(entry.get("modules") or [])
    for native in natives:
        rel = native[len(site) + 1:]
        # A module's name holds no dot, so all after the first dot of the file name is its suffix: a
        # `.cpython-312-...so` is another Python's even though it ends in `.so`, which this one also loads.
        suffix = "." + os.path.basename(rel).partition(".")[2]
        if suffix not in suffixes:
            out.append({"name": f"native {native}", "ok": False,
                        "detail": f"{native}: a native module this Python ({sys.implementation.cache_tag}) does not "
                                  f"load, its suffixes are {', '.join(suffixes)}: built for another Python"})
            continue
        modules.append(rel[: -len(suffix)].replace("/", "."))
    out += [check_import(m) for m in dict.fromkeys(modules)]
    return out


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    checks = []
    for entry in job.get("patched", []):
        checks += check_patched(entry)
    checks += [check_import(name) for name in job.get("imports", [])]
    for entry in job.get("wheels", []):
        checks += check_wheel(entry)
    tables = None
    if job.get("probe"):
        try:
            from patchkit.smoke.quantprobe import probe

            tables = probe(job["probe"])
        except Exception:
            checks.append({"name": "cpu load smoke", "ok": False, "detail": f"the quantprobe worker failed: {_error()}"})
    print(json.dumps({"python": sys.version.split()[0], "checks": checks, "tables": tables}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
