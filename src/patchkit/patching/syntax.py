"""Does a patched .py file still byte-compile? The check import itself applies.

Byte-compiling catches what a parse alone accepts (`return` outside a function) and costs under half
of ast.parse. The answer depends only on the bytes and the interpreter, so successes are remembered:
in memory for one run (verify plans the same patched files once per image series and version) and as
empty marker files in the user cache across runs, where compiling the ~40 patched files of 0.30-0.33
was a third of a warm `patchkit verify`. Failures are never remembered: they are rare and cheap.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import warnings

from patchkit.cache_root import default_cache_root


@functools.lru_cache(maxsize=64)
def syntax_error(path: str, new: bytes) -> str | None:
    """None if `new` byte-compiles, else "line N: why"."""
    marker = default_cache_root() / "compiles" / sys.implementation.cache_tag / hashlib.sha256(new).hexdigest()
    if marker.is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # upstream's own SyntaxWarnings are not this patch's to report
        try:
            compile(new, path, "exec", dont_inherit=True)
        except SyntaxError as e:
            return f"line {e.lineno}: {e.msg}"
        except ValueError as e:  # NUL bytes in the source
            return str(e)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # a read-only or full cache only costs the next run a compile
    return None
