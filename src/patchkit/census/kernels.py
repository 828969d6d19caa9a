"""The kernel census: does a release wheel still carry code that loads on GB10 (sm_121) for every compiled
kernel the GLM-5.3 NVFP4 path needs?

A new vLLM release can break a Spark without touching a patch, by dropping sm_12x code from one kernel.
This reads the wheel's compiled extensions the way the CUDA driver sees them: each ELF's `.nv_fatbin`
section, its fat-binary entries (SASS cubins and PTX, each for one SM and an arch-specific `a` or
family-specific `f` flag, zstd-compressed), and the kernels each entry defines (the cubin's `.text.<kernel>`
sections, the PTX's `.entry` lines).

Hand-written because no maintained Python library reads fat binaries (NVIDIA's cuobjdump is not in the
pip-installable CUDA packages), and the format is small. Its layout, as nvcc 13.0 writes it and as
vLLM 0.33.0's wheels carry it (tests/test_kernels.py checks both, nvcc's by compiling for each variant):

    container: u32 magic 0xBA55ED50, u16 version 1, u16 header size 16, u64 size of the entries
    entry:     u16 kind (1 PTX, 2 cubin), u16, u32 header size, u64 payload size,
               u32 compressed size @16, ..., u32 sm @28, ..., u64 flags @40, ..., u64 raw size @56
    flags:     0x8000 zstd-compressed payload; 0x100000 arch-specific (sm_XYa); 0x200000 family (sm_XYf)

Which code loads on sm_121 (CUDA C++ Programming Guide, "Binary Compatibility" and "Feature Set Compiler
Targets"): SASS for sm_12Y with Y <= 1, plain or family-specific (sm_120, sm_120f, sm_121f, sm_121);
arch-specific SASS only for exactly sm_121a; PTX of any plain compute_XY with XY <= 121 (the driver
compiles it at load), family PTX compute_12Yf with Y <= 1, arch-specific PTX only compute_121a.

What each SASS kernel that loads on GB10 uses is read off its cubin (`cubin_usage`: registers, stack frame,
static shared memory, the numbers ptxas prints and cuobjdump dumps) and held to GB10's limits, so a kernel
that is there but cannot launch on a Spark fails the census too.
"""

from __future__ import annotations

import re
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from patchkit.errors import PatchkitError
from patchkit.untrusted import InputTooLarge, UnreadableFile, limit_of

FATBIN_MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "sass"}
FLAG_ZSTD, FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x8000, 0x100000, 0x200000
GB10_SM = 121


class FatbinError(PatchkitError):
    """A compiled extension whose ELF or fat binary is malformed (exit 2): `what` names the member,
    `problem` what is wrong with it (where in the file, what was expected)."""

    def __init__(self, what: str, problem: str):
        self.what, self.problem = what, problem
        super().__init__(f"{what}: {problem}")


@dataclass(frozen=True)
class Usage:
    """What one SASS kernel uses, as its cubin records it (what `cuobjdump --dump-resource-usage` prints):
    registers a thread (EIATTR_REGCOUNT), its stack frame in bytes (EIATTR_FRAME_SIZE: ptxas' "bytes stack
    frame", spills among them) and static shared memory a block (its `.nv.shared.<kernel>` section less the
    1 KiB the system reserves a block from sm_80 on, which the section carries: ptxas' "bytes smem";
    cuobjdump's SHARED counts the reserve). tests/test_kernels.py holds both tools to these numbers."""

    registers: int
    stack: int
    static_smem: int


# GB10 (sm_121) limits a kernel must fit: 255 registers a thread, 101,376 B of shared memory a block (the
# opt-in maximum the CUDA Programming Guide gives for compute capability 12.x).
GB10_MAX_REGISTERS, GB10_MAX_SMEM = 255, 101_376
# .nv.info attributes (EIATTR_*, format EIFMT_SVAL: u32 symbol index, u32 value) the usage is read from.
_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F
_RESERVED_SMEM = 1024  # a block's system-reserved shared memory on sm_80 and later, inside .nv.shared.<kernel>


@dataclass(frozen=True)
class Entry:
    kind: str          # "sass" or "ptx"
    sm: int            # 120 for sm_120 / compute_120
    variant: str       # "", "a" (arch-specific) or "f" (family-specific)
    kernels: tuple[str, ...]
    usage: dict[str, Usage] = field(default_factory=dict, compare=False)  # SASS: kernel -> what it uses

    @property
    def target(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.sm}{self.variant}"

    def loads_on(self, sm: int = GB10_SM) -> bool:
        """Does the driver load (SASS) or JIT-compile (PTX) this entry on a device of compute capability `sm`?"""
        major, minor = divmod(self.sm, 10)
        if self.variant == "a":
            return self.sm == sm
        if self.kind == "sass" or self.variant == "f":  # same major, an equal or lower minor
            return major == sm // 10 and minor <= sm % 10
        return self.sm <= sm  # plain PTX: any newer device


def _sections(read, length: int, what: str) -> dict[str, tuple[int, int]]:
    """name -> (offset, size) of a little-endian ELF64's sections, every offset checked against its `length`;
    `read(offset, size)` gives the bytes (a slice of a cubin, or a seek and read of a host extension)."""
    head = read(0, 64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise FatbinError(what, "not a little-endian 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > length or shstrndx >= max(shnum, 1):
        raise FatbinError(what, "its ELF section table lies outside the file")
    raw = read(shoff, shnum * 64)
    table = [struct.unpack_from("<IIQQQQIIQQ", raw, i * 64) for i in range(shnum)]
    names_at, names_size = table[shstrndx][4], table[shstrndx][5]
    if names_at + names_size > length:
        raise FatbinError(what, "its ELF section names lie outside the file")
    names = read(names_at, names_size)
    out = {}
    for name_off, kind, _f, _a, offset, size, *_ in table:
        end = names.find(b"\0", name_off)
        if name_off >= names_size or end < 0:
            raise FatbinError(what, "an ELF section name lies outside the name table")
        if kind != 8 and offset + size > length:  # SHT_NOBITS (8) occupies no file space
            raise FatbinError(what, f"ELF section {names[name_off:end]!r} lies outside the file")
        out[names[name_off:end].decode("utf-8", "replace")] = (offset, size)
    return out


def _in_memory(data: bytes):
    return lambda offset, size: data[offset:offset + size]


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z0-9_$]+)")


def _payload(fb, at: int, header: int, size: int, flags: int, compressed: int, raw: int, what: str) -> bytes:
    data = bytes(fb[at + header:at + header + size])
    if not flags & FLAG_ZSTD:
        return data
    import zstandard  # the fat binaries' own compression (zstd magic 28 b5 2f fd)

    if raw > limit_of("member"):
        raise InputTooLarge(f"{what}: a fat-binary entry", "member", limit_of("member"), raw)
    try:
        return zstandard.ZstdDecompressor().decompress(data[:compressed], max_output_size=raw)
    except zstandard.ZstdError as exc:
        raise FatbinError(what, f"a fat-binary entry does not decompress: {exc}") from None


def fatbin_entries(elf: bytes, what: str) -> Iterator[Entry]:
    """Every fat-binary entry of a host ELF's `.nv_fatbin` section (none when it has no such section)."""
    sections = _sections(_in_memory(elf), len(elf), what)
    if ".nv_fatbin" in sections:
        start, size = sections[".nv_fatbin"]
        yield from _walk(memoryview(elf)[start:start + size], start, what)


def _walk(fb: memoryview, start: int, what: str) -> Iterator[Entry]:
    pos = 0
    while pos + 16 <= len(fb):
        magic, _version, header, body = struct.unpack_from("<IHHQ", fb, pos)
        if magic != FATBIN_MAGIC:  # containers are 8-aligned; padding lies between them
            pos += 8
            continue
        at, end = pos + header, pos + header + body
        if header < 16 or end > len(fb):
            raise FatbinError(what, f"a fat-binary container at {start + pos:#x} runs past its section")
        while at < end:
            if at + 64 > end:
                raise FatbinError(what, f"a fat-binary entry header at {start + at:#x} is cut short")
            kind, _, ehead, esize = struct.unpack_from("<HHIQ", fb, at)
            compressed, = struct.unpack_from("<I", fb, at + 16)
            sm, = struct.unpack_from("<I", fb, at + 28)
            flags, = struct.unpack_from("<Q", fb, at + 40)
            raw, = struct.unpack_from("<Q", fb, at + 56)
            if ehead < 64 or at + ehead + esize > end:
                raise FatbinError(what, f"a fat-binary entry at {start + at:#x} runs past its container")
            if kind in KIND:
                variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
                body_bytes = _payload(fb, at, ehead, esize, flags, compressed, raw, what)
                usage = cubin_usage(body_bytes, f"{what}: a cubin", sm) if KIND[kind] == "sass" else {}
                yield Entry(KIND[kind], sm, variant, _kernels(KIND[kind], body_bytes, what), usage)
            at += ehead + esize
        pos = end + (-end % 8)


def _kernels(kind: str, body: bytes, what: str) -> tuple[str, ...]:
    if kind == "ptx":
        return tuple(m.group(1).decode() for m in _PTX_ENTRY.finditer(body))
    sections = _sections(_in_memory(body), len(body), f"{what}: a cubin")
    return tuple(sorted(name[len(".text."):] for name in sections if name.startswith(".text.")))


def cubin_usage(cubin: bytes, what: str, sm: int = 120) -> dict[str, Usage]:
    """kernel -> Usage for every kernel of a cubin: `.nv.info`'s REGCOUNT and FRAME_SIZE records (each
    names its kernel by symbol index) and each kernel's `.nv.shared.` section size."""
    sections = _sections(_in_memory(cubin), len(cubin), what)
    if ".nv.info" not in sections or ".symtab" not in sections or ".strtab" not in sections:
        return {}
    (info_at, info_size), (sym_at, sym_size), (str_at, str_size) = (sections[n] for n in (".nv.info", ".symtab", ".strtab"))
    info, strtab = cubin[info_at:info_at + info_size], cubin[str_at:str_at + str_size]

    def symbol(index: int) -> str:
        if (index + 1) * 24 > sym_size:
            raise FatbinError(what, f"a .nv.info record names symbol {index}, past the symbol table")
        name_at, = struct.unpack_from("<I", cubin, sym_at + index * 24)
        end = strtab.find(b"\0", name_at)
        if name_at >= str_size or end < 0:
            raise FatbinError(what, "a symbol's name lies outside the string table")
        return strtab[name_at:end].decode("utf-8", "replace")

    values: dict[int, dict[str, int]] = {}
    pos = 0
    while pos + 2 <= len(info):
        fmt, attr = info[pos], info[pos + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size, then that many bytes
            if pos + 4 > len(info):
                raise FatbinError(what, "a .nv.info record is cut short")
            size, = struct.unpack_from("<H", info, pos + 2)
            data = info[pos + 4:pos + 4 + size]
            if len(data) < size:
                raise FatbinError(what, "a .nv.info record runs past its section")
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size == 8:
                index, value = struct.unpack_from("<II", data)
                values.setdefault(index, {})["registers" if attr == _EIATTR_REGCOUNT else "stack"] = value
            pos += 4 + size
        elif fmt in (2, 3):  # EIFMT_BVAL / EIFMT_HVAL: a 2-byte value
            pos += 4
        elif fmt == 1:  # EIFMT_NVAL: no value
            pos += 2
        else:
            raise FatbinError(what, f"a .nv.info record of unknown format {fmt} at {pos:#x}")
    out = {}
    for index, got in values.items():
        if "registers" not in got:
            continue
        kernel = symbol(index)
        shared = sections.get(f".nv.shared.{kernel}", (0, 0))[1]
        if sm >= 80 and shared >= _RESERVED_SMEM:
            shared -= _RESERVED_SMEM
        out[kernel] = Usage(got["registers"], got.get("stack", 0), shared)
    return out


@dataclass(frozen=True)
class Need:
    """A compiled kernel family the GLM-5.3 NVFP4 path runs, found by its mangled names."""

    name: str
    pattern: str   # a regular expression searched in the mangled kernel names
    why: str
    required: bool = True  # False: reported, never failing (a path GB10 must not take)


NEEDS = (
    Need("nvfp4-gemm", r"MainloopSm120\w*BlockScaled", "NVFP4 dense GEMM (CUTLASS SM120 block-scaled mainloop)"),
    Need("nvfp4-moe-grouped", r"GroupProblemShape\w*MainloopSm120\w*BlockScaled|MainloopSm120\w*BlockScaled\w*GroupProblemShape",
         "NVFP4 grouped MoE GEMM (CUTLASS SM120, grouped problem shape)"),
    Need("marlin", r"[Mm]arlin", "Marlin GEMM and MoE (the fallback for NVFP4 weights)"),
    Need("fp4-activation-quant", r"cvt_fp16_to_fp4", "FP4 activation quantisation (scaled_fp4_quant)"),
    Need("moe-routing", r"topkGating", "MoE routing (topk_softmax)"),
    Need("indexer-topk", r"persistent_topk_kernel", "the sparse-MLA indexer's persistent top-k"),
    Need("fp8-ds-mla-cache", r"concat_and_cache_ds_mla_kernel|indexer_k_quant_and_cache_kernel",
         "the fp8_ds_mla KV-cache and indexer-K writers"),
    Need("kda", r"kda", "KDA (kimi delta attention) kernels"),
    # vLLM's default KDA prefill on 12.x (models/glm5next/common/kda.py), in vllm/_flashkda_C.abi3.so: 0.34.0's
    # aarch64 wheel carries it for sm_90a, sm_100f and sm_120f, the last of which GB10 runs (family code).
    Need("flashkda", r"_flash_kda_", "FlashKDA chunked prefill (vllm/_flashkda_C, the default KDA prefill on 12.x; "
         "`--kda-prefill-backend triton` takes the Triton kernel instead)"),
    Need("custom-allreduce", r"cross_device_reduce", "custom all-reduce (tensor parallel over two Sparks)"),
    Need("nvfp4-ds-mla-cache", r"concat_and_cache_nvfp4_ds_mla_kernel",
         "the NVFP4 KV-cache writer: without sm_12x code an `nvfp4` KV cache cannot run on GB10", required=False),
)
# Compiled at run time on 12.x, so no wheel carries them: the host (wheel path) or image needs CUDA 13's nvcc.
RUNTIME_COMPILED = (
    ("flashinfer-sparse-mla", "FlashInfer's FLASHINFER_MLA_SPARSE_SM120 module, JIT-compiled by flashinfer-python "
     "(compiled for sm_121a/sm_120f and checked against GB10's limits by `census --compile`)"),
    ("deep-gemm", "DeepGEMM's kernels, JIT-compiled by vllm/third_party/deep_gemm at first use"),
)


@dataclass
class Row:
    need: Need
    targets: dict[str, int] = field(default_factory=dict)   # target -> kernels of this need in it
    loadable: dict[str, int] = field(default_factory=dict)  # the subset that loads on sm_121
    usage: dict[str, Usage] = field(default_factory=dict)   # "target kernel" -> what it uses, SASS that loads on sm_121

    @property
    def over_limits(self) -> list[str]:
        """The loadable SASS kernels that cannot launch on GB10: over its registers or shared memory."""
        return sorted(k for k, u in self.usage.items() if u.registers > GB10_MAX_REGISTERS or u.static_smem > GB10_MAX_SMEM)

    @property
    def ok(self) -> bool:
        return (bool(self.loadable) or not self.need.required) and not self.over_limits

    def usage_summary(self) -> dict | None:
        if not self.usage:
            return None
        used = list(self.usage.values())
        return {"kernels": len(used), "max_registers": max(u.registers for u in used),
                "max_stack_bytes": max(u.stack for u in used), "max_static_smem_bytes": max(u.static_smem for u in used),
                "kernels_with_stack": sum(1 for u in used if u.stack), "over_gb10_limits": self.over_limits,
                "limits": {"registers": GB10_MAX_REGISTERS, "smem_bytes": GB10_MAX_SMEM}}


@dataclass
class Census:
    wheel: str
    rows: list[Row]
    binaries: dict[str, list[str]]  # extension -> its targets, sorted

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    def record(self) -> CensusRecord:
        return CensusRecord(
            wheel=self.wheel, ok=self.ok, sm=GB10_SM,
            kernels=[KernelRecord(need=r.need.name, required=r.need.required, why=r.need.why, ok=r.ok,
                                  targets=r.targets, loads_on_sm121=sorted(r.loadable), usage_on_sm121=r.usage_summary())
                     for r in self.rows],
            runtime_compiled=[RuntimeRecord(name=n, needs="CUDA 13 nvcc on the host or in the image", why=w)
                              for n, w in RUNTIME_COMPILED],
            binaries=self.binaries)

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self.record())


# `patchkit census --json`, declared once: the census writes it through these and the bump pull
# request's body reads it back through them (upstream/bump_records.py), so a renamed field is renamed for both.
class KernelRecord(msgspec.Struct, kw_only=True):
    need: str
    required: bool
    why: str
    ok: bool
    targets: dict[str, int]
    loads_on_sm121: list[str]
    usage_on_sm121: dict[str, Any] | None = None  # Row.usage_summary (a record from before it has none)


class RuntimeRecord(msgspec.Struct, kw_only=True):
    name: str
    needs: str
    why: str


class CensusRecord(msgspec.Struct, kw_only=True):
    wheel: str
    ok: bool
    kernels: list[KernelRecord]
    sm: int
    runtime_compiled: list[RuntimeRecord]
    binaries: dict[str, list[str]]  # extension -> its targets


def census(wheel: Path, needs: tuple[Need, ...] = NEEDS) -> Census:
    """Read every compiled extension of `wheel` and match its kernels against `needs`."""
    rows = [Row(need) for need in needs]
    patterns = [re.compile(need.pattern) for need in needs]
    binaries: dict[str, list[str]] = {}
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UnreadableFile(str(wheel), f"not a readable wheel ({exc})", getattr(exc, "errno", None)) from None
    with archive, tempfile.TemporaryDirectory(prefix="patchkit-census-") as tmp:
        for info in archive.infolist():
            if not info.filename.endswith(".so") or info.is_dir():
                continue
            what = f"{wheel.name}:{info.filename}"
            if info.file_size > limit_of("binary"):
                raise InputTooLarge(what, "binary", limit_of("binary"), info.file_size)
            targets = set()
            for entry in _entries_of(archive, info, Path(tmp), what):
                targets.add(entry.target)
                for row, pattern in zip(rows, patterns, strict=True):
                    found = sum(1 for k in entry.kernels if pattern.search(k))
                    if found:
                        row.targets[entry.target] = row.targets.get(entry.target, 0) + found
                        if entry.loads_on():
                            row.loadable[entry.target] = row.loadable.get(entry.target, 0) + found
                            for kernel, used in entry.usage.items():
                                if pattern.search(kernel):
                                    row.usage[f"{entry.target} {kernel}"] = used
            if targets:
                binaries[info.filename] = sorted(targets)
    return Census(wheel.name, rows, binaries)


def _entries_of(archive: zipfile.ZipFile, info: zipfile.ZipInfo, tmp: Path, what: str) -> list[Entry]:
    """A member extracted to a temporary file (never whole in memory), of which only the ELF section table and
    `.nv_fatbin` are read back: its fat-binary entries."""
    path = tmp / "member.so"
    try:
        with archive.open(info) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)  # zipfile checks the CRC and the declared size at the end
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise FatbinError(what, f"cannot be read out of the wheel: {exc}") from None
    try:
        with open(path, "rb") as f:
            length = path.stat().st_size

            def read(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)

            sections = _sections(read, length, what)
            if ".nv_fatbin" not in sections:
                return []
            start, size = sections[".nv_fatbin"]
            return list(_walk(memoryview(read(start, size)), start, what))
    finally:
        path.unlink()
