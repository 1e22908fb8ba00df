"""conveyor.storage: paths and URLs told apart, ObjectPath's pathlib subset, the atomic write
rule on local disks, fsspec's memory store and a real S3 server, and errors that say what is
wrong with which URL."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest

from conveyor import storage
from conveyor.stages.io import list_files
from conveyor.storage import ObjectPath, atomic_write, is_url, location, normalize


@pytest.fixture
def memory() -> Iterator[ObjectPath]:
    """A fresh prefix in fsspec's in-process memory store, removed afterwards."""
    root = ObjectPath(f"memory://test-{uuid.uuid4().hex[:12]}")
    yield root
    root.remove_tree()


def keys(root: ObjectPath) -> list[str]:
    return [e.relative for e in root.find()]


# -- naming -------------------------------------------------------------------------------
def test_paths_and_urls_are_told_apart(tmp_path: Path) -> None:
    assert is_url("s3://bucket/key") and is_url("memory://x") and is_url(ObjectPath("gs://b"))
    assert not is_url("out/") and not is_url(tmp_path) and not is_url("file:///tmp/x")
    assert location("file:///tmp/x") == Path("/tmp/x")  # file:// stays on the local path
    assert location(tmp_path) is tmp_path
    assert location("s3://b/in/") == ObjectPath("s3://b/in")
    assert normalize("out/") == "out" and normalize("s3://b/out/") == "s3://b/out"


def test_object_path_naming() -> None:
    path = ObjectPath("s3://bucket/videos/a.mp4")
    assert (path.name, path.suffix, path.protocol) == ("a.mp4", ".mp4", "s3")
    assert path.parent == ObjectPath("s3://bucket/videos")
    assert ObjectPath("s3://bucket").parent == ObjectPath("s3://bucket")
    assert ObjectPath("s3://bucket") / "clips" / "c.mp4" == ObjectPath("s3://bucket/clips/c.mp4")
    assert str(ObjectPath("s3://bucket/") / "x/") == "s3://bucket/x"
    assert sorted([ObjectPath("s3://b/z"), ObjectPath("s3://b/a")])[0].name == "a"
    assert len({ObjectPath("s3://b/a"), ObjectPath("s3://b/a/")}) == 1
    with pytest.raises(ValueError, match="not a URL"):
        ObjectPath("relative/path")


def test_modification_times_from_every_kind_of_listing() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert storage.mtime({"mtime": 12.5}) == 12.5  # local
    assert storage.mtime({"LastModified": when}) == when.timestamp()  # S3
    assert storage.mtime({"updated": "2025-01-02T03:04:05Z"}) == when.timestamp()  # GCS
    assert storage.mtime({"created": 7.0}) == 7.0  # memory
    assert storage.mtime({}) == 0.0


# -- the atomic write rule ----------------------------------------------------------------
def test_local_atomic_write_renames_and_a_failure_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "deep" / "out.bin"
    with atomic_write(final) as out:
        out.write(b"abc")
        assert not final.exists()
        assert [p.name.startswith(".out.bin.") for p in final.parent.iterdir()] == [True]
    assert final.read_bytes() == b"abc"
    with pytest.raises(RuntimeError, match="boom"), atomic_write(final) as out:
        out.write(b"half")
        raise RuntimeError("boom")
    assert final.read_bytes() == b"abc"  # the old file, untouched
    assert [p.name for p in final.parent.iterdir()] == ["out.bin"]


def test_a_failed_local_write_names_its_file(tmp_path: Path) -> None:
    """A full disk said only "[Errno 28] No space left on device", not which file."""
    final = tmp_path / "summary.json"
    with pytest.raises(OSError) as raised, atomic_write(final) as out:
        out.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(final)
    assert str(raised.value) == f"[Errno 28] No space left on device: '{final}'"
    assert list(tmp_path.iterdir()) == []


def test_a_local_write_makes_the_folders_it_lacks(tmp_path: Path) -> None:
    """Folders are made when a write finds them missing (not asked about before each
    write): the temporary's, the final file's, and again after someone removed one."""
    tmp, final = tmp_path / "work" / "tmp", tmp_path / "out" / "a" / "b.json"
    for _ in range(2):
        with atomic_write(final, tmp) as out:
            out.write(b"{}")
        assert final.read_bytes() == b"{}" and list(tmp.iterdir()) == []
        shutil.rmtree(tmp_path / "out")
        shutil.rmtree(tmp)
    (tmp_path / "blocked").write_bytes(b"a file where a folder should be")
    with pytest.raises(OSError), atomic_write(tmp_path / "blocked" / "x.json", tmp) as out:
        out.write(b"{}")
    assert list(tmp.iterdir()) == []  # the temporary is gone too


def test_a_local_file_gets_the_permissions_of_any_new_file(tmp_path: Path) -> None:
    """The file ``atomic_write`` makes is readable as the umask says (with ``mkstemp``'s
    owner-only temporary, clips, metas and shards were 0600)."""
    old = os.umask(0o027)
    try:
        with storage.atomic_write(tmp_path / "clip.mp4") as out:
            out.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "clip.mp4").st_mode) == 0o640


def test_store_atomic_write_publishes_only_a_complete_object(memory: ObjectPath) -> None:
    final = memory / "out" / "x.json"
    with atomic_write(final) as out:
        out.write(b"{")
        # the memory store shows a file while it is written: only the temporary does
        assert not final.exists()
        out.write(b"}")
    assert final.read_bytes() == b"{}"
    with pytest.raises(RuntimeError, match="boom"), atomic_write(final) as out:
        out.write(b"[half")
        raise RuntimeError("boom")
    assert final.read_bytes() == b"{}"
    assert keys(memory) == ["out/x.json"]  # no temporary left


def test_store_atomic_write_into_a_temporary_folder(memory: ObjectPath) -> None:
    with atomic_write(memory / "a.txt", memory / ".tmp") as out:
        out.write(b"a")
    assert keys(memory) == ["a.txt"]


# -- ObjectPath on the memory store -------------------------------------------------------
def test_object_path_operations(memory: ObjectPath) -> None:
    fs, key = memory.filesystem()
    fs.pipe_file(f"{key}/a/x.json", b'{"k": 1}')
    fs.pipe_file(f"{key}/a/y.txt", b"y")
    fs.pipe_file(f"{key}/a/deeper/z.json", b"z")
    a = memory / "a"
    assert a.exists() and a.is_dir() and not a.is_file()
    assert (a / "x.json").is_file() and (a / "x.json").read_text() == '{"k": 1}'
    assert not (memory / "missing").exists()
    assert a.glob("*.json") == [a / "x.json"]
    assert a.iterdir() == [a / "deeper", a / "x.json", a / "y.txt"]
    assert [(e.relative, e.size) for e in a.find()] == [
        ("deeper/z.json", 1),
        ("x.json", 8),
        ("y.txt", 1),
    ]
    assert storage.size(a / "y.txt") == 1
    with storage.open_input(str(a / "x.json")) as stream:
        assert stream.read() == b'{"k": 1}'
    (a / "y.txt").unlink()
    (a / "y.txt").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match=r"'memory://.*/a/y.txt' does not exist"):
        (a / "y.txt").unlink()
    storage.remove_tree(a / "deeper")
    assert keys(memory) == ["a/x.json"]
    assert (memory / "nothing").iterdir() == [] and (memory / "nothing").find() == []


def test_unknown_protocols_and_missing_packages_are_named() -> None:
    with pytest.raises(ValueError, match=r"nosuch://b/x: fsspec knows no nosuch:// protocol"):
        ObjectPath("nosuch://b/x").exists()
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"gs://b/x: gs:// needs gcsfs"):
            ObjectPath("gs://b/x").exists()


# -- a real S3 server ---------------------------------------------------------------------
def test_s3_round_trip_and_listing(bucket: str) -> None:
    root = ObjectPath(bucket) / "data"
    with atomic_write(root / "x.jsonl") as out:
        out.write(b'{"a": 1}\n')
    with atomic_write(root / "sub" / "y.jsonl") as out:
        out.write(b'{"a": 2}\n')
    assert root.is_dir() and (root / "x.jsonl").is_file()
    assert [(e.relative, e.size) for e in root.find()] == [("sub/y.jsonl", 9), ("x.jsonl", 9)]
    assert all(e.mtime > 1.6e9 for e in root.find())  # a real clock time from the listing
    with storage.open_input(f"{root}/x.jsonl") as stream:
        assert stream.readline() == b'{"a": 1}\n'


def test_s3_listing_streams_page_by_page_in_find_order(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = fsspec.filesystem("s3")
    names = ["b.mp4", "a/x.mp4", "a.mp4", "a-b/y.mp4", "é.mp4", "sub/z.mp4"]
    for name in names:
        fs.pipe_file(f"{bucket[5:]}/in/{name}", b"xx")
    fs.call_s3("put_object", Bucket=bucket[5:], Key="in/sub/", Body=b"")  # a folder's marker
    fs.pipe_file(f"{bucket[5:]}/in2/beside.mp4", b"x")  # shares the prefix's text, not its folder
    root = ObjectPath(bucket) / "in"
    calls: list[dict[str, object]] = []
    call_s3 = fs.call_s3

    def counted(method: str, **request: object) -> object:
        calls.append(request)
        return call_s3(method, **request)

    monkeypatch.setattr(fs, "call_s3", counted)
    stream = root.iter_find(page=2)
    first = next(stream)
    assert len(calls) == 1  # the first entry comes with the first page
    rest = list(stream)
    assert [(e.relative, e.size, e.mtime) for e in [first, *rest]] == [
        (e.relative, e.size, e.mtime) for e in root.find() if e.relative != "sub/"
    ]  # find takes the marker for an empty file
    assert [e.relative for e in [first, *rest]] == sorted(names)
    assert len(calls) == 4 and all(c["MaxKeys"] == 2 for c in calls)
    assert list((ObjectPath(bucket) / "missing").iter_find()) == []
    assert list(ObjectPath("s3://no-such-bucket-x/in").iter_find()) == []


def test_s3_a_failed_write_leaves_no_object_and_crash_temporaries_are_ignored(
    bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the upload is staged
    root = ObjectPath(bucket) / "out"
    with pytest.raises(RuntimeError, match="boom"), atomic_write(root / "x.json") as out:
        out.write(b"half")
        assert len(list(tmp_path.iterdir())) == 1  # staged locally, not on the store
        raise RuntimeError("boom")
    fs, _ = root.filesystem()

    def broken_upload(*args: object, **kwargs: object) -> None:
        raise OSError("upload refused")

    with monkeypatch.context() as patch:
        patch.setattr(fs, "put_file", broken_upload)  # fsspec's instance (one per protocol)
        with pytest.raises(OSError, match="upload refused"), atomic_write(root / "x.json") as out:
            out.write(b"{}")
    assert root.find() == [] and list(tmp_path.iterdir()) == []
    # what a killed writer of another kind leaves: a hidden temporary beside finished objects
    fs.pipe_file(f"{bucket[5:]}/out/.x.json.0123abcd.tmp", b"half")
    with atomic_write(root / "y.json") as out:
        out.write(b"{}")
    assert [p.name for p in list_files(root)] == ["y.json"]


def test_s3_errors_name_the_url_and_the_cause(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"'s3://no-such-bucket-x/in'.*bucket"):
        ObjectPath("s3://no-such-bucket-x/in").info()
    with pytest.raises(FileNotFoundError, match=rf"'{bucket}/missing' does not exist"):
        ObjectPath(f"{bucket}/missing").read_bytes()
    assert not ObjectPath(f"{bucket}/missing").exists()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    fsspec.filesystem("s3").clear_instance_cache()
    with pytest.raises(PermissionError, match=rf"'{bucket}/x': no credentials found for s3://"):
        ObjectPath(f"{bucket}/x").info()


def test_a_name_that_is_not_utf8_is_printable_the_same_way_every_time() -> None:
    odd = os.fsdecode(b"videos/caf\xe9 \xff.mp4")  # surrogates, as the OS hands them over
    assert storage.printable(odd) == "videos/caf\\xe9 \\xff.mp4"
    assert storage.printable(odd).encode("utf-8")  # JSON, terminals and UUIDs take it
    assert storage.printable("vidéos/視.mp4") == "vidéos/視.mp4"  # valid names unchanged


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An S3 endpoint nothing listens on (loopback's discard port): connections refused."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries took seconds each
    fsspec.filesystem("s3").clear_instance_cache()
    yield
    fsspec.filesystem("s3").clear_instance_cache()  # no later test gets this endpoint


def test_a_store_that_cannot_be_reached_is_one_line_naming_the_url(unreachable: None) -> None:
    """botocore's connection errors are not OSError: every command printed a 150-line
    traceback (exit 1) where a missing bucket or missing credentials were one line."""
    from typer.testing import CliRunner

    from conveyor.cli import app

    with pytest.raises(ConnectionError, match=r"'s3://b/in': the store cannot be reached"):
        ObjectPath("s3://b/in").info()
    runner = CliRunner()
    for command in (
        ["video", "s3://b/in", "out"],
        ["text", "s3://b/in", "out"],
        ["image", "s3://b/in", "out"],
        ["dedup", "s3://b/e.parquet", "out", "--id-column", "k"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert "the store cannot be reached" in result.output and "s3://b/" in result.output
        assert "Traceback" not in result.output


def test_an_output_under_a_folder_that_may_not_be_entered_is_a_value_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``conveyor dedup`` (and ``simulate --out``) took only a ValueError from this check:
    a PermissionError (a folder of mode 700 not the user's, or one made under umask 0777)
    was a traceback."""
    from conveyor.storage import check_output_place

    locked = tmp_path / "locked"
    real = Path.exists

    def exists(self: Path, *args: object, **kwargs: object) -> bool:
        if str(self).startswith(str(locked)):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "exists", exists)
    with pytest.raises(ValueError, match=r"output .*locked/x: Permission denied \(at "):
        check_output_place(locked / "x")
