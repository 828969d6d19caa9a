"""The two kinds of failure patchkit reports, each with its documented exit code.

Every error is meant to be read by a person: the message names the patch, the edit, the file, what was
expected and what was found. Nothing catches these to carry on; they stop the run before any write.
"""


class PatchkitError(Exception):
    """Bad input or usage: malformed files, unknown names, unreachable sources (exit code 2)."""

    exit_code = 2


class PatchFailed(PatchkitError):
    """A patch does not apply or is broken against the source at hand (exit code 1)."""

    exit_code = 1
