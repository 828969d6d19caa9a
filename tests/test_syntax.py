"""The compile check remembers successes across runs by content, and never remembers a failure."""

from __future__ import annotations

import hashlib
import sys

from patchkit.patching import syntax


def test_a_success_is_remembered_by_content_and_a_failure_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path))
    syntax.syntax_error.cache_clear()
    good, bad = b"def f():\n    return 1\n", b"return 1\n"  # `return` outside a function parses but does not compile
    assert syntax.syntax_error("m.py", good) is None
    markers = tmp_path / "compiles" / sys.implementation.cache_tag
    assert [p.name for p in markers.iterdir()] == [hashlib.sha256(good).hexdigest()]
    assert syntax.syntax_error("m.py", bad) == "line 1: 'return' outside function"
    syntax.syntax_error.cache_clear()
    assert syntax.syntax_error("m.py", bad) == "line 1: 'return' outside function"
    assert [p.name for p in markers.iterdir()] == [hashlib.sha256(good).hexdigest()]


def test_an_unwritable_cache_only_costs_a_compile(tmp_path, monkeypatch):
    (tmp_path / "compiles").write_text("a file where the folder would go")
    monkeypatch.setenv("PATCHKIT_CACHE_DIR", str(tmp_path))
    syntax.syntax_error.cache_clear()
    assert syntax.syntax_error("m.py", b"x = 1\n") is None
