"""One way to read patchkit's TOML files (patch.toml, series.toml, image.toml, variant.toml) against a
schema, with one error style: the file, the table and the key, then what was wrong.

The schemas are msgspec Structs that forbid unknown keys; msgspec validates types, required keys and
simple constraints while decoding, and writes the JSON Schema editors read (`patchkit schemas`).
Rules a type cannot say (a path stays inside its package, a range parses, an id equals its folder)
stay with the subsystem that owns the file.
"""

from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec

from patchkit.errors import PatchkitError
from patchkit.untrusted import read_file
from patchkit.validation import problem_and_path

T = TypeVar("T")


class InvalidDefinition(PatchkitError):
    """A definition file (patch.toml, series.toml, image.toml, variant.toml) refused (exit 2). `path` is the
    file; `at` the place in it as a reader finds it ("[[edit]] #1, key 'anchor'", "top level"), None when
    the file as a whole does not read; `problem` the kind of failure (for the schema: "syntax", "encoding",
    "nesting", "unknown-key", "missing-key", "value"; the subsystem owning the file adds its own); `detail`
    what was expected and what was found."""

    def __init__(self, path: Path | str, at: str | None, problem: str, detail: str):
        self.path, self.at, self.problem, self.detail = str(path), at, problem, detail
        super().__init__(f"{path}: {at}: {detail}" if at else f"{path}: {detail}")


class NoDefinitionFiles(PatchkitError):
    """A folder that holds no definition file of the kind asked for (exit 2): the `folder` looked in and
    the `file` name looked for there (image.toml, variant.toml), one folder deep."""

    def __init__(self, folder: Path | str, file: str):
        self.folder, self.file = str(folder), file
        super().__init__(f"no {file} under {folder}")


_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[['\"]([^'\"]+)['\"]\]")


def where(path: str, is_table: bool = False) -> str:
    """`$.edit[0].anchor` -> `[[edit]] #1, key 'anchor'`: how a reader finds the place in the file.
    `is_table`: the path names a table itself (an unknown or missing key inside it)."""
    steps = [m.group(1) or m.group(3) or int(m.group(2)) for m in _STEP.finditer(path)]
    if is_table:
        steps.append("")  # a key inside the table, named by the message
    table: list[str] = []   # the dotted name of the innermost table
    array_item = None       # 1-based position when that table is an array of tables
    key, item = None, None  # the key in it, and the position inside the key's own array
    for i, step in enumerate(steps):
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        last_name = all(isinstance(s, int) for s in steps[i + 1:])
        if isinstance(step, int):
            if key is not None:
                item = step + 1
            else:
                array_item = step + 1
        elif last_name and not (isinstance(nxt, int) and i + 2 < len(steps)):
            key = step
        else:
            table.append(step)
            array_item = None
    name = ".".join(table)
    parts = [f"[[{name}]] #{array_item}" if array_item else f"[{name}]"] if table else []
    if key:
        parts.append(f"key {key!r}" + (f", item {item}" if item else ""))
    return ", ".join(parts) or "top level"


def decode(data: bytes, schema: type[T], path: Path | str) -> T:
    """Decode TOML bytes into `schema`; every failure is an InvalidDefinition naming file, table and key."""
    try:
        return msgspec.toml.decode(data, type=schema)
    except msgspec.ValidationError as exc:
        what, json_path = problem_and_path(exc)
        at = _name_free_key(data, schema, json_path)
        what = what.replace("object contains unknown field", "unknown key").replace(
            "object missing required field", "missing required key")
        problem = "unknown-key" if what.startswith("unknown key") else (
            "missing-key" if what.startswith("missing required key") else "value")
        place = where(at, is_table=problem != "value")
        choices = _choices(schema, at)
        if choices:
            what += f"; expected one of {', '.join(map(repr, choices))}"
        raise InvalidDefinition(path, place, problem, what) from None
    except msgspec.DecodeError as exc:
        raise InvalidDefinition(path, None, "syntax", f"malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidDefinition(path, None, "encoding", f"not UTF-8: {exc}") from None
    except RecursionError:  # arrays or inline tables nested past the parser's stack: no definition is
        raise InvalidDefinition(path, None, "nesting", "malformed TOML: nested too deeply to be a definition file") from None


def _name_free_key(data: bytes | str, schema: type, path: str) -> str:
    """msgspec writes a bad value in a table of free keys (`[serve.env]`, `labels`) as `$.env[...]`;
    name its key by checking each value of that table alone against the table's value type (one pass:
    trying the whole document once per key was quadratic, 38 s for 8,000 keys)."""
    head, found, tail = path.partition("[...]")
    if not found:
        return path
    doc = tomllib.loads(data if isinstance(data, str) else data.decode("utf-8"))  # it parsed once already
    steps = [m.group(1) or m.group(3) or int(m.group(2)) for m in _STEP.finditer(head)]
    table: Any = doc  # a table, an array or a value, as the steps go down
    kind: Any = schema
    for step in steps:
        table, kind = table[step], _member_type(kind, step)
    value_type = get_args(_required(kind))[1] if get_origin(_required(kind)) is dict else None
    if value_type is None or not isinstance(table, dict):
        return path
    for key, value in table.items():
        try:
            msgspec.convert(value, value_type, str_keys=True,
                            builtin_types=(datetime.datetime, datetime.date, datetime.time))
        except msgspec.ValidationError:
            return f"{head}[{key!r}]{tail}"
    return path


def _required(kind: Any) -> Any:
    """`X | None` -> X."""
    args = [a for a in get_args(kind) if a is not type(None)] if get_origin(kind) in (Union, UnionType) else [kind]
    return args[0] if len(args) == 1 else kind


def _member_type(kind: Any, step: str | int) -> Any:
    """The type of field/key/item `step` inside a value of type `kind` (None when it cannot be told)."""
    kind = _required(kind)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        names = {f.encode_name: f.name for f in msgspec.structs.fields(kind)}
        return get_type_hints(kind, include_extras=True).get(names.get(step, "")) if isinstance(step, str) else None
    if get_origin(kind) is dict:
        return get_args(kind)[1]
    if get_origin(kind) in (list, tuple) and isinstance(step, int):
        return get_args(kind)[0]
    return None


def _choices(schema: type, path: str) -> tuple | None:
    """The values a Literal field admits, found by walking `path` through the schema's types."""
    info: msgspec.inspect.Type | None = msgspec.inspect.type_info(schema)
    for m in _STEP.finditer(path):
        while isinstance(info, msgspec.inspect.UnionType):  # `X | None`: the non-None member
            info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
        if isinstance(info, msgspec.inspect.StructType) and (m.group(1) or m.group(3)):
            fields = {f.encode_name: f.type for f in info.fields}
            info = fields.get(m.group(1) or m.group(3))
        elif isinstance(info, (msgspec.inspect.ListType, msgspec.inspect.DictType)):
            info = info.item_type if isinstance(info, msgspec.inspect.ListType) else info.value_type
        else:
            return None
    while isinstance(info, msgspec.inspect.UnionType):
        info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
    return info.values if isinstance(info, msgspec.inspect.LiteralType) else None


def load(path: Path, schema: type[T]) -> T:
    """Read `path` (a regular file within the definition limit: never a FIFO's wait, never /dev/zero read
    whole) and decode it into `schema`."""
    return decode(read_file(path, "definition"), schema, path)


def json_schema(schema: type, title: str, description: str) -> dict[str, Any]:
    """The JSON Schema of one file kind, for editors (taplo / Even Better TOML)."""
    doc = msgspec.json.schema(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
            "description": description, **doc}
