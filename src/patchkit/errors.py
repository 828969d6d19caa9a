"""The kinds of failure patchkit reports, each with its documented exit code.

Every error is meant to be read by a person: the message names the patch, the edit, the file, what was
expected and what was found. Nothing catches these to carry on; they stop the run before any write.

Each kind of failure a caller or a test tells apart is a subclass of one of the two below, defined in the
module that raises it (as packaging.utils holds InvalidWheelFilename): its fields are set in __init__ and
its message is built from them, so tests assert the kind and its fields, never the wording
(tests/test_error_kinds.py holds every kind to being raised and to naming its fields in its docstring).
This module keeps only the bases and their exit codes.
Exit 3 is kept for what patchkit did not expect (a bug): the command line reports it as an internal
error with how to report it, never as a traceback on its own.
"""

INTERNAL_ERROR_EXIT = 3


class PatchkitError(Exception):
    """Bad input, usage or environment: malformed files, unknown names, unreachable sources, a target that
    cannot be read or written (permissions, full or read-only disk, wrong kind of file) (exit code 2)."""

    exit_code = 2


class PatchFailed(PatchkitError):
    """A patch does not apply or is broken against the source at hand (exit code 1)."""

    exit_code = 1
