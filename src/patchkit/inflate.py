"""Inflating gzip: ISA-L's inflate (`isal`, PyPI, about 2.5x zlib's speed) where the platform has a wheel
(x86-64, aarch64), Python's gzip otherwise, and what either raises on a damaged stream.

Both the sdist scan (sources.tarscan) and the layer reader (oci.layer) take a damaged stream as one of
INFLATE_ERRORS, so what counts as "not gzip" is said once, below every reader of it.
"""

from __future__ import annotations

import io
import zlib
from typing import BinaryIO

try:  # the same API as gzip
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _isal_error

    # isal's stub declares `error` an instance (`error: Exception`); it is the exception class
    _inflate_error: type[Exception] = _isal_error  # type: ignore[assignment]
except ImportError:  # pragma: no cover - depends on the platform
    import gzip as _gzip  # type: ignore[no-redef]  # igzip's API is gzip's

    _inflate_error = zlib.error

INFLATE_ERRORS = (OSError, EOFError, zlib.error, _inflate_error)


def open_gzip(file: BinaryIO | io.RawIOBase):
    """The inflated stream of an open gzip file, or of a raw stream (the layer reader's)."""
    return _gzip.open(file, "rb")
