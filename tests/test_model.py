"""Bad patch files each give a clear error that names the file and the field."""

from __future__ import annotations

import pytest
from builders import patch_toml, write_patchset

from patchkit.errors import PatchkitError
from patchkit.patching.patchset import load_patchset

GOOD = {"file": "m.py", "action": "replace", "anchor": "a", "text": "b"}


def load(tmp_path, patches, order=None, **kw):
    return load_patchset(write_patchset(tmp_path / "patches", patches, order, **kw))


def error(tmp_path, patches, order=None, **kw) -> str:
    with pytest.raises(PatchkitError) as info:
        load(tmp_path, patches, order, **kw)
    return str(info.value)


def test_good_patch_loads_with_digest_and_defaults(tmp_path):
    ps = load(tmp_path, {"p": [GOOD]})
    p = ps.patch("p")
    assert p.edits[0].package == "vllm" and p.edits[0].count == 1
    assert p.digest.startswith("sha256:") and len(p.digest) == 71
    assert str(p.ranges["vllm"]) == ">=0.1"


@pytest.mark.parametrize(
    "body,needle",
    [
        ('id = "p"\ntitle = [unclosed\n', "malformed TOML"),
        (patch_toml("p", [{**GOOD, "action": "frobnicate"}]), "[[edit]] #1, key 'action': invalid enum value 'frobnicate'; expected one of 'assert', 'insert_after', 'insert_before', 'replace'"),
        (patch_toml("p", [{**GOOD, "count": 0}]), "[[edit]] #1, key 'count': expected `int` >= 1"),
        (patch_toml("p", [{**GOOD, "file": "../outside.py"}]), "escapes the package root"),
        (patch_toml("p", [{**GOOD, "file": "/etc/passwd"}]), "is absolute"),
        (patch_toml("p", [{**GOOD, "text": "a"}]), "changes nothing"),
        (patch_toml("p", [{"file": "m.py", "action": "replace", "anchor": "a"}]), "needs a non-empty text"),
        (patch_toml("p", [{"file": "m.py", "action": "assert", "anchor": "a", "text": "b"}]), "takes no text"),
        (patch_toml("p", [{**GOOD, "files": ["x.py"]}]), "exactly one of file or files"),
        (patch_toml("p", [{**GOOD, "flavour": 1}]), "[[edit]] #1: unknown key `flavour`"),
        (patch_toml("p", [GOOD], vllm="banana"), "invalid version range 'banana'"),
        (patch_toml("p", [{**GOOD, "package": "torch"}]), "package 'torch' has no version range"),
        (patch_toml("p", [GOOD], packages={"torch": ">=2"}), "unknown package 'torch'"),
        (patch_toml("q", [GOOD]), "differs from its folder name"),
        (patch_toml("p", []), "top level: missing required key `edit`"),
        (patch_toml("p", [{**GOOD, "action": "insert_after", "text": "xa"}]), "contains the anchor"),
        (patch_toml("p", [GOOD]).replace('title = "test patch p"', "title = 3"), "key 'title': expected `str`, got `int`"),
        (patch_toml("p", [GOOD]).replace('state = "none"', 'state = "maybe"'), "[upstream], key 'state': expected `str` matching"),
        (patch_toml("p", [GOOD]).replace('license = "Apache-2.0"\n', ""), "[origin]: missing required key `license`"),
        ("edit = []\n" + patch_toml("p", [GOOD]).split("[[edit]]")[0], "at least one [[edit]]"),
    ],
)
def test_malformed_patch_is_a_clear_error(tmp_path, body, needle):
    message = error(tmp_path, {"p": body})
    assert needle in message and "patch.toml" in message


def test_text_file_beside_the_patch(tmp_path):
    folder = write_patchset(tmp_path / "patches", {"p": [{"file": "m.py", "action": "replace", "anchor": "a",
                                                          "text_file": "body.txt"}]})
    (folder / "p" / "body.txt").write_text("long body\n")
    assert load_patchset(folder).patch("p").edits[0].text == "long body\n"
    (folder / "p" / "body.txt").unlink()
    with pytest.raises(PatchkitError, match="text_file 'body.txt' not found"):
        load_patchset(folder)


def test_series_rules(tmp_path):
    assert "duplicate patch ids" in error(tmp_path / "a", {"p": [GOOD]}, order=["p", "p"])
    assert "no folder" in error(tmp_path / "b", {"p": [GOOD]}, order=["p", "ghost"])
    assert "missing from the series" in error(tmp_path / "c", {"p": [GOOD], "q": [GOOD]}, order=["p"])
    ps = load(tmp_path / "d", {"p": [GOOD], "q": [GOOD]})
    assert [p.id for p in ps.series(["q"])] == ["q"]
    with pytest.raises(PatchkitError, match="not in the application order"):
        ps.series(["q", "p"])
    with pytest.raises(PatchkitError, match="unknown patches"):
        ps.series(["zz"])
