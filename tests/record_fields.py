"""Which fields a record lacks that the struct its reader decodes it into declares (tests only)."""

from __future__ import annotations

import types
import typing

import msgspec


def declared_but_absent(schema: type, data: object, at: str = "$") -> list[str]:
    """Every field `schema` (a msgspec Struct, or a list or dict of them) declares that `data` lacks, by its
    path: a field with a default is read silently as that default when a producer renames it."""
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin is list and isinstance(data, list):
        return [m for i, item in enumerate(data) for m in declared_but_absent(args[0], item, f"{at}[{i}]")]
    if origin is dict and isinstance(data, dict):
        return [m for k, item in data.items() for m in declared_but_absent(args[1], item, f"{at}.{k}")]
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return declared_but_absent(inner[0], data, at) if len(inner) == 1 and data is not None else []
    if not (isinstance(schema, type) and issubclass(schema, msgspec.Struct)) or not isinstance(data, dict):
        return []
    hints = typing.get_type_hints(schema)
    missing = []
    for f in msgspec.structs.fields(schema):
        if f.encode_name not in data:
            missing.append(f"{at}.{f.encode_name}")
        else:
            missing += declared_but_absent(hints[f.name], data[f.encode_name], f"{at}.{f.encode_name}")
    return missing
