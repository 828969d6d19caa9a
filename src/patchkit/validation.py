"""What msgspec says when a document has the wrong shape, read once for JSON (jsondata) and TOML
(tomlschema): its ValidationError message is the problem, then, where a value is at fault, " - at `$.path`"
(msgspec's own format: `Expected `int`, got `str` - at `$.layers[0].size``). msgspec gives the path only
inside that message, so it is split here rather than in each reader."""

from __future__ import annotations

import re

import msgspec

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `(?P<path>\$[^`]*)`)?$", re.S)


def problem_and_path(exc: msgspec.ValidationError) -> tuple[str, str]:
    """The problem, its first letter lowered (it continues a sentence naming the document), and the JSON
    path of the value at fault ("$" for the document itself)."""
    m = _AT.match(str(exc))
    assert m is not None  # every group is optional: the pattern matches any message
    problem = m.group("problem")
    return problem[:1].lower() + problem[1:], m.group("path") or "$"
