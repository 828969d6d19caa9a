"""Every kind of error patchkit defines is alive and says what it carries, and every bare raise is meant.

A kind (a PatchkitError subclass under src/) must be raised somewhere in src/ (or be the base of one that
is), carry fields (its __init__'s parameters, which tests assert on instead of matching the message's
prose) and name each field in its docstring as `field`. Kinds that predate the rule and live in modules
being reworked are listed in NOT_YET with what they lack; the list may only shrink: an entry whose kind
now passes (or lacks something else) fails the test until it is updated.

A bare `raise PatchkitError(...)` / `raise PatchFailed(...)` is kept only for an internal invariant (a
patchkit bug, which its message says): each is listed in INTERNAL by module and a piece of its message.
Input a user or the outside world gave is refused with a kind; modules still being typed are counted in
UNTYPED_YET, which may only shrink. A new bare raise anywhere in src/ fails the test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import patchkit
from patchkit.errors import PatchFailed, PatchkitError

SRC = Path(patchkit.__file__).parent
BASES = {PatchkitError, PatchFailed}  # the two exit codes, raised bare where no kind is worth a name yet

# "module.Class": what it lacks. Phase 2 of issue 24 (sources/, oci/registry+transport, images/, smoke/,
# spark/, census/jit_census, vllm_rules) gives these fields and docstrings.
NOT_YET: dict[str, str] = {}

# module (relative to src/patchkit) -> a piece of the message of each bare raise there that guards an
# internal invariant: a patchkit bug, never the user's input, and its message says so.
INTERNAL: dict[str, tuple[str, ...]] = {
    "images/engine.py": ("the engine pushes a name with a tag",),  # tags_for gives every push name one
    "oci/bodies.py": ("cannot be sent twice", "its size is unknown"),  # how registry.py hands over a body
    "smoke/api.py": ("max_tokens must be >=",),  # every caller's budget is a constant
    "smoke/containers.py": ("--gpus takes one of",),  # click.Choice of the same three
    "smoke/hardware.py": ("no host to run on",),  # the command line asks for --host
    "smoke/packing.py": ("config group makes it", "no packing for format"),  # patchkit's own layouts
    "smoke/synthetic_config.py": ("no config rule for {} (", "no config rule for quant_algo"),
    "smoke/synthetic_layout.py": ("no storage rule for format",),
    "sources/combined.py": ("no source given",),  # every command asks for one
    "smoke/quantprobe.py": ("tables for {} checkpoints",),  # the worker answers one table a job, in order
    "sources/directory.py": ("is not in {}",),
    "sources/image_files.py": ("has no path in this image definition",),  # a change was planned in the package  # its callers ask only for the packages it holds
    "wheels/build.py": ("has no member",),  # the plan was made on the same wheel's members
    "wheels/requires.py": ("cannot state",),  # packaging and the rewrite's pattern read the header alike
}
# Modules still being typed: how many bare raises each still has (only ever fewer). None left.
UNTYPED_YET: dict[str, int] = {}


def _kinds() -> list[type[PatchkitError]]:
    for module in pkgutil.walk_packages(patchkit.__path__, "patchkit."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, todo = [], [PatchkitError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("patchkit.") and sub not in found:
                found.append(sub)
                todo.append(sub)
    return [k for k in found if k not in BASES]


def _fields(kind: type) -> list[str]:
    owner = next((k for k in kind.__mro__ if "__init__" in vars(k)), None)
    if owner is None or owner in (Exception, BaseException, *BASES):
        return []
    return [p.name for p in list(inspect.signature(owner.__init__).parameters.values())[1:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _constructed(kind: type, source: str) -> bool:
    return re.search(rf"(?<!class )\b{kind.__name__}\(", source) is not None


def _lacks(kind: type, source: str, kinds: list[type]) -> list[str]:
    lacks = []
    if not _constructed(kind, source) and not any(issubclass(k, kind) and _constructed(k, source)
                                                  for k in kinds if k is not kind):
        lacks.append("raised")
    fields = _fields(kind)
    if not fields:
        lacks.append("fields")
    owner = next(k for k in kind.__mro__ if "__init__" in vars(k))  # a field documented where it is defined
    undocumented = [name for name in fields if f"`{name}`" not in (kind.__doc__ or "") + (owner.__doc__ or "")]
    if undocumented:
        lacks.append(f"docstring of {', '.join(undocumented)}")
    return lacks


def test_every_error_kind_is_raised_carries_fields_and_documents_them():
    source = "\n".join(p.read_text() for p in sorted(SRC.rglob("*.py")))
    kinds = _kinds()
    assert len(kinds) > 40, [k.__name__ for k in kinds]  # the walk found the package's kinds
    report = {f"{k.__module__}.{k.__qualname__}": _lacks(k, source, kinds) for k in kinds}
    failing = {name: ", ".join(lacks) for name, lacks in report.items() if lacks}
    assert {n: w for n, w in failing.items() if n not in NOT_YET} == {}, "kinds that are dead, bare or undocumented"
    # a kind not (yet) in the tree is no failure: the list names phase 2's kinds as other work leaves them
    changed = {n: w for n, w in NOT_YET.items() if n in report and failing.get(n) != w}
    assert changed == {}, "NOT_YET entries that changed: update or remove them"


def test_the_check_sees_a_dead_or_undocumented_kind():
    """The rule itself, on kinds made up here: one never raised, one without fields, one whose docstring
    leaves a field out."""

    class NeverRaised(PatchkitError):
        """`what` is documented."""

        def __init__(self, what: str):
            super().__init__(what)

    class Bare(PatchkitError):
        """No fields."""

    class Undocumented(PatchkitError):
        """Names `what` only."""

        def __init__(self, what: str, why: str):
            super().__init__(what)

    source = "raise Bare('x')\nraise Undocumented('a', 'b')\n"
    kinds = [NeverRaised, Bare, Undocumented]
    assert [_lacks(k, source, kinds) for k in kinds] == [["raised"], ["fields"], ["docstring of why"]]


def _message(node: ast.expr) -> str:
    """A message's text as written, each value put in it shown as {}."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_message(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message(node.left) + _message(node.right)
    return "{}"


def _bare_raises(path: Path) -> list[str]:
    """The message of every `raise PatchkitError(...)` / `raise PatchFailed(...)` in `path`, in order ("{}"
    for a raise of a bare name or of a message made elsewhere)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        call = node.exc if isinstance(node.exc, ast.Call) else None
        exc = call.func if call is not None else node.exc
        name = exc.attr if isinstance(exc, ast.Attribute) else exc.id if isinstance(exc, ast.Name) else None
        if name in {k.__name__ for k in BASES}:
            found.append((node.lineno, _message(call.args[0]) if call is not None and call.args else "{}"))
    return [message for _, message in sorted(found)]


def test_every_bare_raise_is_an_internal_invariant_that_says_so():
    unexplained: list[str] = []
    counts: dict[str, int] = {}
    listed = {(module, piece) for module, pieces in INTERNAL.items() for piece in pieces}
    matched = set()
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for raised in _bare_raises(path):
            if module in UNTYPED_YET:
                counts[module] = counts.get(module, 0) + 1
                continue
            pieces = [p for p in INTERNAL.get(module, ()) if p in raised]
            if len(pieces) != 1 or "a patchkit bug" not in raised:
                unexplained.append(f"{module}: {raised[:160]}")
            matched.update((module, p) for p in pieces)
    untyped = {m: n for m, n in UNTYPED_YET.items() if counts.get(m, 0) != n}
    assert unexplained == [], "bare raises: give the input a kind, or list the invariant in INTERNAL and say so"
    assert listed - matched == set(), "INTERNAL entries that match no bare raise: remove them"
    assert untyped == {}, f"UNTYPED_YET counts that changed (found {counts}): update them"


def test_the_bare_raise_check_sees_an_unlisted_raise(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from patchkit import errors\n"
                      "def f(x):\n    if x:\n        raise PatchkitError(f'bad {x}')\n"
                      "    raise errors.PatchFailed('x')\n    raise ValueError('not a base')\n")
    assert _bare_raises(source) == ["bad {}", "x"]


def test_a_bare_internal_raise_is_a_clean_exit_without_a_traceback():
    """What the command line makes of an invariant's bare raise: its exit code and message, no traceback."""
    import click
    from click.testing import CliRunner

    from patchkit.cli.common import PatchkitGroup

    @click.group(cls=PatchkitGroup)
    def group():
        pass

    @group.command()
    def broken():
        raise PatchkitError("no host to run on (a patchkit bug: please report it; the command line gives one)")

    result = CliRunner().invoke(group, ["broken"])
    assert result.exit_code == 2 and "a patchkit bug: please report it" in result.output
    assert "Traceback" not in result.output and result.exception is not None and isinstance(result.exception, SystemExit)
