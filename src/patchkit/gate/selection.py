"""Which of a release's own tests hold what the series edits.

The rule, for each vLLM file an applied edit writes (`a/b/c.py`):
- the tests mirroring its package: the deepest existing `tests/a/b`, else `tests/a` (vLLM lays its tests
  out by package: tests/parser for vllm/parser/, tests/entrypoints/openai/chat_completion for
  vllm/entrypoints/openai/chat_completion/);
- a top-level module's own file, `tests/test_c.py` (tests/test_envs.py for vllm/envs.py);
- every test file that names the module dotted (`vllm.a.b.c`): the reasoning and tool-parser tests that
  import the GLM parser from other folders, the serving tests elsewhere.
and always the model's own tests (tests/models/glm5next), whatever the series edits. A new patch brings
its files, and so its tests, in by itself. Edits of another package (FlashInfer) have no vLLM tests and
are counted as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from patchkit.errors import PatchkitError

MODEL_TESTS = "tests/models/glm5next"

# Named subsets for a budget (`--subset`): what CI's 50 minutes hold of the serving area, the parser
# engine's tests (its replay of every parser's streams, ~5,000 ids in under a minute) and the chat
# server's generators: where the 68 regressions of issue 30 were. The rest of tests/parser (Hub-bound
# mistral/cohere/harmony tests that fail alike offline) and the model area run daily. A subset only
# narrows the selection: it never runs a test the series does not touch.
SUBSETS: dict[str, tuple[str, ...]] = {
    "ci": ("tests/parser/engine", "tests/entrypoints/openai/chat_completion/test_serving_chat.py"),
}


class NothingSelected(PatchkitError):
    """No test of vLLM `release` is selected for the series' edits (under `narrow`'s paths, when given):
    the gate would compare nothing, so it refuses (exit 2)."""

    def __init__(self, release: str, narrow: tuple[str, ...] = ()):
        self.release, self.narrow = release, narrow
        super().__init__(f"no test of vLLM {release} is selected for the series' edits"
                         f"{' under ' + ', '.join(narrow) if narrow else ''}")


@dataclass
class Selection:
    """Test paths (relative to the sdist root), each with the edited files that brought it in."""

    paths: dict[str, set[str]] = field(default_factory=dict)
    untested: set[str] = field(default_factory=set)  # edited files of packages with no vLLM tests

    def add(self, path: str, why: str) -> None:
        self.paths.setdefault(path, set()).add(why)

    def narrowed(self, subset: tuple[str, ...]) -> Selection:
        """Only the selected paths under `subset`'s paths (a subset path under a selected folder is kept
        as the narrower path)."""
        out = Selection(untested=set(self.untested))
        for want in subset:
            for path, why in self.paths.items():
                if _under(want, path):
                    for w in why:
                        out.add(want, w)
                elif _under(path, want):
                    for w in why:
                        out.add(path, w)
        return out


def _under(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def select(root: Path, edited: list[tuple[str, str]]) -> Selection:
    """The tests under `root` (a release's sdist: its tests/ folder) for `edited`, (package, path) pairs
    relative to the package, e.g. ("vllm", "parser/glm47_moe.py")."""
    tests = root / "tests"
    selection = Selection()
    test_files = sorted(p.relative_to(root).as_posix() for p in tests.rglob("test_*.py"))
    texts = {f: (root / f).read_text(errors="replace") for f in test_files}
    for package, path in sorted(set(edited)):
        if package != "vllm":
            selection.untested.add(f"{package}/{path}")
            continue
        why = f"vllm/{path}"
        parts = PurePosixPath(path).with_suffix("").parts
        for depth in range(len(parts) - 1, 0, -1):
            mirror = tests.joinpath(*parts[:depth])
            if mirror.is_dir():
                selection.add(mirror.relative_to(root).as_posix(), why)
                break
        own = tests / f"test_{parts[-1]}.py"
        if len(parts) == 1 and own.is_file():
            selection.add(own.relative_to(root).as_posix(), why)
        dotted = "vllm." + ".".join(parts)
        for f, text in texts.items():
            if _names_module(text, dotted):
                selection.add(f, why)
    if (root / MODEL_TESTS).is_dir():
        selection.add(MODEL_TESTS, "the model's own tests")
    return _without_nested(selection)


def _names_module(text: str, dotted: str) -> bool:
    """`text` names the module `dotted` itself (not a longer module that starts with its name)."""
    start = text.find(dotted)
    while start != -1:
        end = start + len(dotted)
        if end == len(text) or not (text[end].isalnum() or text[end] == "_"):
            return True
        start = text.find(dotted, end)
    return False


def _without_nested(selection: Selection) -> Selection:
    """A file or folder inside a selected folder is run by that folder: one path, the reasons merged."""
    out = Selection(untested=selection.untested)
    for path in sorted(selection.paths, key=len):
        outer = next((p for p in out.paths if _under(path, p)), None)
        for why in selection.paths[path]:
            out.add(outer or path, why)
    return out
