"""The run-time compiled half of the kernel census: compile, with the real nvcc, the kernels GB10 builds from
source (jit_units.py says which, from which release files, with which flags), read what ptxas says each uses
and judge it against GB10's limits: static + dynamic shared memory per block within the 101,376-byte opt-in,
registers within 255 a thread and a block's registers within the SM's 65,536.

A kernel whose request exceeds GB10 fails the check (exit 1), and so does a kernel whose request cannot be
read from its release's source (no budget known, a launch site more than the gates seen): a census that
guesses would pass a release it cannot judge. A kernel its host refuses on GB10 (raises, no fallback) passes
only where the release's own Python shows GLM-5.3's path never calls it (reach.py, the file:lines in the row's
`evidence`). No nvcc, no torch headers for vLLM's translation unit, a
source that does not compile for a missing header: exit 2, nothing judged.

Compiled once per (sdist sha256, unit, nvcc version, flags, torch version): the ptxas report and the
budget constants are kept in the user cache dir under `jit-census/`, each record HMAC'd with the cache's key
(sources/cache.py) so a record written by anyone without that key is recompiled, never believed.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import importlib.util
import json
import math
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.bounded_process import run_bounded
from patchkit.cache_root import default_cache_root
from patchkit.census import ptxas
from patchkit.census.jit_units import (
    ARCHS,
    GB10_REGS_PER_SM,
    GB10_REGS_PER_THREAD,
    GB10_SMEM_OPTIN,
    GENCODE,
    REGISTER_UNIT,
    UNITS,
    Kernel,
    Unit,
)
from patchkit.census.reach import follow, lines, read_sources
from patchkit.errors import PatchkitError
from patchkit.sources.archives import TarGzArchive
from patchkit.sources.cache import ArchiveCache, atomic_write, user_secret
from patchkit.sources.release import ArchiveVanished, open_release
from patchkit.untrusted import read_file

COMPILE_TIMEOUT_S = 1800  # vLLM's topk.cu for both targets: ~3 min on a loaded 2-core machine


class CompileEnvironmentError(PatchkitError):
    """What the compile needs is not here (exit 2): the `missing` piece ("nvcc", "nvcc >= 12.9", "torch
    headers", or the header a source includes) and the `detail` that says what was looked for and found."""

    def __init__(self, missing: str, detail: str):
        self.missing, self.detail = missing, detail
        super().__init__(detail)


class SourceChanged(PatchkitError):
    """`what` (a release's source, as the census reads it) no longer has the shape the census reads: `expected`
    says what was looked for and `found` what is there (exit 2). A census row is never guessed from a changed
    source: the census's patterns (census/jit_units.py) follow the release first."""

    def __init__(self, what: str, expected: str, found: str):
        super().__init__(f"{what}: {expected}; {found}")
        self.what, self.expected, self.found = what, expected, found


class CompileTimedOut(PatchkitError):
    """`what` (nvcc and the ptxas it runs) was still running after `timeout` seconds and its process group was
    stopped (exit 2)."""

    def __init__(self, what: str, timeout: float):
        super().__init__(f"{what}: still running after {timeout:.0f} s, stopped")
        self.what, self.timeout = what, timeout


@dataclass
class Row:
    unit: str
    version: str
    kernel: str
    entry: str          # ptxas' mangled name; "" when the kernel was not compiled at all
    name: str           # demangled, without its parameters
    arch: str
    registers: int = 0
    spills: int = 0     # bytes, stores + loads
    static_smem: int = 0
    dynamic_smem: int = 0
    threads: int = 0
    verdict: str = ""
    ok: bool = False
    warnings: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # "file:lines: what it shows", where a verdict rests on them

    def to_dict(self) -> dict:
        return {**asdict(self), "limit_smem": GB10_SMEM_OPTIN}


def find_nvcc() -> tuple[str, str]:
    """nvcc and its `--version` text; exit 2 when there is none or it is older than sm_120f (CUDA 12.9)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileEnvironmentError(
            "nvcc", "nvcc not found on PATH: the run-time compiled half of the kernel census compiles the kernels "
            "with CUDA 13's nvcc (e.g. put /usr/local/cuda-13.0/bin on PATH); nothing was checked")
    code, text = _run([nvcc, "--version"], None, 60, "nvcc --version")
    found = re.search(r"release (\d+)\.(\d+)", text)
    if code != 0 or not found or (int(found.group(1)), int(found.group(2))) < (12, 9):
        raise CompileEnvironmentError("nvcc >= 12.9", f"{nvcc} --version: expected CUDA 12.9 or later (sm_120f, "
                                      f"sm_121a), found {text.strip()[-200:]!r}")
    return nvcc, text.strip()


def units_for(dist: str, version: str) -> list[Unit]:
    return [u for u in UNITS if u.dist == dist and Version(version) in SpecifierSet(u.versions)]


def census(dist: str, version: str, *, progress: bool = False) -> list[Row]:
    """Every unit of `dist` `version`'s layout compiled (or read from the cache) and judged."""
    nvcc, nvcc_version = find_nvcc()
    cache = ArchiveCache()
    source = open_release(dist, version, cache=cache, progress=progress)  # downloads and verifies once
    archive = cache.lookup(dist, version)
    if archive is None:  # verified a moment ago: another process dropped it from the cache meanwhile
        raise ArchiveVanished(f"{dist} {version}'s archive", cache.downloads)
    rows: list[Row] = []
    for unit in units_for(dist, version):
        kernels = [k for k in unit.kernels if not k.versions or Version(version) in SpecifierSet(k.versions)]
        torch = _torch() if unit.needs_torch else None
        key = _key(unit, kernels, archive.sha256, nvcc_version, torch)
        found = _cached(key)
        if found is None:
            found = _compile(unit, kernels, archive.path, nvcc, torch, f"{dist} {version}")
            _store(key, found)
        steps = {route.file for kernel in kernels for route in kernel.unreached}
        rows += judge(unit, kernels, version, found, read_sources(source, steps | set(unit.host)) if steps else {})
    return rows


def _torch() -> tuple[Path, str]:
    """torch's C++ include directory and version, from the torch this Python would import (not imported)."""
    spec = importlib.util.find_spec("torch")
    include = Path(spec.origin).parent / "include" if spec and spec.origin else None
    if include is None or not (include / "torch" / "csrc" / "stable").is_dir():
        raise CompileEnvironmentError(
            "torch headers", "compiling vLLM's topk.cu as its build does needs torch's C++ headers "
            "(torch/csrc/stable): no torch with them is importable by this Python; run in the release's environment "
            "or install torch")
    return include, importlib.metadata.version("torch")


def _cuda_wheel_includes(torch_include: Path) -> list[Path]:
    """The CUDA component headers torch's CUDA wheel brings (site-packages/nvidia/cu13/include: cublas_v2.h, which
    vLLM's torch_utils.h includes), where the toolkit itself lacks them."""
    return sorted(d for d in torch_include.parent.parent.glob("nvidia/cu*/include") if re.fullmatch(r"cu\d+", d.parent.name))


def _key(unit: Unit, kernels: list[Kernel], sha256: str, nvcc_version: str, torch) -> str:
    compiled = ("threads", "dynamic", "launcher", "instance")  # the rest only judges what was compiled
    spec = {"unit": {k: v for k, v in asdict(unit).items() if k not in ("kernels", "ignore", "why")},
            "kernels": [{f: getattr(k, f) for f in compiled} for k in kernels], "archive": sha256, "nvcc": nvcc_version,
            "archs": ARCHS, "torch": torch[1] if torch else None, "format": 1}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _cache_dir() -> Path:
    return default_cache_root() / "jit-census"


def _mac(key: str, record: dict) -> str:
    fields = json.dumps({"key": key, "ptxas": record["ptxas"], "budget": record["budget"], "host": record["host"],
                         "error": record.get("error")}, sort_keys=True)
    return hmac.new(user_secret(), fields.encode(), hashlib.sha256).hexdigest()


def _cached(key: str) -> dict | None:
    path = _cache_dir() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(read_file(path, "tool-output"))
        if isinstance(record, dict) and hmac.compare_digest(str(record.get("mac", "")), _mac(key, record)):
            return record
    except (PatchkitError, ValueError, KeyError, TypeError):
        pass
    return None  # unreadable or not ours: compiled again


def _store(key: str, record: dict) -> None:
    atomic_write(_cache_dir() / f"{key}.json", json.dumps({**record, "mac": _mac(key, record)}).encode())


def _compile(unit: Unit, kernels: list[Kernel], archive: Path, nvcc: str, torch, what: str) -> dict:
    """Lay out the sdist members the unit reads and compile them."""
    with tempfile.TemporaryDirectory(prefix="patchkit-jit-") as tmp:
        return compile_tree(unit, kernels, materialise(archive, unit.members, Path(tmp) / "src"), nvcc, torch, what)


def compile_tree(unit: Unit, kernels: list[Kernel], top: Path, nvcc: str, torch, what: str) -> dict:
    """Write the probe beside the source tree `top` and compile both targets in one nvcc run: the ptxas report,
    the budget figures per target, the host translation unit's text (or the compile's error)."""
    with tempfile.TemporaryDirectory(prefix="patchkit-jit-") as tmp:
        host = next((h for h in unit.host if (top / h).is_file()), None)
        if unit.host and host is None:
            raise SourceChanged(what, f"one of {', '.join(unit.host)}", "none is in the sdist: the layout changed")
        host_text = (top / host).read_text("utf-8", "replace") if host else ""
        probe = Path(tmp) / "patchkit_probe.cu"
        probe.write_text(probe_source(unit, kernels, top, host))
        keep = Path(tmp) / "keep"
        keep.mkdir()
        argv = [nvcc, "-c", str(probe), "-o", str(keep / "probe.o"), *unit.flags,
                *(f"-I{top / d}" for d in unit.includes), *(f"-isystem={top / d}" for d in unit.system_includes)]
        if host:
            argv.append(f"-I{(top / host).parent}")
        if torch:
            argv += [f"-I{torch[0]}", f"-I{torch[0] / 'torch' / 'csrc' / 'api' / 'include'}",
                     *(f"-I{d}" for d in _cuda_wheel_includes(torch[0]))]
        argv += [*(GENCODE[a] for a in ARCHS), "-Xptxas=-v", "--keep", f"--keep-dir={keep}"]
        code, text = _run(argv, tmp, COMPILE_TIMEOUT_S, f"nvcc for {unit.name} of {what}")
        if code != 0:
            missing = re.search(r"fatal error: (\S+): No such file or directory", text)
            tail = "\n".join(text.strip().splitlines()[-12:])
            if missing:
                raise CompileEnvironmentError(missing.group(1), f"{what}: {unit.name} does not compile here: "
                                              f"{missing.group(1)} is missing (nvcc exit {code}):\n{tail}")
            return {"ptxas": "", "budget": {}, "host": host_text, "error": f"nvcc exit {code}:\n{tail}"}
        budget = {arch: _budget_values((keep / f"patchkit_probe.compute_{arch[3:]}.ptx").read_text())
                  for arch in ARCHS}
        return {"ptxas": text, "budget": budget, "host": host_text}


def materialise(archive: Path, members: tuple[str, ...], out: Path) -> Path:
    """The sdist's regular files under `members` (relative to its top directory) written below `out`, read
    through patchkit's archive reader (names checked, within the member limit); returns the top directory."""
    reader = TarGzArchive(archive, keep=lambda name: False)
    listing = reader.listing()
    tops = {name.split("/", 1)[0] for name in listing}
    if len(tops) != 1:
        raise SourceChanged(str(archive), "one top-level directory", f"found {sorted(tops)[:5]}")
    top = tops.pop()
    wanted = [n for n, kind in listing.items() if kind == "file" and n.split("/", 1)[-1].startswith(members)]
    for name, data in reader.read_many(wanted).items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return out / top


def probe_source(unit: Unit, kernels: list[Kernel], top: Path, host: str | None) -> str:
    """The translation unit nvcc compiles: the release's own TU (vLLM) or headers (FlashInfer), the launchers'
    budget constants copied from the source, the instantiations, and one `__device__` global per figure, which
    the PTX states as a literal (read back from --keep's .ptx: nothing compiled from a release is run)."""
    lines = [f'#include "{host.rsplit("/", 1)[-1]}"' if host else "", *(f"#include <{h}>" for h in unit.headers)]
    lines.append(f"namespace {unit.namespace} {{" if unit.namespace else "")
    expressions = []
    for i, kernel in enumerate(kernels):
        dynamic, threads = kernel.dynamic, kernel.threads
        if kernel.launcher:
            file, function, constant, arguments = kernel.launcher
            copy, block = launcher_constants((top / file).read_text("utf-8", "replace"), function, constant, f"{file}")
            lines.append(copy.replace(f"{function}_patchkit_budget", f"patchkit_budget_{i}"))
            dynamic, threads = f"patchkit_budget_{i}{arguments}()", threads or block
        expressions.append((i, dynamic, threads))
    lines.append("}" if unit.namespace else "")
    if unit.namespace:
        lines.append(f"using namespace {unit.namespace};")
    instances = [k.instance for k in kernels if k.instance]
    if instances:
        lines.append("void* patchkit_kernels[] = {" + ", ".join(f"(void*)&{i}" for i in instances) + "};")
    for i, dynamic, threads in expressions:
        lines.append(f'extern "C" __device__ long long patchkit_dynamic_{i} = (long long)({dynamic});')
        lines.append(f'extern "C" __device__ long long patchkit_threads_{i} = (long long)({threads});')
    return "\n".join(lines) + "\n"


_LAUNCHER = r"(template\s*<[^{{;]*?>)\s*(?:static\s+|inline\s+)*[\w:]+\s+{}\s*\([^{{]*?\)\s*\{{"
_STATEMENT = re.compile(r"((?:using\s+\w+\s*=|(?:static\s+)?constexpr\s+[\w:]+\s+\w+\s*=)[^;]*);")


def launcher_constants(text: str, function: str, constant: str, what: str) -> tuple[str, str]:
    """`function`'s own `using`/`constexpr` statements before `auto kernel =` (where `constant` is defined), as a
    constexpr function template of the same parameters returning `constant`; and its block-size expression."""
    head = re.search(_LAUNCHER.format(re.escape(function)), text, re.S)
    if head is None or (body_end := text.find("auto kernel =", head.end())) < 0:
        raise SourceChanged(what, f"a launcher {function}(...) {{ ... auto kernel = ... }}",
                            "there is none: its shared-memory request cannot be read")
    statements = [m.group(1).strip() + ";" for m in _STATEMENT.finditer(text, head.end(), body_end)]
    if not any(re.match(rf"(?:static\s+)?constexpr\s+[\w:]+\s+{constant}\s*=", s) for s in statements):
        raise SourceChanged(what, f"{function} defining constexpr {constant} before its launch",
                            "it defines none: its shared-memory request cannot be read")
    block = re.search(r"dim3\s+block\w*\(([^()]*)\)", text[head.end():])
    if not block:
        raise SourceChanged(what, f"{function} launching with a `dim3 block(...)`",
                            "it has none: its block size cannot be read")
    body = "\n  ".join(statements)
    return (f"{head.group(1)}\nconstexpr long long {function}_patchkit_budget() {{\n  {body}\n  return {constant};\n}}\n",
            block.group(1).strip())


_GLOBAL = re.compile(r"\.global \.align 8 \.u64 patchkit_(dynamic|threads)_(\d+) = (\d+);")


def _budget_values(ptx: str) -> dict[str, list[int]]:
    values: dict[str, list[int]] = {}
    for kind, index, value in _GLOBAL.findall(ptx):
        values.setdefault(index, [0, 0])[kind == "threads"] = int(value)
    return values


def judge(unit: Unit, kernels: list[Kernel], version: str, found: dict,
          sources: dict[str, str | None] | None = None) -> list[Row]:
    """One row per kernel entry and target; a kernel compiled for no entry, or an entry of no known kernel,
    is a failing row, as is a compile that failed. `sources`: the files the `unreached` steps and the host's lines are read from."""
    if found.get("error"):
        return [Row(unit.name, version, "(all)", "", "(the probe)", arch, verdict=f"DOES NOT COMPILE: {found['error']}")
                for arch in ARCHS]
    entries = ptxas.parse(found["ptxas"], f"{unit.name} {version}")
    names = demangle([e.kernel for e in entries])
    sources = sources or {}
    host_name = next((h for h in unit.host if sources.get(h) is not None), "the host code")
    rows, seen = [], set()
    for entry in entries:
        if any(re.search(p, entry.kernel) for p in unit.ignore):
            continue
        index = next((i for i, k in enumerate(kernels) if re.search(k.match, entry.kernel)), None)
        row = Row(unit.name, version, kernels[index].name if index is not None else "(unknown)", entry.kernel,
                  names[entry.kernel], entry.arch, entry.registers, entry.spill_stores + entry.spill_loads,
                  entry.static_smem, warnings=entry.warnings)
        if index is None:
            row.verdict = "NO BUDGET KNOWN: a kernel patchkit's census does not know"
        else:
            seen.add((index, entry.arch))
            dynamic, threads = found["budget"].get(entry.arch, {}).get(str(index), [0, 0])
            row.dynamic_smem, row.threads = dynamic, threads
            _verdict(row, kernels[index], found["host"], host_name, sources)
        rows.append(row)
    rows += [Row(unit.name, version, k.name, "", k.instance or k.name, arch, verdict="NOT COMPILED: no such entry")
             for i, k in enumerate(kernels) for arch in ARCHS if (i, arch) not in seen]
    return rows


def _verdict(row: Row, kernel: Kernel, host: str, host_name: str, sources: dict[str, str | None]) -> None:
    if kernel.gates:
        gates = [m for g in kernel.gates for m in [re.search(g, host, re.S)] if m]
        needs = [int(m.group(1)) * 1024 for m in gates]
        sites = len(re.findall(kernel.launch_sites, host))
        if len(needs) != len(kernel.gates) or sites != len(kernel.gates):
            row.verdict = (f"NO BUDGET KNOWN: {len(needs)} of {len(kernel.gates)} opt-in gates found before its "
                           f"{sites} launch sites in the host code")
            return
        if min(needs) > GB10_SMEM_OPTIN and kernel.unreached:
            _refused(row, kernel, min(needs), f"{host_name}:{', '.join(lines(host, m) for m in gates)}", sources)
            return
        if min(needs) > GB10_SMEM_OPTIN:
            row.ok, row.verdict = True, f"not launched on GB10 (host needs >= {min(needs):,} B opt-in)"
            return
    if kernel.sized_to_optin:
        missing = [p for p in kernel.sized_to_optin if not re.search(p, host)]
        if missing:
            row.verdict = f"NO BUDGET KNOWN: the host code no longer sizes it to the device ({missing[0]!r} not found)"
            return
        row.dynamic_smem = max(row.dynamic_smem, GB10_SMEM_OPTIN)  # capped at the opt-in, floored at the constant
    problems = []
    total = row.static_smem + row.dynamic_smem
    if total > GB10_SMEM_OPTIN:
        problems.append(f"{total:,} B shared memory per block > {GB10_SMEM_OPTIN:,}")
    if row.registers > GB10_REGS_PER_THREAD:
        problems.append(f"{row.registers} registers a thread > {GB10_REGS_PER_THREAD}")
    per_block = math.ceil(row.registers * 32 / REGISTER_UNIT) * REGISTER_UNIT * math.ceil(row.threads / 32)
    if per_block > GB10_REGS_PER_SM:
        problems.append(f"{per_block:,} registers a block > {GB10_REGS_PER_SM:,} an SM")
    row.ok = not problems
    row.verdict = "EXCEEDS GB10: " + "; ".join(problems) if problems else (
        "fits (its launcher sizes it to the opt-in)" if kernel.sized_to_optin else "fits")


def _refused(row: Row, kernel: Kernel, need: int, where: str, sources: dict[str, str | None]) -> None:
    """A kernel whose host raises below `need` bytes of opt-in (no fallback): a finding on GB10, fine only where
    every step of `unreached` shows GLM-5.3's path never calls it."""
    reach = follow(kernel.unreached, sources)
    row.evidence = [f"{where}: the host refuses it below {need:,} B of opt-in shared memory a block", *reach.evidence]
    refusal = f"refused on GB10 (host needs >= {need:,} B opt-in, {where})"
    if reach.problem:
        row.verdict = f"REFUSED ON GB10 AND NOT SHOWN OFF GLM-5.3'S PATH: {refusal}; {reach.problem}"
    else:
        row.ok = True
        row.verdict = f"{refusal}; off GLM-5.3's path on cc 12.1 ({len(reach.evidence)} steps in the evidence)"


def demangle(names: list[str]) -> dict[str, str]:
    """Shown names: c++filt's (binutils, which nvcc's host compiler brings) without the parameter list."""
    filt = shutil.which("c++filt")
    mangled = [n for n in names if n.startswith("_Z")]  # given as arguments: never a name read as an option
    shown = dict(zip(names, names, strict=True))
    if filt and mangled:
        try:  # bounded like every host tool; where it fails, the names are shown as ptxas printed them
            finished = run_bounded([filt, *mangled], timeout=60, kind="tool-output", what="c++filt's names")
        except (OSError, PatchkitError):
            finished = None
        out = finished.output.decode("utf-8", "replace").splitlines() if finished else []
        if finished and finished.code == 0 and not finished.timed_out and len(out) == len(mangled):
            shown |= dict(zip(mangled, out, strict=True))
    return {name: _short(shown[name]) for name in names}


def _short(name: str) -> str:
    name = name.removeprefix("void ")
    depth = 0
    for i, c in enumerate(name):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0 and i and name[i - 1] == ">":
            return name[:i]
    return name


def _run(argv: list[str], cwd, timeout: float, what: str) -> tuple[int, str]:
    """Run a host tool, its output (stdout and stderr) read back within the tool-output limit; the whole
    process group killed at `timeout` (nvcc runs cicc and ptxas under it)."""
    finished = run_bounded(argv, timeout=timeout, kind="tool-output", what=what, cwd=cwd)
    if finished.timed_out:
        raise CompileTimedOut(what, timeout)
    return finished.code, finished.output.decode("utf-8", "replace")


def census_dict(rows: list[Row], releases: dict) -> dict:
    """The JSON of `census --compile`: every row, the limits it was judged against, ok overall."""
    return {"ok": bool(rows) and all(r.ok for r in rows), "releases": releases, "archs": list(ARCHS),
            "limits": {"smem_per_block": GB10_SMEM_OPTIN, "registers_per_sm": GB10_REGS_PER_SM,
                       "registers_per_thread": GB10_REGS_PER_THREAD},
            "kernels": [r.to_dict() for r in rows]}
