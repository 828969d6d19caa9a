"""patchkit.sources against real things: directories, git repositories built with gitpython, sdists and
wheels built here, a real HTTP index on 127.0.0.1 (with faults injected), and, marked `network`, the
real vLLM 0.33.0 sdist from the Python package index."""

from __future__ import annotations

import gzip
import hashlib
import html
import http.server
import io
import json
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import git
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchkit.errors import PatchkitError
from patchkit.sources import (
    ArchiveCache,
    DirectorySource,
    FileCache,
    GitSource,
    SdistSource,
    WheelSource,
    combine_sources,
    discover_releases,
    open_source,
)
from patchkit.sources.archives import CorruptArchiveError
from patchkit.sources.base import (
    InvalidSourcePath,
    MetadataDisagrees,
    NoPackages,
    NoSuchSource,
    NotADistribution,
    NotARegularMember,
    UnknownPackage,
    relative_path,
)
from patchkit.sources.combined import PackageInTwoSources
from patchkit.sources.directory import OutsidePackageRoot
from patchkit.sources.git import GitFetchFailed, UnknownRef
from patchkit.sources.index import DownloadFailed, HashMismatch, IndexUnavailable, NotAProjectPage, NotOnIndex
from patchkit.sources.spec import InvalidSourceSpec
from patchkit.sources.verified_wheel import BadWheel
from wheel_files import record_hash, record_of

VLLM_FILES = {
    "__init__.py": b"from vllm.version import __version__\n",
    "config/model.py": b"class ModelConfig:\n    max_len = 4096\n",
    "models/glm5next/common/model.py": b"def forward(x):\n    return x\n",
}


# --- builders -------------------------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def tar_gz(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def sdist_bytes(
    dist: str,
    version: str,
    files: dict[str, bytes] = VLLM_FILES,
    *,
    package: str = "vllm",
    stated_version: str | None = None,
) -> bytes:
    top = f"{dist.replace('-', '_')}-{version}"
    pkg_info = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {stated_version or version}\n\n".encode()
    members = {f"{top}/PKG-INFO": pkg_info, f"{top}/setup.py": b"", f"{top}/csrc/kernel.cu": b"// cuda\n"}
    members |= {f"{top}/{package}/{name}": data for name, data in files.items()}
    return tar_gz(members)


def wheel_bytes(
    dist: str,
    version: str,
    files: dict[str, bytes] = VLLM_FILES,
    *,
    package: str = "vllm",
    stated_version: str | None = None,
) -> bytes:
    """A wheel as setuptools writes one: the package's files, METADATA, WHEEL and a RECORD hashing each."""
    buffer = io.BytesIO()
    dist_info = f"{dist.replace('-', '_')}-{version}.dist-info"
    members = {f"{package}/{name}": data for name, data in files.items()}
    members[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {stated_version or version}\n".encode()
    )
    members[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\n"
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{dist_info}/RECORD", record_of(members, dist_info))
    return buffer.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


ME = git.Actor("patchkit tests", "tests@patchkit.invalid")


def commit(repo: git.Repo, files: dict[str, bytes], message: str = "change") -> git.Commit:
    root = Path(repo.working_tree_dir)
    write_tree(root, files)
    repo.index.add(list(files))
    return repo.index.commit(message, author=ME, committer=ME)


@pytest.fixture
def vllm_repo(tmp_path: Path) -> git.Repo:
    """main: v0.33.0 tag, then two more commits."""
    repo = git.Repo.init(tmp_path / "vllm-repo", initial_branch="main")
    commit(repo, {f"vllm/{name}": data for name, data in VLLM_FILES.items()} | {"setup.py": b""}, "release")
    repo.create_tag("v0.33.0")
    commit(repo, {"vllm/config/model.py": b"class ModelConfig:\n    max_len = 8192\n"})
    commit(repo, {"README.md": b"docs\n"})
    return repo


# --- a real package index on 127.0.0.1 ------------------------------------------------------------


class FakeIndex:
    """Simple API project pages (PEP 691 JSON; PEP 503 HTML when `content_type` is text/html) + files,
    with faults: "truncate" (close mid-body), "http500", "no-length" (no Content-Length, the body then a close).
    `recorded` project pages (a real index's answer, tests/data/index/) are served as they are."""

    def __init__(self) -> None:
        self.projects: dict[str, list[dict]] = {}
        self.recorded: dict[str, bytes] = {}
        self.bodies: dict[str, bytes] = {}
        self.faults: dict[str, str] = {}
        self.requests: list[str] = []
        self.content_type = "application/vnd.pypi.simple.v1+json"
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.recorded:
                    return self.reply(index.recorded[parts[1]], "application/vnd.pypi.simple.v1+json")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.projects:
                    files = index.projects[parts[1]]
                    if index.content_type == "text/html":
                        return self.reply(html_page(files).encode(), index.content_type)
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": parts[1], "files": files})
                    return self.reply(body.encode(), index.content_type)
                if parts[0] == "files" and len(parts) == 2 and parts[1] in index.bodies:
                    body, fault = index.bodies[parts[1]], index.faults.get(parts[1])
                    if fault == "http500":
                        return self.send_error(500)
                    if fault == "no-length":  # a body delimited by the connection's close, of any length
                        self.close_connection = True
                        self.send_response(200)
                        self.send_header("Content-Type", "application/octet-stream")
                        self.end_headers()
                        return self.wfile.write(body)
                    if fault == "truncate":
                        self.close_connection = True
                        return self.reply(body, "application/octet-stream", send=len(body) // 2)
                    return self.reply(body, "application/octet-stream")
                return self.send_error(404)

            def reply(self, body: bytes, content_type: str, send: int | None = None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:send])

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(
        self, dist: str, filename: str, body: bytes, *, listed_sha256: str | None = None, yanked: bool = False
    ) -> None:
        self.bodies[filename] = body
        self.projects.setdefault(dist, []).append(
            {
                "filename": filename,
                "url": f"../../files/{filename}",  # relative to the project page, as indexes may answer
                "hashes": {"sha256": listed_sha256 or sha256(body)},
                "size": len(body),
                "yanked": yanked,
            }
        )

    def file_requests(self) -> list[str]:
        return [path for path in self.requests if path.startswith("/files/")]


def html_page(files: list[dict]) -> str:
    """PEP 503: one anchor per file, its sha256 in the fragment, `data-yanked` on a yanked one."""
    links = []
    for file in files:
        yanked = ' data-yanked=""' if file.get("yanked") else ""
        href = html.escape(f"{file['url']}#sha256={file['hashes']['sha256']}")
        links.append(f'<a href="{href}"{yanked}>{html.escape(file["filename"])}</a><br/>')
    return "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    fake = FakeIndex()
    monkeypatch.setenv("PATCHKIT_INDEX_URL", fake.url)
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def cache(tmp_path: Path) -> ArchiveCache:
    return ArchiveCache(tmp_path / "cache")


def cache_entries(cache: ArchiveCache) -> list[str]:
    return sorted(p.name for p in cache.downloads.iterdir()) if cache.downloads.exists() else []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- paths ------------------------------------------------------------------------------------------


def test_relative_path_normalises_and_refuses_escapes():
    assert relative_path("config/./model.py") == "config/model.py"
    assert relative_path("config//model.py") == "config/model.py"
    for bad, problem in [("../etc/passwd", "climbs-out"), ("config/../../x", "climbs-out"), ("/etc/passwd", "absolute"),
                         ("", "empty"), (".", "package-root"), ("a\\b.py", "not-posix")]:
        with pytest.raises(InvalidSourcePath) as info:
            relative_path(bad)
        assert (info.value.path, info.value.problem) == (bad, problem)
    assert str(info.value) == "path 'a\\\\b.py' is not a POSIX path (backslash or NUL character)"


# --- directory ------------------------------------------------------------------------------------


def test_directory_checkout_reads_files_and_versions_from_version_py(tmp_path):
    write_tree(tmp_path / "vllm", VLLM_FILES | {"_version.py": b"version: str\n__version__ = version = '0.33.0'\n"})
    source = DirectorySource(tmp_path)
    assert source.versions() == {"vllm": "0.33.0"}
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert source.read("vllm", "config/missing.py") is None
    assert source.read("flashinfer", "__init__.py") is None  # package absent
    assert source.package_root("vllm") == (tmp_path / "vllm").resolve()
    assert source.description == f"vllm 0.33.0 directory {tmp_path.resolve()}"
    with pytest.raises(UnknownPackage, match=r"unknown package 'vlm': patchkit knows vllm, flashinfer") as unknown:
        source.read("vlm", "config/model.py")
    assert (unknown.value.name, unknown.value.known) == ("vlm", ("vllm", "flashinfer"))
    with pytest.raises(NotARegularMember) as info:
        source.read("vllm", "config")
    assert (info.value.member, info.value.found) == ("vllm/config", "not a regular file")


def test_directory_that_is_the_package_takes_the_version_from_pkg_info_beside_it(tmp_path):
    write_tree(tmp_path / "vllm-0.32.0", {"PKG-INFO": b"Name: vllm\nVersion: 0.32.0\n\n"})
    write_tree(tmp_path / "vllm-0.32.0" / "vllm", VLLM_FILES)
    source = DirectorySource(tmp_path / "vllm-0.32.0" / "vllm")
    assert source.versions() == {"vllm": "0.32.0"}
    assert source.read("vllm", "models/glm5next/common/model.py") == VLLM_FILES["models/glm5next/common/model.py"]


def test_directory_site_packages_versions_come_from_dist_info(tmp_path):
    site = tmp_path / "site-packages"
    write_tree(site / "vllm", VLLM_FILES)
    write_tree(site / "flashinfer", {"__init__.py": b"", "jit/core.py": b"JIT = 1\n"})
    write_tree(site / "vllm-0.33.0.dist-info", {"METADATA": b"Name: vllm\nVersion: 0.33.0\n"})
    write_tree(
        site / "flashinfer_python-0.7.2.post1.dist-info",
        {"METADATA": b"Name: flashinfer-python\nVersion: 0.7.2.post1\n"},
    )
    write_tree(site / "numpy", {"__init__.py": b""})
    source = DirectorySource(site)
    assert source.versions() == {"vllm": "0.33.0", "flashinfer": "0.7.2.post1"}
    assert source.read("flashinfer", "jit/core.py") == b"JIT = 1\n"


def test_directory_refuses_two_installed_versions_of_one_distribution(tmp_path):
    write_tree(tmp_path / "vllm", VLLM_FILES)
    write_tree(tmp_path / "vllm-0.32.0.dist-info", {"METADATA": b"Name: vllm\nVersion: 0.32.0\n"})
    write_tree(tmp_path / "vllm-0.33.0.dist-info", {"METADATA": b"Name: vllm\nVersion: 0.33.0\n"})
    with pytest.raises(NotADistribution) as info:
        DirectorySource(tmp_path)
    assert (info.value.path, info.value.problem) == (tmp_path, "several installed versions of vllm")
    assert info.value.found == "vllm-0.32.0.dist-info, vllm-0.33.0.dist-info"


def test_directory_version_from_static_pyproject_else_unknown(tmp_path):
    write_tree(tmp_path / "a" / "src" / "flashinfer", {"__init__.py": b""})
    write_tree(tmp_path / "a", {"pyproject.toml": b'[project]\nname = "flashinfer-python"\nversion = "0.7.2"\n'})
    assert DirectorySource(tmp_path / "a").versions() == {"flashinfer": "0.7.2"}
    write_tree(tmp_path / "b" / "vllm", VLLM_FILES)
    write_tree(tmp_path / "b", {"pyproject.toml": b'[project]\nname = "vllm"\ndynamic = ["version"]\n'})
    assert DirectorySource(tmp_path / "b").versions() == {"vllm": "unknown"}


def test_directory_refuses_paths_escaping_the_package_root(tmp_path):
    write_tree(tmp_path / "vllm", VLLM_FILES)
    write_tree(tmp_path, {"secret.txt": b"secret"})
    (tmp_path / "vllm" / "outside.py").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "vllm" / "inside.py").symlink_to(tmp_path / "vllm" / "config" / "model.py")
    source = DirectorySource(tmp_path)
    for bad in ("../secret.txt", "/etc/passwd", "config/../../secret.txt"):
        with pytest.raises(InvalidSourcePath) as refused:
            source.read("vllm", bad)
        assert refused.value.path == bad
    with pytest.raises(OutsidePackageRoot) as info:
        source.read("vllm", "outside.py")
    assert (info.value.member, info.value.root) == ("vllm/outside.py", (tmp_path / "vllm").resolve())
    assert source.read("vllm", "inside.py") == VLLM_FILES["config/model.py"]
    (tmp_path / "vllm" / "loop.py").symlink_to(tmp_path / "vllm" / "loop.py")  # a link to itself
    with pytest.raises(NotARegularMember) as loop:
        source.read("vllm", "loop.py")
    assert (loop.value.member, loop.value.where) == ("vllm/loop.py", str((tmp_path / "vllm").resolve()))
    assert loop.value.found.startswith("a link that does not resolve")


def test_directory_without_packages_or_missing_is_an_error(tmp_path):
    with pytest.raises(NoSuchSource) as missing:
        DirectorySource(tmp_path / "nowhere")
    assert (missing.value.kind, missing.value.path, missing.value.problem) == (
        "source directory", tmp_path / "nowhere", "does not exist")
    with pytest.raises(NoPackages) as info:
        DirectorySource(tmp_path)
    assert (info.value.where, info.value.looked_for) == (str(tmp_path.resolve()), ("vllm/__init__.py",
                                                                                   "flashinfer/__init__.py"))


# --- sdist and wheel files ------------------------------------------------------------------------


def test_sdist_file_reads_members_and_version_from_pkg_info(tmp_path):
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(sdist_bytes("vllm", "0.33.0"))
    source = open_source(str(path))
    assert isinstance(source, SdistSource)
    assert source.versions() == {"vllm": "0.33.0"}
    assert source.read_many("vllm", ["config/model.py", "nope.py"]) == {
        "config/model.py": VLLM_FILES["config/model.py"],
        "nope.py": None,
    }
    assert source.read("flashinfer", "__init__.py") is None
    with pytest.raises(InvalidSourcePath) as info:
        source.read("vllm", "../PKG-INFO")
    assert info.value.problem == "climbs-out"
    path.write_bytes(b"garbage")  # the one pass at open kept the package files: no second pass
    assert source.read("vllm", "models/glm5next/common/model.py") == VLLM_FILES["models/glm5next/common/model.py"]


def test_sdist_with_a_damaged_member_header_is_refused_not_cut_short(tmp_path):
    members = {
        "vllm-0.33.0/PKG-INFO": b"Name: vllm\nVersion: 0.33.0\n",
        "vllm-0.33.0/vllm/__init__.py": b"",
        "vllm-0.33.0/vllm/a.py": b"A\n",
        "vllm-0.33.0/vllm/b.py": b"B\n",
    }
    raw = bytearray(gzip.decompress(tar_gz(members)))
    raw[raw.index(b"vllm-0.33.0/vllm/a.py")] ^= 0xFF  # the header checksum no longer matches
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(CorruptArchiveError) as info:
        SdistSource(path)
    assert (info.value.path, info.value.removed) == (path, False) and "damaged member header" in info.value.reason
    assert path.exists()  # not a cache entry: left alone


def test_sdist_refuses_links_and_non_sdists(tmp_path):
    top = "vllm-0.33.0"
    linked = tmp_path / "linked.tar.gz"
    linked.write_bytes(
        tar_gz(
            {f"{top}/PKG-INFO": b"Name: vllm\nVersion: 0.33.0\n", f"{top}/vllm/__init__.py": b""},
            symlinks={f"{top}/vllm/evil.py": "/etc/passwd"},
        )
    )
    with pytest.raises(NotARegularMember, match=r"vllm/evil.py is a link in .*: patchkit reads regular files") as link:
        SdistSource(linked).read("vllm", "evil.py")
    assert (link.value.member, link.value.found, link.value.where) == ("vllm/evil.py", "a link", str(linked))
    bare = tmp_path / "bare.tar.gz"
    bare.write_bytes(tar_gz({"vllm/__init__.py": b""}))
    with pytest.raises(NotADistribution) as info:
        SdistSource(bare)
    assert (info.value.path, info.value.problem, info.value.found) == (bare, "not an sdist", "none")


def test_file_cache_serves_a_warm_run_without_touching_the_archive(tmp_path):
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(sdist_bytes("vllm", "0.33.0"))
    files = FileCache(tmp_path / "files")
    cold = SdistSource(path, files=files, key="vllm-0.33.0-test")
    assert cold.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    path.write_bytes(b"garbage: a warm run must not decompress")
    warm = SdistSource(path, files=files, key="vllm-0.33.0-test")
    assert warm.versions() == {"vllm": "0.33.0"}
    assert warm.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert warm.read("vllm", "absent.py") is None  # the member list is cached too


def test_file_cache_drops_a_damaged_entry_and_reads_the_archive_again(tmp_path):
    path = tmp_path / "vllm-0.33.0.tar.gz"
    path.write_bytes(sdist_bytes("vllm", "0.33.0"))
    files = FileCache(tmp_path / "files")
    SdistSource(path, files=files, key="k").read("vllm", "config/model.py")
    blob = files.root / "blobs" / sha256(VLLM_FILES["config/model.py"])[:2] / sha256(VLLM_FILES["config/model.py"])
    blob.write_bytes(b"bit rot")
    assert SdistSource(path, files=files, key="k").read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert blob.read_bytes() == VLLM_FILES["config/model.py"]


def test_wheel_file_reads_members_and_version_from_metadata(tmp_path):
    path = tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl"
    path.write_bytes(
        wheel_bytes(
            "flashinfer-python", "0.7.2.post1", {"__init__.py": b"", "jit/core.py": b"JIT\n"}, package="flashinfer"
        )
    )
    source = open_source(str(path))
    assert isinstance(source, WheelSource)
    assert source.versions() == {"flashinfer": "0.7.2.post1"}
    assert source.read("flashinfer", "jit/core.py") == b"JIT\n"
    assert source.read("vllm", "config/model.py") is None


def test_wheel_whose_metadata_contradicts_its_name_or_that_is_corrupt_is_refused(tmp_path):
    lying = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    lying.write_bytes(wheel_bytes("vllm", "0.33.0", stated_version="0.32.0"))
    with pytest.raises(BadWheel) as lie:
        WheelSource(lying)
    assert (lie.value.problem, lie.value.member, lie.value.detail) == (
        "metadata", "vllm-0.33.0.dist-info/METADATA", "METADATA says vllm 0.32.0, the file name vllm 0.33.0")
    corrupt = tmp_path / "vllm-0.33.1-py3-none-any.whl"
    corrupt.write_bytes(wheel_bytes("vllm", "0.33.1")[:200])
    with pytest.raises(BadWheel) as info:
        WheelSource(corrupt)
    assert (info.value.wheel, info.value.problem, info.value.removed) == (str(corrupt), "zip", False)
    assert corrupt.exists()  # a user's file is never deleted


def test_a_wheel_member_that_differs_from_its_record_is_refused_before_it_is_read(tmp_path):
    """The RECORD of one wheel, the members of another: refused whole, naming what RECORD says and what
    the member's bytes hash to, before the planner reads a file."""
    files = {**VLLM_FILES, "config/model.py": b"MODEL = 'tampered'\n"}
    honest = io.BytesIO(wheel_bytes("vllm", "0.33.0"))
    path = tmp_path / "vllm-0.33.0-py3-none-any.whl"
    with zipfile.ZipFile(honest) as stock, zipfile.ZipFile(path, "w") as out:
        for info in stock.infolist():
            name = info.filename.removeprefix("vllm/")
            out.writestr(info, files[name] if info.filename.startswith("vllm/") else stock.read(info))
    with pytest.raises(BadWheel) as refused:
        open_source(str(path))
    assert (refused.value.problem, refused.value.member) == ("hash", "vllm/config/model.py")
    assert refused.value.detail == (f"RECORD says {record_hash(VLLM_FILES['config/model.py'])}, its bytes hash to "
                                    f"{record_hash(files['config/model.py'])}")


def test_a_release_wheel_from_the_index_is_verified_and_dropped_from_the_cache_when_bad(index, cache):
    """The index's sha256 vouches for the download, not for the wheel: one whose RECORD disowns a member
    is refused like a person's, and the cache forgets it."""
    files = {"__init__.py": b"", "jit/core.py": b"JIT\n"}
    good = wheel_bytes("flashinfer-python", "0.7.2.post1", files, package="flashinfer")
    raw = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as stock, zipfile.ZipFile(raw, "w") as out:
        for info in stock.infolist():
            out.writestr(info, b"EVIL\n" if info.filename == "flashinfer/jit/core.py" else stock.read(info))
    index.add("flashinfer-python", "flashinfer_python-0.7.2.post1-py3-none-any.whl", raw.getvalue())
    with pytest.raises(BadWheel, match=r"member 'flashinfer/jit/core.py': RECORD says sha256=.*removed it from the "
                       r"cache") as refused:
        open_source("flashinfer-python==0.7.2.post1", cache=cache, progress=False)
    assert (refused.value.problem, refused.value.removed) == ("hash", True)
    assert cache_entries(cache) == []


# --- the package index ----------------------------------------------------------------------------


def test_release_is_downloaded_once_then_read_offline(index, cache, capsys):
    body = sdist_bytes("vllm", "0.33.0")
    index.add("vllm", "vllm-0.33.0.tar.gz", body)
    source = open_source("0.33.0", cache=cache, progress=True)
    assert source.versions() == {"vllm": "0.33.0"}
    assert source.description == f"vllm 0.33.0 sdist (index, sha256 {sha256(body)[:12]})"
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert "vllm-0.33.0.tar.gz" in capsys.readouterr().err  # the progress bar, on stderr
    assert index.file_requests() == ["/files/vllm-0.33.0.tar.gz"]

    index.server.shutdown()  # the index is gone: a cached release must not need it
    again = open_source("vllm==0.33.0", cache=cache)
    assert again.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]


def test_sha256_mismatch_names_url_and_hashes_and_caches_nothing(index, cache):
    body = sdist_bytes("vllm", "0.33.0")
    index.add("vllm", "vllm-0.33.0.tar.gz", body, listed_sha256="0" * 64)
    with pytest.raises(HashMismatch) as failure:
        open_source("vllm==0.33.0", cache=cache, progress=False)
    assert failure.value.url.endswith("/files/vllm-0.33.0.tar.gz")
    assert (failure.value.expected, failure.value.actual) == ("0" * 64, sha256(body))
    assert cache_entries(cache) == []


def test_truncated_download_and_server_error_cache_nothing(index, cache):
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0"))
    index.faults["vllm-0.33.0.tar.gz"] = "truncate"
    with pytest.raises(DownloadFailed, match=r"download of http://127.0.0.1:.*/files/vllm-0.33.0.tar.gz failed") as cut:
        open_source("vllm==0.33.0", cache=cache, progress=False)
    assert cut.value.url.endswith("/files/vllm-0.33.0.tar.gz")
    assert cache_entries(cache) == []
    index.faults["vllm-0.33.0.tar.gz"] = "http500"
    with pytest.raises(DownloadFailed) as failed:
        open_source("vllm==0.33.0", cache=cache, progress=False)
    assert (failed.value.received, "500" in failed.value.reason) == (0, True)
    assert cache_entries(cache) == []


def test_corrupt_archive_with_matching_hash_is_refused_and_dropped_from_the_cache(index, cache):
    body = sdist_bytes("vllm", "0.33.0")
    crc = int.from_bytes(body[-8:-4], "little")
    damaged = body[:-8] + (crc ^ 1).to_bytes(4, "little") + body[-4:]  # only the gzip CRC check can tell
    index.add("vllm", "vllm-0.33.0.tar.gz", damaged)
    with pytest.raises(CorruptArchiveError, match=r"corrupt or truncated.*CRC.*removed it from the cache") as info:
        open_source("vllm==0.33.0", cache=cache, progress=False)
    assert info.value.removed and "CRC" in info.value.reason
    assert cache_entries(cache) == []


def test_unreachable_index_is_an_error_naming_the_url(monkeypatch, cache):
    url = f"http://127.0.0.1:{free_port()}/simple"
    monkeypatch.setenv("PATCHKIT_INDEX_URL", url)
    with pytest.raises(IndexUnavailable, match=f"cannot reach the package index at {url}/vllm/") as info:
        open_source("vllm==0.33.0", cache=cache)
    assert (info.value.url, info.value.status) == (f"{url}/vllm/", None)
    assert cache_entries(cache) == []


def test_unknown_version_project_or_unreadable_index_page(index, cache):
    index.add("vllm", "vllm-0.32.0.tar.gz", sdist_bytes("vllm", "0.32.0"))
    with pytest.raises(NotOnIndex, match=r"vllm 0.33.0 is not on the package index .*latest releases: 0.32.0") as old:
        open_source("vllm==0.33.0", cache=cache)
    assert (old.value.dist, old.value.version, old.value.latest) == ("vllm", "0.33.0", ("0.32.0",))
    with pytest.raises(NotOnIndex) as absent:
        open_source("flashinfer-python==0.7.2", cache=cache)
    assert (absent.value.dist, absent.value.version) == ("flashinfer-python", None)
    index.content_type = "text/plain"
    with pytest.raises(NotAProjectPage) as plain:
        open_source("vllm==0.32.0", cache=cache)
    assert plain.value.page.endswith("/simple/vllm/") and "'text/plain'" in plain.value.detail
    index.content_type = "application/vnd.pypi.simple.v1+json"
    index.projects["vllm"].append({"filename": "vllm-0.33.0.tar.gz"})  # no url, no hashes: not PEP 691
    fields = r"\(files.1.url: Field required; files.1.hashes: Field required\); PATCHKIT_INDEX_URL must name"
    with pytest.raises(NotAProjectPage, match=r"/simple/vllm/ is not a simple API project page.* " + fields):
        open_source("vllm==0.32.0", cache=cache)


def test_a_pep_503_html_index_is_read_too(index, cache):
    """An index that serves HTML pages only (a static mirror): the same choice, and the same hash check."""
    index.content_type = "text/html"
    body = sdist_bytes("vllm", "0.33.0")
    index.add("vllm", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", b"not this one")
    index.add("vllm", "vllm-0.33.0.tar.gz", body)
    index.add("vllm", "vllm-0.34.0.tar.gz", b"x", yanked=True)
    assert discover_releases() == [Version("0.33.0")]
    source = open_source("vllm==0.33.0", cache=cache, progress=False)
    assert source.description == f"vllm 0.33.0 sdist (index, sha256 {sha256(body)[:12]})"
    assert index.file_requests() == ["/files/vllm-0.33.0.tar.gz"]
    index.add("vllm", "vllm-0.32.0.tar.gz", sdist_bytes("vllm", "0.32.0"), listed_sha256="0" * 64)
    with pytest.raises(HashMismatch, match=r"does not match the index: sha256 expected 0{64}, got [0-9a-f]{64}"):
        open_source("vllm==0.32.0", cache=cache, progress=False)
    assert cache_entries(cache) == ["vllm-0.33.0.json", "vllm-0.33.0.tar.gz"]


def test_pkg_info_contradicting_the_requested_version_is_an_error(index, cache):
    index.add("vllm", "vllm-0.33.0.tar.gz", sdist_bytes("vllm", "0.33.0", stated_version="0.32.0"))
    with pytest.raises(MetadataDisagrees) as info:
        open_source("vllm==0.33.0", cache=cache, progress=False)
    assert (info.value.file, info.value.field, info.value.stated, info.value.expected) == (
        "PKG-INFO", "version", "0.32.0", "0.33.0")


def test_release_without_sdist_uses_the_most_portable_wheel(index, cache):
    files = {"__init__.py": b"", "jit/core.py": b"JIT\n"}
    index.add(
        "flashinfer-python", "flashinfer_python-0.7.2.post1-cp39-abi3-manylinux_2_28_aarch64.whl", b"not this one"
    )
    index.add(
        "flashinfer-python",
        "flashinfer_python-0.7.2.post1-py3-none-any.whl",
        wheel_bytes("flashinfer-python", "0.7.2.post1", files, package="flashinfer"),
    )
    source = open_source("flashinfer-python==0.7.2.post1", cache=cache, progress=False)
    assert isinstance(source, WheelSource)
    assert source.versions() == {"flashinfer": "0.7.2.post1"}
    assert source.read("flashinfer", "jit/core.py") == b"JIT\n"
    assert index.file_requests() == ["/files/flashinfer_python-0.7.2.post1-py3-none-any.whl"]


def test_discover_releases_skips_yanked_and_pre_releases(index):
    for version, yanked in [("0.31.0", False), ("0.32.0", True), ("0.33.0", False), ("0.34.0rc1", False)]:
        index.add("vllm", f"vllm-{version}.tar.gz", b"x", yanked=yanked)
    index.add("vllm", "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", b"x", yanked=True)
    index.add("vllm", "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl", b"x")  # a wheel-only release counts
    assert discover_releases() == [Version("0.30.0"), Version("0.31.0"), Version("0.33.0")]
    assert discover_releases("vllm", SpecifierSet(">=0.31")) == [Version("0.31.0"), Version("0.33.0")]
    assert discover_releases("vllm", SpecifierSet(">=0.33"), prereleases=True) == [
        Version("0.33.0"),
        Version("0.34.0rc1"),
    ]


# --- spec parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "fields"),
    [
        ("", InvalidSourceSpec, {"problem": "empty"}),
        ("vllm>=0.33", InvalidSourceSpec, {"spec": "vllm>=0.33", "problem": "range"}),
        ("flashinfer==0.7.2", UnknownPackage, {"name": "flashinfer", "what": "distribution",
                                               "known": ("vllm", "flashinfer-python")}),
        ("vllm==latest", InvalidSourceSpec, {"problem": "not-a-version", "detail": "latest"}),
        ("./no/such/dir", InvalidSourceSpec, {"problem": "no-such-directory"}),
        ("whatever", InvalidSourceSpec, {"spec": "whatever", "problem": "unknown"}),
        ("git:/some/repo", InvalidSourceSpec, {"problem": "git-form"}),
        ("missing.whl", NoSuchSource, {"kind": "wheel", "path": Path("missing.whl"), "problem": "does not exist"}),
    ],
)
def test_bad_specs_are_refused_with_a_hint(spec, kind, fields, cache):
    with pytest.raises(kind) as info:
        open_source(spec, cache=cache)
    assert {name: getattr(info.value, name) for name in fields} == fields


def test_a_bad_spec_message_names_the_forms_a_source_takes(cache):
    with pytest.raises(InvalidSourceSpec, match=r"unknown source 'whatever': give a version \(0.33.0, meaning vllm\)"):
        open_source("whatever", cache=cache)


def test_a_directory_named_like_a_version_is_ambiguous(tmp_path, monkeypatch, cache):
    write_tree(tmp_path / "0.33.0" / "vllm", VLLM_FILES)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidSourceSpec) as info:
        open_source("0.33.0", cache=cache)
    assert (info.value.spec, info.value.problem) == ("0.33.0", "ambiguous")
    assert isinstance(open_source("./0.33.0"), DirectorySource)


# --- git ------------------------------------------------------------------------------------------


def test_git_reads_blobs_at_a_tag_without_checking_it_out(vllm_repo):
    (Path(vllm_repo.working_tree_dir) / "vllm" / "config" / "model.py").write_text("uncommitted\n")
    source = open_source(f"git:{vllm_repo.working_tree_dir}@v0.33.0")
    assert isinstance(source, GitSource)
    assert source.versions() == {"vllm": "0.33.0"}
    assert source.read("vllm", "config/model.py") == VLLM_FILES["config/model.py"]
    assert source.read("vllm", "absent.py") is None
    assert source.read("flashinfer", "__init__.py") is None
    assert source.description.startswith(f"vllm 0.33.0 git {vllm_repo.working_tree_dir}@v0.33.0 (commit ")
    with pytest.raises(NotARegularMember) as info:
        source.read("vllm", "config")
    assert (info.value.member, info.value.found) == ("vllm/config", "a directory")


def test_git_version_from_describe_from_version_py_else_the_sha(vllm_repo, tmp_path):
    head = vllm_repo.head.commit.hexsha
    assert GitSource(vllm_repo.working_tree_dir, "main").versions() == {"vllm": f"0.33.0+2.g{head[:7]}"}
    assert GitSource(vllm_repo.working_tree_dir, head).read("vllm", "config/model.py").endswith(b"8192\n")
    commit(vllm_repo, {"vllm/_version.py": b"__version__ = version = '0.33.1.dev3+gabc'\n"})
    assert GitSource(vllm_repo.working_tree_dir, "main").versions() == {"vllm": "0.33.1.dev3+gabc"}
    untagged = git.Repo.init(tmp_path / "untagged")
    sha = commit(untagged, {"flashinfer/__init__.py": b""}).hexsha
    assert GitSource(str(tmp_path / "untagged"), "HEAD").versions() == {"flashinfer": sha[:12]}


def test_git_refuses_unknown_refs_non_repositories_and_symlinks(vllm_repo, tmp_path):
    from patchkit.sources.git import IncompleteGitSource

    with pytest.raises(IncompleteGitSource) as empty:  # --git PATH --ref "" gives the two apart
        GitSource(vllm_repo.working_tree_dir, "")
    assert (empty.value.location, empty.value.ref) == (vllm_repo.working_tree_dir, "")
    with pytest.raises(UnknownRef, match=r"ref 'v9.9.9' is not a commit in git repository") as unknown:
        open_source(f"git:{vllm_repo.working_tree_dir}@v9.9.9")
    assert (unknown.value.location, unknown.value.ref) == (vllm_repo.working_tree_dir, "v9.9.9")
    with pytest.raises(UnknownRef) as zeros:
        GitSource(vllm_repo.working_tree_dir, "0" * 40)
    assert zeros.value.ref == "0" * 40
    (tmp_path / "plain").mkdir()
    with pytest.raises(NoSuchSource) as plain:
        open_source(f"git:{tmp_path / 'plain'}@main")
    assert (plain.value.path, plain.value.problem) == (tmp_path / "plain", "is not a git repository")
    with pytest.raises(NoSuchSource) as nowhere:
        open_source(f"git:{tmp_path / 'nowhere'}@main")
    assert (nowhere.value.kind, nowhere.value.problem) == ("git repository", "does not exist")
    (Path(vllm_repo.working_tree_dir) / "vllm" / "evil.py").symlink_to("/etc/passwd")
    vllm_repo.index.add(["vllm/evil.py"])
    vllm_repo.index.commit("link", author=ME, committer=ME)
    with pytest.raises(NotARegularMember) as link:
        GitSource(vllm_repo.working_tree_dir, "main").read("vllm", "evil.py")
    assert (link.value.member, link.value.found) == ("vllm/evil.py", "a symlink")


def test_git_url_is_cloned_bare_into_the_cache_and_fetched_again(vllm_repo, cache):
    url = Path(vllm_repo.git_dir).parent.as_uri()
    source = open_source(f"git:{url}@main", cache=cache)
    assert source.read("vllm", "config/model.py").endswith(b"8192\n")
    (clone,) = cache.git.iterdir()
    assert git.Repo(clone).bare
    commit(vllm_repo, {"vllm/config/model.py": b"max_len = 16384\n"})
    assert open_source(f"git:{url}@main", cache=cache).read("vllm", "config/model.py") == b"max_len = 16384\n"
    assert list(cache.git.iterdir()) == [clone]
    with pytest.raises(GitFetchFailed) as info:
        open_source(f"git:{url}-missing@main", cache=cache)
    assert info.value.url == f"{url}-missing" and info.value.detail
    assert list(cache.git.iterdir()) == [clone]  # a failed clone leaves nothing


# --- combined -------------------------------------------------------------------------------------


def test_combined_sources_route_by_package_and_refuse_a_package_twice(tmp_path, vllm_repo):
    wheel = tmp_path / "flashinfer_python-0.7.2-py3-none-any.whl"
    wheel.write_bytes(
        wheel_bytes("flashinfer-python", "0.7.2", {"__init__.py": b"", "a.py": b"A\n"}, package="flashinfer")
    )
    vllm = open_source(f"git:{vllm_repo.working_tree_dir}@v0.33.0")
    both = combine_sources([vllm, open_source(str(wheel))])
    assert both.versions() == {"vllm": "0.33.0", "flashinfer": "0.7.2"}
    assert both.read("flashinfer", "a.py") == b"A\n"
    assert both.read_many("vllm", ["config/model.py"]) == {"config/model.py": VLLM_FILES["config/model.py"]}
    assert " + " in both.description
    assert combine_sources([vllm]) is vllm
    with pytest.raises(PackageInTwoSources) as twice:
        combine_sources([vllm, open_source(f"git:{vllm_repo.working_tree_dir}@main")])
    assert twice.value.package == "vllm" and twice.value.sources[0] == vllm.description
    with pytest.raises(PatchkitError, match=r"no source"):
        combine_sources([])


# --- the real index -------------------------------------------------------------------------------


@pytest.mark.network
def test_real_vllm_sdist_from_the_index(monkeypatch):
    monkeypatch.delenv("PATCHKIT_INDEX_URL", raising=False)
    source = open_source("vllm==0.33.0", progress=False)  # the user cache: downloaded once, then reused
    assert source.versions() == {"vllm": "0.33.0"}
    assert source.description.startswith("vllm 0.33.0 sdist (index, sha256 ")
    files = source.read_many("vllm", ["_version.py", "config/__init__.py", "envs.py", "no/such/file.py"])
    assert b"0.33.0" in files["_version.py"]
    assert files["config/__init__.py"] and files["envs.py"]
    assert files["no/such/file.py"] is None


def test_pinned_flashinfer_is_read_from_a_checkout_and_a_git_ref(tmp_path):
    from patchkit.sources import DirectorySource, GitSource
    from patchkit.sources.pins import pinned_flashinfer

    root = tmp_path / "checkout"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "requirements").mkdir()
    (root / "requirements" / "cuda.txt").write_text("torch==2.14.0\nflashinfer-python==0.7.2.post1  # pinned\n")
    assert pinned_flashinfer(DirectorySource(root)) == "0.7.2.post1"
    repo = git.Repo.init(root)
    repo.index.add(["vllm/__init__.py", "requirements/cuda.txt"])
    repo.index.commit("release")
    repo.create_tag("v0.33.0")
    assert pinned_flashinfer(GitSource(str(root), "v0.33.0")) == "0.7.2.post1"
    (root / "requirements" / "cuda.txt").unlink()
    assert pinned_flashinfer(DirectorySource(root)) is None


@pytest.mark.parametrize("url", ["https://example.invalid/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                                 "https://example.invalid/repo"])
def test_a_url_is_refused_as_typed_not_as_a_folded_path(url):
    with pytest.raises(InvalidSourceSpec) as info:
        open_source(url)
    assert (info.value.spec, info.value.problem) == (url, "url") and "git:URL@REF" in str(info.value)
