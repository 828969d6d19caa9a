"""The one way in for outside bytes (src/patchkit/untrusted.py): FIFOs, devices, directories, links to
them, sparse giants and endless lines are refused or cut, never read whole, never blocked on."""

from __future__ import annotations

import errno
import io
import os

import pytest

from patchkit.untrusted import InputTooLarge, NotARegularFile, UnreadableFile, lines, read_file, read_stream


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFile) as err:
        read_file(fifo, "config")
    assert err.value.found == "FIFO"


def test_a_link_to_a_device_is_refused(tmp_path):
    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(NotARegularFile) as err:
        read_file(tmp_path / "config.json", "config")
    assert err.value.found == "character device"


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(NotARegularFile):
        read_file(tmp_path, "config")


def test_a_sparse_giant_is_refused_by_its_size_unread(tmp_path):
    big = tmp_path / "config.json"
    with big.open("wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(InputTooLarge) as err:
        read_file(big, "config")
    assert (err.value.kind, err.value.size) == ("config", 2 << 30)
    assert "PATCHKIT_LIMIT_CONFIG" in str(err.value)


def test_the_limit_is_raised_by_its_environment_variable(tmp_path, monkeypatch):
    f = tmp_path / "config.json"
    f.write_bytes(b"x" * 100)
    monkeypatch.setenv("PATCHKIT_LIMIT_CONFIG", "99")
    with pytest.raises(InputTooLarge):
        read_file(f, "config")
    monkeypatch.setenv("PATCHKIT_LIMIT_CONFIG", "100")
    assert read_file(f, "config") == b"x" * 100


def test_a_missing_or_unreadable_file_names_itself_and_the_systems_reason(tmp_path):
    with pytest.raises(UnreadableFile) as info:
        read_file(tmp_path / "absent.json", "config")
    assert (info.value.what, info.value.reason, info.value.errno) == (str(tmp_path / "absent.json"), "not found",
                                                                      errno.ENOENT)
    assert str(info.value) == f"{tmp_path / 'absent.json'}: not found"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(UnreadableFile) as info:
        read_file(dangling, "config", "the config")
    assert (info.value.what, info.value.errno) == ("the config", errno.ENOENT)


def test_a_link_to_a_regular_file_is_followed(tmp_path):
    (tmp_path / "blob").write_bytes(b"{}")
    (tmp_path / "config.json").symlink_to(tmp_path / "blob")  # a Hugging Face cache snapshot
    assert read_file(tmp_path / "config.json", "config") == b"{}"


def test_a_stream_past_its_limit_is_refused():
    with pytest.raises(InputTooLarge):
        read_stream(io.BytesIO(b"x" * 11), "manifest", "a manifest", limit=10)
    assert read_stream(io.BytesIO(b"x" * 10), "manifest", "a manifest", limit=10) == b"x" * 10


def test_an_endless_line_is_cut_and_the_next_line_still_read(monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_LOG_LINE", "16")
    got = list(lines(io.BytesIO(b"short\n" + b"y" * 1000 + b"\nafter\r\n"), "a log"))
    assert got == [("short", False), ("y" * 16, True), ("after", False)]


def test_a_log_past_its_total_limit_is_refused(monkeypatch):
    monkeypatch.setenv("PATCHKIT_LIMIT_BOOT_LOG", "100")
    with pytest.raises(InputTooLarge):
        list(lines(io.BytesIO(b"line\n" * 100), "a log"))
