"""A wheel's RECORD: one CSV row per file, `path,sha256=<urlsafe base64, unpadded>,size`.

The format is the binary distribution format's (packaging.python.org/specifications/recording-installed-
packages); the RECORD itself is listed with empty hash and size. Parsed and written with the csv module.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from dataclasses import dataclass


@dataclass(frozen=True)
class RecordRow:
    path: str
    hash: str  # "sha256=..." or "" for the RECORD itself
    size: str  # decimal, or ""


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def row_for(path: str, data: bytes) -> RecordRow:
    return RecordRow(path, record_hash(data), str(len(data)))


def parse_record(text: bytes) -> list[RecordRow]:
    """The rows of a RECORD, in order (duplicates kept, for the caller to refuse). ValueError for what is
    not a RECORD: not UTF-8, not CSV (a field over csv's 131,072-character limit, a NUL), a row without
    exactly 3 fields."""
    rows = []
    try:
        for number, fields in enumerate(csv.reader(io.StringIO(text.decode("utf-8"), newline="")), 1):
            if not fields:
                continue
            if len(fields) != 3:
                raise ValueError(f"row {number} has {len(fields)} fields, not 3 (path,hash,size): {fields!r:.200}")
            rows.append(RecordRow(*fields))
    except csv.Error as error:
        raise ValueError(f"not CSV: {error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8: {error}") from None
    return rows


def format_record(rows: list[RecordRow]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([row.path, row.hash, row.size])
    return out.getvalue().encode("utf-8")
