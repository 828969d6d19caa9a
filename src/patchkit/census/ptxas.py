"""What ptxas says a kernel uses (`nvcc -Xptxas -v`): registers, spills, stack and static shared memory per
kernel entry and target, as CUDA 13.0's ptxas prints them (tests/data/ptxas/ holds real outputs):

    ptxas info    : Compiling entry function '_ZN4vllm...' for 'sm_121a'
    ptxas info    : Function properties for _ZN4vllm...
        0 bytes stack frame, 164 bytes spill stores, 176 bytes spill loads
    ptxas info    : Used 64 registers, used 1 barriers, 136 bytes cumulative stack size, 11776 bytes smem
    ptxas warning : Value of threads per SM for entry _ZN4vllm... is out of range. .minnctapersm will be ignored

"Function properties" also appear for device functions compiled on their own (no entry); only the ones
naming the entry being compiled count. A field ptxas leaves out is zero (no "bytes smem": no static shared
memory). Hand-written: no library reads this, and nvcc has no machine-readable form of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from patchkit.errors import PatchkitError

_ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'\s*$")
_PROPERTIES = re.compile(r"^ptxas info\s*: Function properties for (\S+)\s*$")
_SPILLS = re.compile(r"^\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\s*$")
_USED = re.compile(r"^ptxas info\s*: Used (\d+) registers(.*)$")
_FIELD = re.compile(r"^(?:used )?(\d+) (?:bytes )?([\w\[\] ]+?)\s*$")
_WARNING = re.compile(r"^ptxas warning\s*: (.*\bentry (\S+) .*)$")


class PtxasOutputError(PatchkitError):
    """ptxas output that does not read as CUDA 13's `-v` report (exit 2): nothing is judged from it.
    `what` names the output, `kernel` the entry it was about, `problem` "no-usage" (an entry without its
    'Used N registers' line) or "field" (a usage `field` that does not read), `arch` the entry's target."""

    def __init__(self, what: str, kernel: str, problem: str, arch: str = "", field: str = ""):
        self.what, self.kernel, self.problem, self.arch, self.field = what, kernel, problem, arch, field
        super().__init__({
            "no-usage": f"{what}: ptxas named entry {kernel} for {arch} but printed no 'Used N registers' line "
                        "for it (expected nvcc -Xptxas -v output)",
            "field": f"{what}: cannot read ptxas' usage field {field!r} of {kernel}"}[problem])


@dataclass
class Resources:
    kernel: str            # the mangled entry name
    arch: str              # "sm_121a"
    registers: int = -1
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0         # bytes of stack frame
    static_smem: int = 0   # bytes of static __shared__ memory
    barriers: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "arch": self.arch, "registers": self.registers,
                "spill_stores": self.spill_stores, "spill_loads": self.spill_loads, "stack": self.stack,
                "static_smem": self.static_smem, "barriers": self.barriers, "warnings": self.warnings}


def parse(text: str, what: str) -> list[Resources]:
    """Every kernel entry ptxas reported in `text`, in its order; `what` names the compile in errors."""
    found: list[Resources] = []
    current: Resources | None = None
    properties_of: str | None = None
    warnings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if match := _ENTRY.match(line):
            current = Resources(match.group(1), match.group(2))
            found.append(current)
            properties_of = None
        elif match := _PROPERTIES.match(line):
            properties_of = match.group(1)
        elif (match := _SPILLS.match(line)) and current is not None and properties_of == current.kernel:
            current.stack, current.spill_stores, current.spill_loads = map(int, match.groups())
        elif match := _USED.match(line):
            if current is None or current.registers >= 0:
                continue  # a device function's own usage line, outside an entry
            current.registers = int(match.group(1))
            for part in filter(None, (p.strip() for p in match.group(2).split(","))):
                _field(current, part, what)
        elif match := _WARNING.match(line):
            warnings.setdefault(match.group(2), []).append(match.group(1))
    for entry in found:
        if entry.registers < 0:
            raise PtxasOutputError(what, entry.kernel, "no-usage", arch=entry.arch)
        entry.warnings = warnings.get(entry.kernel, [])
    return found


def _field(entry: Resources, part: str, what: str) -> None:
    match = _FIELD.match(part)
    if not match:
        raise PtxasOutputError(what, entry.kernel, "field", field=part)
    value, name = int(match.group(1)), match.group(2)
    if name == "smem":
        entry.static_smem = value
    elif name == "barriers":
        entry.barriers = value
    # cumulative stack size, gmem, cmem[N], textures...: not what GB10's per-block limits bound
