"""Untrusted JSON (manifests, configs, safetensors headers, registry answers), parsed fail-closed: as a
plain object (`load_json_object`) or against a msgspec schema (`decode`), every failure a PatchkitError
naming the document and, for a wrong shape, the JSON path (`$.layers[0].size`) and what was expected."""

from __future__ import annotations

import json
from typing import TypeVar

import msgspec

from patchkit.errors import PatchkitError
from patchkit.validation import problem_and_path

T = TypeVar("T")

class MalformedJson(PatchkitError):
    """A JSON document that does not parse or has the wrong shape (exit 2). `what` names the document,
    `at` is the JSON path of the offending value ("$" for the document itself), `problem` what was
    expected and found."""

    def __init__(self, what: str, problem: str, at: str = "$"):
        self.what, self.problem, self.at = what, problem, at
        place = "" if at == "$" else f" at {at}"
        super().__init__(f"{what}: {problem}{place}")


class CommandError(msgspec.Struct, kw_only=True):
    exit_code: int
    kind: str  # "usage", "error", "internal error", ...
    message: str


class FailedCommand(msgspec.Struct, kw_only=True):
    """What every patchkit command writes on stdout with --json when it fails (cli.common), and what the
    bump pull request's body reads back from a step that failed (upstream/bump_records.py)."""

    ok: bool  # always False
    error: CommandError


def load_json_object(data: bytes | str, what: str) -> dict:
    """`data` parsed as a JSON object; a clear error naming `what` for anything else."""
    try:
        value = json.loads(data)
    except RecursionError:  # a hostile document nested deeper than the parser's stack
        raise MalformedJson(what, "JSON nested too deeply to be a real document") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and an integer over Python's digit limit
        raise MalformedJson(what, f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedJson(what, f"not a JSON object (a JSON {type(value).__name__})")
    return value


def decode(data: bytes, schema: type[T], what: str) -> T:
    """`data` decoded into `schema` (a msgspec type): a wrong type, a missing field or a value out of its
    declared range is refused with the path to it, before any code sees the document."""
    try:
        return msgspec.json.decode(data, type=schema)
    except msgspec.ValidationError as exc:
        raise MalformedJson(what, *problem_and_path(exc)) from None
    except msgspec.DecodeError as exc:
        raise MalformedJson(what, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedJson(what, "JSON nested too deeply to be a real document") from None
