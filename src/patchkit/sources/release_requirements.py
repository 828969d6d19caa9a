"""A vLLM release's CPU test environment, derived from what the release itself declares.

The list is the one the release's CUDA wheel installs: `requirements/cuda.txt` and the
`requirements/common.txt` it includes, read from the release's sdist (or checkout, or git tree), or the
`Requires-Dist` lines of a wheel's METADATA (the same list, built from those files). From it the test
environment keeps every requirement as the release states it (torch, torchvision, transformers,
tokenizers, xgrammar, harmony and the rest), except:

- the CUDA-only kernel packages and the media decoders (`LEFT_OUT`, each with why): nothing the tests
  import needs them, several do not install on a CPU-only x86_64 machine, and one may not exist at all
  (vLLM 0.34.0 pins flashinfer-python 0.7.3, never published: `sources.companion` says what patchkit
  checks instead; a test environment installs no FlashInfer, so no pin of it is asked of the index);
- index options (`--extra-index-url https://flashinfer.ai/whl/` in 0.30.0 and 0.31.0): they serve only
  left-out packages, and a test environment installs from the indexes this machine is configured for;
- an exact pin the caller replaces (`replace`: the pinned release's `tests` environment takes torch
  2.14.1 + torchvision 0.29.1 from this machine's disk for the declared 2.14.0 + 0.29.0, a patch
  release of the same API; noxfile.py says when).

Fail closed: the release's files are untrusted text. A line that is neither a requirement, a comment, an
include inside `requirements/`, nor an index option is refused (`UnreadableRequirements`), as is a direct
URL requirement (the environment installs only from the package index) and a release that declares no
torch; an include is followed at most `MAX_DEPTH` deep and a file read at most `MAX_BYTES`.

`python -m patchkit.sources.release_requirements 0.34.0 [--output FILE] [--replace torch==2.14.1]` writes
the list (noxfile.py's release sessions run it); exit 2 with the reason when the release cannot be read.
"""

from __future__ import annotations

import posixpath
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from patchkit.errors import PatchkitError
from patchkit.sources.base import Source

ENTRY = "requirements/cuda.txt"  # what the index's wheels are built from (setup.py reads it for CUDA)
MAX_BYTES = 256 * 1024  # a requirements file is a few KiB; more is not one
MAX_DEPTH = 4  # cuda.txt -> common.txt is one level

# name -> why it is not in a CPU test environment (canonical names; extras such as [cu13] do not matter)
LEFT_OUT: dict[str, str] = {
    "flashinfer-python": "CUDA-only kernels (patchkit checks FlashInfer's source through sources.companion)",
    "flashinfer-cubin": "CUDA-only kernels (FlashInfer's prebuilt cubins)",
    "flashinfer-jit-cache": "CUDA-only kernels (FlashInfer's prebuilt JIT cache)",
    "apache-tvm-ffi": "FlashInfer's and TileLang's kernel FFI",
    "tilelang": "CUDA-only kernels",
    "nvidia-cudnn-frontend": "CUDA-only (cuDNN)",
    "nvidia-cutlass-dsl": "CUDA-only kernels (CuTe DSL)",
    "quack-kernels": "CUDA-only kernels (CuTe DSL)",
    "tokenspeed-mla": "CUDA-only kernels",
    "humming-kernels": "CUDA-only kernels",
    "nvtx": "CUDA profiling ranges",
    "fastsafetensors": "GPU-direct weight loading",
    "instanttensor": "GPU weight loading",
    "pynvvideocodec": "NVIDIA video decoding",
    "torchaudio": "audio models' media decoding; its pin is for another torch than a substituted one",
    "torchcodec": "video decoding",
}
INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i", "--find-links", "-f")
TORCH_STACK = ("torch", "torchvision")  # what a release must declare exactly: the environment is built on it


class UnreadableRequirements(PatchkitError):
    """The release's requirements at `where` cannot be turned into a test environment: `why` (exit 2)."""

    def __init__(self, where: str, why: str):
        self.where, self.why = where, why
        super().__init__(f"{where}: {why}")


@dataclass(frozen=True)
class ReleaseRequirements:
    """A release's CPU test environment: `kept` as the release states them (after `replaced`), in its
    order; `left_out` each requirement not installed with why; `replaced` (declared, installed) pairs."""

    release: str
    origin: str  # where they were read: "requirements/cuda.txt of <source>" or "METADATA of <source>"
    kept: tuple[Requirement, ...]
    left_out: tuple[tuple[str, str], ...]
    replaced: tuple[tuple[str, str], ...]

    def pin(self, name: str) -> str | None:
        """The exact version `name` is installed at (`torch` -> "2.14.0"), or None when not pinned exactly."""
        for requirement in self.kept:
            if canonicalize_name(requirement.name) == canonicalize_name(name):
                return _exact(requirement)
        return None

    def render(self) -> str:
        """The requirements file pip and uv read, with where each choice came from as comments."""
        lines = [f"# vLLM {self.release}'s CPU test environment, derived from {self.origin}",
                 "# by patchkit.sources.release_requirements (do not edit: regenerated on every run).",
                 *(f"# {declared} replaced by {installed}" for declared, installed in self.replaced),
                 *(f"# left out: {text} ({why})" for text, why in self.left_out),
                 *(str(r) for r in self.kept)]
        return "\n".join(lines) + "\n"


def from_source(source: Source, release: str, *, replace: Mapping[str, str] | None = None) -> ReleaseRequirements:
    """The test environment of the vLLM release behind `source` (an sdist, checkout or git tree)."""
    return from_files(source.distribution_file, release, source.description, replace=replace)


def from_files(read: Callable[[str], bytes | None], release: str, origin: str, *,
               replace: Mapping[str, str] | None = None) -> ReleaseRequirements:
    """The same from `read(path) -> bytes | None`, a release's files beside its packages (`requirements/...`)."""
    if read(ENTRY) is None:
        raise UnreadableRequirements(f"{ENTRY} of {origin}", "absent: not a vLLM release tree")
    return _derive(release, f"{ENTRY} of {origin}", _expand(ENTRY, read, depth=0), replace or {})


def from_metadata(metadata: bytes, release: str, origin: str, *,
                  replace: Mapping[str, str] | None = None) -> ReleaseRequirements:
    """The same from a wheel's core metadata: its `Requires-Dist` lines, less the optional extras'."""
    if len(metadata) > MAX_BYTES * 4:  # METADATA carries the long description too
        raise UnreadableRequirements(origin, f"{len(metadata)} bytes, more than a METADATA file holds")
    headers = HeaderParser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    lines = [(origin, line) for line in headers.get_all("Requires-Dist") or []]
    return _derive(release, origin, lines, replace or {}, skip_extras=True)


def _expand(path: str, read: Callable[[str], bytes | None], depth: int) -> list[tuple[str, str]]:
    """(file, line) of every logical line of `path` and the files it includes, comments removed."""
    data = read(path)
    if data is None:
        raise UnreadableRequirements(path, "included but absent")
    if len(data) > MAX_BYTES:
        raise UnreadableRequirements(path, f"{len(data)} bytes, more than a requirements file holds")
    out: list[tuple[str, str]] = []
    for line in _logical_lines(data.decode("utf-8", "replace")):
        words = line.split()
        if words[0] in ("-r", "--requirement") or words[0].startswith("--requirement="):
            target = words[0].partition("=")[2] if "=" in words[0] else (words[1] if len(words) > 1 else "")
            included = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if not target or posixpath.isabs(target) or not included.startswith("requirements/"):
                raise UnreadableRequirements(path, f"includes {target!r}, outside the release's requirements/")
            if depth + 1 > MAX_DEPTH:
                raise UnreadableRequirements(path, f"includes nested more than {MAX_DEPTH} deep")
            out.extend(_expand(included, read, depth + 1))
        else:
            out.append((path, line))
    return out


def _logical_lines(text: str) -> list[str]:
    """pip's reading: a `\\` at the end joins the next line; `#` at the start or after a blank is a comment."""
    joined, pending = [], ""
    for raw in text.splitlines():
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        joined.append(pending + raw)
        pending = ""
    joined.append(pending)
    out = []
    for line in joined:
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        cut = next((i for i, c in enumerate(stripped) if c == "#" and i > 0 and stripped[i - 1].isspace()), None)
        stripped = (stripped[:cut] if cut is not None else stripped).strip()
        if stripped:
            out.append(stripped)
    return out


def _derive(release: str, origin: str, lines: list[tuple[str, str]], replace: Mapping[str, str],
            *, skip_extras: bool = False) -> ReleaseRequirements:
    wanted = {canonicalize_name(name): version for name, version in replace.items()}
    kept: list[Requirement] = []
    left_out: list[tuple[str, str]] = []
    replaced: list[tuple[str, str]] = []
    for where, line in lines:
        if line.startswith("-"):
            option = line.split()[0].split("=")[0]
            if option not in INDEX_OPTIONS:
                raise UnreadableRequirements(where, f"option {option!r}: not a requirement patchkit installs")
            left_out.append((line, "an index option: the environment installs from this machine's indexes"))
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as error:
            raise UnreadableRequirements(where, f"{line[:80]!r} is not a requirement ({error})") from error
        if skip_extras and requirement.marker is not None and "extra" in str(requirement.marker):
            continue  # an optional extra's requirement (`vllm[zen]`): not what `pip install vllm` installs
        name = canonicalize_name(requirement.name)
        if name in LEFT_OUT:
            left_out.append((str(requirement), LEFT_OUT[name]))
            continue
        if requirement.url:
            raise UnreadableRequirements(where, f"{requirement.name} @ {requirement.url[:80]}: a direct URL, "
                                                "not a release on the package index")
        if name in wanted:
            declared = str(requirement)
            requirement = Requirement(f"{requirement.name}=={wanted[name]}"
                                      + (f"; {requirement.marker}" if requirement.marker else ""))
            replaced.append((declared, str(requirement)))
        kept.append(requirement)
    result = ReleaseRequirements(release, origin, tuple(kept), tuple(left_out), tuple(replaced))
    for stack in TORCH_STACK:
        if result.pin(stack) is None:
            raise UnreadableRequirements(origin, f"declares no exact {stack}: the environment is built on it")
    unused = sorted(set(wanted) - {canonicalize_name(r.name) for r in kept})
    if unused:
        raise UnreadableRequirements(origin, f"replaces {', '.join(unused)}, which the release does not declare")
    return result


def _exact(requirement: Requirement) -> str | None:
    specifiers = list(requirement.specifier)
    if len(specifiers) == 1 and specifiers[0].operator == "==" and "*" not in specifiers[0].version:
        return specifiers[0].version
    return None


def main(argv: list[str] | None = None) -> int:
    import click

    @click.command()
    @click.argument("release")
    @click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default: stdout).")
    @click.option("--replace", multiple=True, metavar="NAME==VERSION",
                  help="Install this exact version instead of the one the release pins.")
    def command(release: str, output: Path | None, replace: tuple[str, ...]) -> None:
        """The CPU test environment of vLLM RELEASE (a version on the index), from its own sdist."""
        from patchkit.localfiles import atomic_write
        from patchkit.sources.spec import open_source

        try:
            pins = dict(_name_version(text) for text in replace)
            source = open_source(f"vllm=={release}", progress=True)
            derived = from_source(source, release, replace=pins)
            text = derived.render()
            if output is None:
                click.echo(text, nl=False)
            else:
                output.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(output, text.encode())
                click.echo(f"{output}: vLLM {release}, torch {derived.pin('torch')}, torchvision "
                           f"{derived.pin('torchvision')}, {len(derived.kept)} requirements, "
                           f"{len(derived.left_out)} left out", err=True)
        except PatchkitError as error:
            click.echo(f"patchkit.sources.release_requirements: {error}", err=True)
            sys.exit(error.exit_code)

    try:
        command.main(args=argv, standalone_mode=False)
    except click.UsageError as error:
        click.echo(f"patchkit.sources.release_requirements: {error.format_message()}", err=True)
        return 2
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def _name_version(text: str) -> tuple[str, str]:
    name, sep, version = text.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise UnreadableRequirements("--replace", f"{text[:80]!r} is not NAME==VERSION")
    return name.strip(), version.strip()


if __name__ == "__main__":
    sys.exit(main())
