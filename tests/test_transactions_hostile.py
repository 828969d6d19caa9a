"""A hostile tree: links, crafted journals, wrong kinds of files, copies, permissions.

Each case runs the real command line on a small real vLLM 0.33.0 tree with a sentinel directory beside
(outside) the target; after each, the sentinel is byte-identical, the refusal is exit 2 naming the path,
and nothing in the target was touched unless the case is one patchkit must (and can safely) finish.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

import transactions
from patchkit.patching.journal import COMMIT, INTENT, JOURNAL_DIR, encode_intent, sha256
from transactions import (
    CRASH,
    cli,
    count_steps,
    crash_at,
    leftovers,
    real_tree,
    small_series,
    tree_bytes,
)

NOBODY = 65534
scratch = transactions.scratch  # the fixture, by the name tests ask for


@pytest.fixture
def hostile(scratch):
    patches = small_series(scratch / "patches")
    root = real_tree(scratch / "site")
    sentinel = scratch / "sentinel"
    (sentinel / "deep").mkdir(parents=True)
    (sentinel / "keep.py").write_text("# must never change\n")
    (sentinel / "deep" / "data.bin").write_bytes(bytes(range(256)))
    before = {"sentinel": tree_bytes(sentinel), "tree": tree_bytes(root)}
    yield root, patches, sentinel, before
    assert tree_bytes(sentinel) == before["sentinel"]  # after every case, whatever it did
    assert sorted(p.name for p in sentinel.rglob("*")) == ["data.bin", "deep", "keep.py"]


def refused(result, *needles):
    assert result.code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def crafted_journal(root, entries, *, committed=True):
    journal = root / JOURNAL_DIR
    journal.mkdir()
    intent = json.dumps({"format": 1, "files": entries}).encode()
    (journal / INTENT).write_bytes(intent)
    if committed:
        (journal / COMMIT).write_text(sha256(intent))


def entry(path, old=b"", new=b"x"):
    return {"path": path, "old": sha256(old), "new": sha256(new), "mode": 0o644}


@pytest.mark.parametrize("command", ["status", "apply", "revert"])
def test_journal_symlinked_to_another_directory_is_refused_and_nothing_is_touched(hostile, command):
    root, patches, sentinel, before = hostile
    (root / JOURNAL_DIR).symlink_to(sentinel)
    refused(cli(command, "--target", root, "--patches", patches), str(root / JOURNAL_DIR), "symbolic link")
    assert (root / JOURNAL_DIR).is_symlink() and tree_bytes(root) == before["tree"]


def test_journal_that_is_a_file_is_refused(hostile):
    root, patches, _, before = hostile
    (root / JOURNAL_DIR).write_text("not a journal")
    refused(cli("apply", "--target", root, "--patches", patches), str(root / JOURNAL_DIR), "a file")
    assert tree_bytes(root) == {**before["tree"], JOURNAL_DIR: b"not a journal"}


@pytest.mark.parametrize("path", ["{sentinel}/keep.py", "../sentinel/keep.py", "vllm/../../sentinel/keep.py",
                                  "./vllm/__init__.py", "vllm//__init__.py", ".patchkit-journal/intent.json"])
def test_journal_naming_a_path_outside_or_unnormalised_is_refused(hostile, path):
    root, patches, sentinel, before = hostile
    crafted_journal(root, [entry(path.format(sentinel=sentinel), old=b"# must never change\n")])
    refused(cli("status", "--target", root, "--patches", patches), "journal names")
    assert (root / JOURNAL_DIR / INTENT).exists()  # kept, as found, for a person to look at
    assert {k: v for k, v in tree_bytes(root).items() if not k.startswith(JOURNAL_DIR)} == before["tree"]


def test_journal_path_through_a_symlinked_parent_is_refused(hostile):
    root, patches, sentinel, _ = hostile
    (root / "vllm" / "escape").symlink_to(sentinel)
    new = b"# overwritten\n"
    (sentinel / ".keep.py.patchkit-new").write_bytes(new)  # the planted "new copy", outside the target
    try:
        crafted_journal(root, [entry("vllm/escape/keep.py", old=b"# must never change\n", new=new)])
        refused(cli("status", "--target", root, "--patches", patches), str(root / "vllm" / "escape"),
                "symbolic link")
    finally:
        (sentinel / ".keep.py.patchkit-new").unlink()


@pytest.mark.parametrize("document", [b"{" * 200_000, b"[]", b'{"format": 1, "files": [{"path": 3}]}', b"\xff\xfe"])
def test_unreadable_or_hostile_journal_json_is_refused(hostile, document):
    root, patches, _, _ = hostile
    (root / JOURNAL_DIR).mkdir()
    (root / JOURNAL_DIR / INTENT).write_bytes(document)
    refused(cli("status", "--target", root, "--patches", patches), str(root / JOURNAL_DIR / INTENT))


def test_journal_holding_a_file_patchkit_never_writes_is_refused(hostile):
    root, patches, _, _ = hostile
    crafted_journal(root, [], committed=False)
    (root / JOURNAL_DIR / "notes.txt").write_text("mine")
    refused(cli("status", "--target", root, "--patches", patches), "notes.txt", "never writes")
    assert (root / JOURNAL_DIR / "notes.txt").read_text() == "mine"


def test_commit_record_of_another_intent_is_refused(hostile):
    root, patches, _, _ = hostile
    crafted_journal(root, [entry("vllm/__init__.py")])
    (root / JOURNAL_DIR / COMMIT).write_text(sha256(b"something else"))
    refused(cli("status", "--target", root, "--patches", patches), "does not belong")


def test_copied_crashed_tree_recovers_itself_only(hostile, scratch):
    """cp -a of a tree killed after its commit: recovering the copy finishes the copy and leaves the
    original exactly as it was (the journal names paths relative to its own target)."""
    root, patches, _, _ = hostile
    n, _ = count_steps("apply", "--target", root, "--patches", patches)
    assert cli("revert", "--target", root, "--patches", patches).code == 0
    commit_renamed = n - 8  # inside the roll-forward: after the commit, before the last file's rename
    assert crash_at(commit_renamed, "apply", "--target", root, "--patches", patches) == CRASH
    assert (root / JOURNAL_DIR / COMMIT).exists()
    crashed = tree_bytes(root)
    copy = scratch / "copy"
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    r = cli("status", "--target", copy, "--patches", patches)
    assert r.code == 0 and "rolled forward" in r.stderr
    assert leftovers(copy) == [] and tree_bytes(root) == crashed
    assert cli("status", "--target", root, "--patches", patches).code == 0
    assert tree_bytes(root) == tree_bytes(copy)


def test_package_file_that_is_a_symlink_is_not_written_through(hostile):
    root, patches, _, before = hostile
    target = root / "vllm/models/glm5next/nvidia/sparse_indexer.py"
    real = target.with_name("sparse_indexer_real.py")
    target.rename(real)
    target.symlink_to(real.name)  # inside the package: readable, but patchkit never writes through it
    refused(cli("apply", "--target", root, "--patches", patches), str(target), "symbolic link")
    assert target.is_symlink() and real.read_bytes() == before["tree"]["vllm/models/glm5next/nvidia/sparse_indexer.py"]
    assert leftovers(root) == []


def test_package_directory_linked_outside_is_refused(hostile):
    root, patches, _, _ = hostile
    nvidia = root / "vllm/models/glm5next/nvidia"
    shutil.copytree(nvidia, root.parent / "moved-nvidia")
    shutil.rmtree(nvidia)
    nvidia.symlink_to(root.parent / "moved-nvidia")
    moved = tree_bytes(root.parent / "moved-nvidia")
    refused(cli("apply", "--target", root, "--patches", patches), "outside the package root")
    assert tree_bytes(root.parent / "moved-nvidia") == moved


def test_fifo_where_a_patched_file_should_be_is_refused_without_hanging(hostile):
    root, patches, _, _ = hostile
    target = root / "vllm/models/glm5next/nvidia/sparse_indexer.py"
    target.unlink()
    os.mkfifo(target)
    refused(cli("apply", "--target", root, "--patches", patches), "not a regular file")


def test_read_only_file_is_replaced_with_its_mode_kept(hostile):
    root, patches, _, before = hostile
    target = root / "vllm/model_executor/layers/quantization/modelopt.py"
    target.chmod(0o444)
    assert cli("apply", "--target", root, "--patches", patches).code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o444
    assert cli("revert", "--target", root, "--patches", patches).code == 0
    assert tree_bytes(root) == before["tree"] and stat.S_IMODE(target.stat().st_mode) == 0o444


def as_nobody(*args) -> tuple[int, str]:
    """The CLI in a forked child that has dropped root (root ignores permission bits)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 99
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = cli(*args)
            os.write(write, result.stderr.encode())
            code = result.code
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        stderr = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr


def test_read_only_tree_for_a_non_root_user(hostile, scratch):
    """apply: exit 2 naming the directory it could not write, nothing written; status still reads it."""
    root, patches, _, before = hostile
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")  # CI and the dev machines run as root
    scratch.chmod(0o755)
    code, stderr = as_nobody("apply", "--target", root, "--patches", patches)
    assert code == 2 and str(root) in stderr and "Permission denied" in stderr and "Traceback" not in stderr
    assert tree_bytes(root) == before["tree"] and leftovers(root) == []
    code, stderr = as_nobody("status", "--target", root, "--patches", patches)
    assert code == 0, stderr


def test_leftover_new_copy_not_named_by_any_journal_is_not_removed(hostile):
    root, patches, _, before = hostile
    stray = root / "vllm/models/glm5next/nvidia/.sparse_indexer.py.patchkit-new"
    stray.write_text("someone's file")
    refused(cli("apply", "--target", root, "--patches", patches), str(stray), "no journal names it")
    assert stray.read_text() == "someone's file"
    assert {k: v for k, v in tree_bytes(root).items() if ".patchkit-new" not in k} == before["tree"]


def test_intent_round_trip_is_what_recovery_reads():
    """The encoder the writer uses produces what the validating decoder accepts (no drift between them)."""
    from patchkit.patching.journal import Entry, decode_intent

    entries = [Entry("vllm/a.py", sha256(b"a"), sha256(b"b"), 0o644)]
    assert decode_intent(encode_intent(entries), "test") == entries


def test_committed_new_copy_that_does_not_hash_as_recorded_is_refused(hostile):
    root, patches, _, _ = hostile
    target = "vllm/models/glm5next/nvidia/sparse_indexer.py"
    old = (root / target).read_bytes()
    crafted_journal(root, [entry(target, old=old, new=b"what the journal promised\n")])
    stray = root / "vllm/models/glm5next/nvidia/.sparse_indexer.py.patchkit-new"
    stray.write_bytes(b"something else\n")
    refused(cli("status", "--target", root, "--patches", patches), str(stray), "does not hold the bytes")
    assert (root / target).read_bytes() == old and stray.exists()


def test_hard_linked_copy_is_patched_without_writing_through_to_the_original(hostile, scratch):
    root, patches, _, before = hostile
    copy = scratch / "linked"
    shutil.copytree(root, copy, copy_function=os.link)
    assert cli("apply", "--target", copy, "--patches", patches).code == 0
    assert tree_bytes(root) == before["tree"] and tree_bytes(copy) != before["tree"]


def test_check_and_diff_of_a_tree_with_an_unfinished_journal_refuse_and_touch_nothing(hostile):
    """Reading commands take the tree's lock too, and never read a tree an interrupted run left behind."""
    root, patches, _, _ = hostile
    crafted_journal(root, [], committed=False)
    for command in ("check", "diff"):
        refused(cli(command, "--source", root, "--patches", patches), str(root / JOURNAL_DIR),
                f"patchkit status --target {root}")
    assert (root / JOURNAL_DIR / INTENT).exists()
    assert cli("status", "--target", root, "--patches", patches).code == 0
    assert cli("check", "--source", root, "--patches", patches).code == 0
