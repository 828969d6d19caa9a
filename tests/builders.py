"""Test builders: real patch folders and real package trees on disk, written from small dicts."""

from __future__ import annotations

import json
from pathlib import Path


def toml_value(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def patch_toml(pid: str, edits: list[dict], *, vllm: str = ">=0.1", extra: dict | None = None,
               upstreamed: dict | None = None, packages: dict | None = None) -> str:
    lines = [
        f"id = {toml_value(pid)}",
        f"title = {toml_value('test patch ' + pid)}",
        f"why = {toml_value('because the test says so')}",
        f"vllm = {toml_value(vllm)}",
    ]
    for key, value in (extra or {}).items():
        lines.append(f"{key} = {toml_value(value)}")
    lines += ["", "[origin]", 'author = "tests"', 'url = "https://example.invalid/"', 'license = "Apache-2.0"']
    lines += ["", "[upstream]", 'state = "none"', 'url = ""']
    if packages:
        lines += ["", "[packages]"] + [f"{k} = {toml_value(v)}" for k, v in packages.items()]
    if upstreamed:
        lines += ["", "[upstreamed]"] + [f"{k} = {toml_value(v)}" for k, v in upstreamed.items()]
    for edit in edits:
        lines += ["", "[[edit]]"] + [f"{k} = {toml_value(v)}" for k, v in edit.items()]
    return "\n".join(lines) + "\n"


def write_patchset(folder: Path, patches: dict[str, list[dict] | str], order: list[str] | None = None, **kw) -> Path:
    """patches: id -> edits (or raw patch.toml text). Returns the patches folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for pid, body in patches.items():
        (folder / pid).mkdir(exist_ok=True)
        text = body if isinstance(body, str) else patch_toml(pid, body, **kw.get(pid, {}))
        (folder / pid / "patch.toml").write_text(text)
    order = list(patches) if order is None else order
    (folder / "series.toml").write_text(f"series = {toml_value(order)}\n")
    return folder


def write_package(root: Path, files: dict[str, str | bytes], *, package: str = "vllm", version: str = "0.33.0") -> Path:
    """A site-packages-like dir holding `package` with the given files and a dist-info stating its version."""
    pkg = root / package
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    for path, content in files.items():
        target = pkg / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            target.write_text(content)
        else:
            target.write_bytes(content)
    dist = {"vllm": "vllm", "flashinfer": "flashinfer_python"}[package]
    info = root / f"{dist}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (journal and bytecode excluded) with its bytes, for byte-identity checks."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


ROOT_IMAGE = """
schema = 1
name = "{name}"
title = "t"
why = "w"
[base]
ref = "example.org/base:tag@sha256:{digest}"
platform = "linux/arm64"
source = "s"
why = "w"
[packages.vllm]
path = "/usr/lib/python3.12/site-packages/vllm"
version = "0.33.0"
why = "w"
[series]
patches = {series}
why = "w"
[env]
why = "w"
vars = {env}
"""
ENV_OK = ('{ TORCH_CUDA_ARCH_LIST = "12.1a", FLASHINFER_CUDA_ARCH_LIST = "12.1f", CUTE_DSL_ARCH = "sm_121a", '
          'CMAKE_CUDA_ARCHITECTURES = "121", VLLM_MLA_NOPE_PAD_ROPE = "1" }')
ARCH_ENV_ONLY = ENV_OK.replace(', VLLM_MLA_NOPE_PAD_ROPE = "1"', "")


def image_toml(name="a", series='["nope-mla-pad"]', env=ENV_OK, digest="0" * 64) -> str:
    """A root image.toml (no parent) for tests; `series` and `env` are TOML literals."""
    return ROOT_IMAGE.format(name=name, series=series, env=env, digest=digest)
