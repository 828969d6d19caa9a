"""Bad patch files each give a typed error that names the file, the place in it and the kind of failure."""

from __future__ import annotations

import pytest

from builders import patch_toml, write_patchset
from patchkit.patching.patchset import InvalidPatchFile, InvalidSeries, UnknownPatch, load_patchset
from patchkit.tomlschema import InvalidDefinition

GOOD = {"file": "m.py", "action": "replace", "anchor": "a", "text": "b"}


def load(tmp_path, patches, order=None, **kw):
    return load_patchset(write_patchset(tmp_path / "patches", patches, order, **kw))


def error(tmp_path, patches, order=None, kind=InvalidDefinition, **kw):
    with pytest.raises(kind) as info:
        load(tmp_path, patches, order, **kw)
    return info.value


def test_good_patch_loads_with_digest_and_defaults(tmp_path):
    ps = load(tmp_path, {"p": [GOOD]})
    p = ps.patch("p")
    assert p.edits[0].package == "vllm" and p.edits[0].count == 1
    assert p.digest.startswith("sha256:") and len(p.digest) == 71
    assert str(p.ranges["vllm"]) == ">=0.1"


SCHEMA, RULE = InvalidDefinition, InvalidPatchFile


@pytest.mark.parametrize(
    "body,kind,at,problem",
    [
        ('id = "p"\ntitle = [unclosed\n', SCHEMA, None, "syntax"),
        (patch_toml("p", [{**GOOD, "action": "frobnicate"}]), SCHEMA, "[[edit]] #1, key 'action'", "value"),
        (patch_toml("p", [{**GOOD, "count": 0}]), SCHEMA, "[[edit]] #1, key 'count'", "value"),
        (patch_toml("p", [{**GOOD, "file": "../outside.py"}]), RULE, "[[edit]] #1", "escaping-path"),
        (patch_toml("p", [{**GOOD, "file": "/etc/passwd"}]), RULE, "[[edit]] #1", "absolute-path"),
        (patch_toml("p", [{**GOOD, "text": "a"}]), RULE, "[[edit]] #1", "changes-nothing"),
        (patch_toml("p", [{"file": "m.py", "action": "replace", "anchor": "a"}]), RULE, "[[edit]] #1", "changes-nothing"),
        (patch_toml("p", [{"file": "m.py", "action": "assert", "anchor": "a", "text": "b"}]), RULE, "[[edit]] #1",
         "assert-text"),
        (patch_toml("p", [{**GOOD, "files": ["x.py"]}]), RULE, "[[edit]] #1", "file-or-files"),
        (patch_toml("p", [{**GOOD, "flavour": 1}]), SCHEMA, "[[edit]] #1", "unknown-key"),
        (patch_toml("p", [GOOD], vllm="banana"), RULE, "key 'vllm'", "version-range"),
        (patch_toml("p", [{**GOOD, "package": "torch"}]), RULE, "[[edit]] #1", "no-range"),
        (patch_toml("p", [GOOD], packages={"torch": ">=2"}), RULE, "[packages]", "unknown-package"),
        (patch_toml("q", [GOOD]), RULE, "key 'id'", "folder-name"),
        (patch_toml("p", []), SCHEMA, "top level", "missing-key"),
        (patch_toml("p", [{**GOOD, "action": "insert_after", "text": "xa"}]), RULE, "[[edit]] #1", "anchor-in-text"),
        (patch_toml("p", [GOOD]).replace('title = "test patch p"', "title = 3"), SCHEMA, "key 'title'", "value"),
        (patch_toml("p", [GOOD]).replace('state = "none"', 'state = "maybe"'), SCHEMA, "[upstream], key 'state'",
         "value"),
        (patch_toml("p", [GOOD]).replace('license = "Apache-2.0"\n', ""), SCHEMA, "[origin]", "missing-key"),
        ("edit = []\n" + patch_toml("p", [GOOD]).split("[[edit]]")[0], RULE, None, "no-edit"),
    ],
)
def test_malformed_patch_is_a_typed_error_naming_file_and_place(tmp_path, body, kind, at, problem):
    found = error(tmp_path, {"p": body})
    assert type(found) is kind
    assert (found.path, found.at, found.problem) == (str(tmp_path / "patches" / "p" / "patch.toml"), at, problem)


def test_a_schema_error_reads_as_file_place_and_what_was_expected(tmp_path):
    found = error(tmp_path, {"p": patch_toml("p", [{**GOOD, "action": "frobnicate"}])})
    assert str(found) == (f"{tmp_path / 'patches' / 'p' / 'patch.toml'}: [[edit]] #1, key 'action': invalid enum "
                          "value 'frobnicate'; expected one of 'assert', 'insert_after', 'insert_before', 'replace'")


def test_a_rule_error_reads_as_file_place_and_what_was_found(tmp_path):
    found = error(tmp_path, {"p": patch_toml("p", [{**GOOD, "file": "../outside.py"}])})
    assert str(found) == (f"{tmp_path / 'patches' / 'p' / 'patch.toml'}: [[edit]] #1: path '../outside.py' "
                          "escapes the package root")


def test_text_file_beside_the_patch(tmp_path):
    folder = write_patchset(tmp_path / "patches", {"p": [{"file": "m.py", "action": "replace", "anchor": "a",
                                                          "text_file": "body.txt"}]})
    (folder / "p" / "body.txt").write_text("long body\n")
    assert load_patchset(folder).patch("p").edits[0].text == "long body\n"
    (folder / "p" / "body.txt").unlink()
    with pytest.raises(InvalidPatchFile) as info:
        load_patchset(folder)
    assert (info.value.at, info.value.problem) == ("[[edit]] #1", "text-file-missing")


@pytest.mark.parametrize("order,problem,patches", [
    (["p", "p"], "duplicate", ("p",)),
    (["p", "ghost"], "no-folder", ("ghost",)),
    (["p"], "unlisted", ("q",)),
])
def test_the_series_file_names_each_patch_folder_once(tmp_path, order, problem, patches):
    found = error(tmp_path, {"p": [GOOD], "q": [GOOD]}, order=order, kind=InvalidSeries)
    assert (found.path, found.problem, found.patches) == (str(tmp_path / "patches" / "series.toml"), problem, patches)


def test_a_series_is_a_subset_in_application_order(tmp_path):
    ps = load(tmp_path, {"p": [GOOD], "q": [GOOD]})
    assert [p.id for p in ps.series(["q"])] == ["q"]
    with pytest.raises(InvalidSeries) as info:
        ps.series(["q", "p"])
    assert (info.value.path, info.value.problem, info.value.patches, info.value.order) == (
        None, "order", ("q", "p"), ("p", "q"))
    with pytest.raises(InvalidSeries) as info:
        ps.series(["p", "p"])
    assert (info.value.problem, info.value.patches) == ("duplicate", ("p",))
    with pytest.raises(UnknownPatch) as info:
        ps.series(["p", "zz"])
    assert (info.value.patches, info.value.known, info.value.series) == (("zz",), ("p", "q"), ("p", "zz"))
    with pytest.raises(UnknownPatch) as info:
        ps.patch("zz")
    assert str(info.value) == "unknown patch 'zz'; the patch set has: p, q"
