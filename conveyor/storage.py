"""Local paths and URLs (``s3://``, ``gs://``, ``memory://``, ...) behind one small interface.

Readers and writers take either. A plain path (or a ``file://`` URL) stays a ``pathlib.Path``
and goes straight to ``os``, as before: fsspec is not even imported on the local path. Any
other URL becomes an ``ObjectPath`` and goes through fsspec, so the store's package (s3fs for
``s3://``: ``pip install 'conveyor[s3]'``) and fsspec's usual configuration decide the
endpoint and the credentials (environment variables, config files, instance roles): Conveyor
adds no option of its own for either (docs/storage.md).

Writes keep the rule every writer here follows: nothing appears under its final name until it
is complete (``atomic_write``). Locally that is a temporary file and a rename. On an object
store it is a local temporary file uploaded in one request: S3, GCS and Azure publish an object
only when its upload completes, which is the store's own commit. Other fsspec filesystems get a
hidden temporary name and a move. A crash leaves at most a hidden temporary (a name starting
with ``.``), which every listing here skips.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

if TYPE_CHECKING:
    import pyarrow as pa
    from fsspec import AbstractFileSystem

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_SCHEMES = ("file", "local")
#: stores without directories: nothing to create before writing a key
_FLAT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
#: stores that publish an object only once its upload is complete (``atomic_write``)
_WHOLE_UPLOADS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
#: packages (and the extra that installs them) for the stores people use most
_PACKAGES = {
    "s3": "s3fs (pip install 'conveyor[s3]')",
    "s3a": "s3fs (pip install 'conveyor[s3]')",
    "gs": "gcsfs (pip install gcsfs)",
    "gcs": "gcsfs (pip install gcsfs)",
    "az": "adlfs (pip install adlfs)",
    "abfs": "adlfs (pip install adlfs)",
    "abfss": "adlfs (pip install adlfs)",
}
_CREDENTIAL_ERRORS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
)
#: botocore's errors for a store it cannot reach (not ``OSError`` either)
_CONNECTION_ERRORS = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ProxyConnectionError",
    }
)
#: read-ahead for streamed inputs: large enough for sequential decoding, small enough that a
#: seek (a video's index at its end, a shot window) does not fetch tens of MB it never reads
READ_BLOCK = 8 << 20


def is_url(path: str | os.PathLike[str] | ObjectPath) -> bool:
    """Whether ``path`` names an object in a store (a URL other than ``file://``)."""
    if isinstance(path, ObjectPath):
        return True
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return match is not None and match.group(1).lower() not in _LOCAL_SCHEMES


def location(path: str | os.PathLike[str] | ObjectPath) -> Path | ObjectPath:
    """``path`` as a ``Path`` (local, ``file://`` included) or an ``ObjectPath`` (a URL)."""
    if isinstance(path, (Path, ObjectPath)):
        return path
    if isinstance(path, str):
        match = _URL.match(path)
        if match is not None:
            if match.group(1).lower() in _LOCAL_SCHEMES:
                return Path(path[match.end() :] or "/")
            return ObjectPath(path)
    return Path(path)


def printable(name: str) -> str:
    """``name`` as text every record can hold: a file name that is not valid UTF-8 (Latin-1
    bytes from an old camera or share) reaches Python with its odd bytes as surrogates,
    which JSON, a terminal or a UUID refuse; they are written ``\\xNN`` instead, the same
    in every run. A valid name comes back unchanged."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name


def printable_tree(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value


#: what a local path named like a video or an image can be instead of a file
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def special_file(path: str) -> str | None:
    """What a local ``path`` is if it is not a plain file (None for one, or a URL): reading
    a named pipe or a device blocks or never ends, and their size says nothing (a pipe
    reads as 0 bytes)."""
    where = location(path)
    if isinstance(where, ObjectPath):
        return None
    try:
        mode = where.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a loop of symbolic links (to {printable(os.readlink(where))})"
        if where.is_symlink():  # the link is listed, its target is gone
            return f"a broken symbolic link (to {printable(os.readlink(where))}, which is missing)"
        return None  # the size's error below names the reason
    return next((name for test, name in _SPECIAL_FILES if test(mode)), None)


def nearest_existing(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute, or the nearest of its folders that exists: what decides
    whether an output that is not there yet can be made a folder."""
    place = Path(path).expanduser().absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    return place


def check_output_place(output: str | os.PathLike[str]) -> None:
    """``ValueError`` unless a local output, or the nearest of its folders that exists, is a
    folder (a URL passes: a store has no files in the way of folders)."""
    if is_url(output):
        return
    try:
        target, place = Path(output).expanduser().absolute(), nearest_existing(output)
    except PermissionError as exc:  # a folder on the way the user may not enter
        raise ValueError(f"output {output}: {exc.strerror} (at {exc.filename})") from None
    if not place.is_dir():
        where = "" if place == target else f" inside {place}, which"
        raise ValueError(f"output {output}{where} is a file, not a folder")


def normalize(path: str | os.PathLike[str]) -> str:
    """The canonical spelling of a path or URL (``out/`` -> ``out``, ``s3://b/x/`` ->
    ``s3://b/x``), so that one place has one name in records and comparisons."""
    return str(location(path))


@dataclass(frozen=True)
class FileEntry:
    """A file found under a root: its path relative to the root, where it is, its stamp."""

    relative: str
    path: ObjectPath
    size: int
    mtime: float


class ObjectPath:
    """A URL with the few pathlib operations the readers and writers use, through fsspec.

    It keeps the URL as given (less trailing slashes), so records name outputs the way the
    user wrote them. Every query asks the store again (fsspec's listings cache is dropped for
    the path first): other worker processes write into the same prefixes, and a cached
    listing would hide their files.
    """

    __slots__ = ("url",)

    def __init__(self, url: str) -> None:
        match = _URL.match(url)
        if match is None:
            raise ValueError(f"not a URL: {url!r} (expected scheme://...)")
        rest = url[match.end() :].rstrip("/")
        self.url = f"{match.group(1)}://{rest}"

    # -- naming ---------------------------------------------------------------------------
    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    @property
    def name(self) -> str:
        return self.url.split("://", 1)[1].rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        name = self.name
        dot = name.rfind(".")
        return name[dot:] if 0 < dot < len(name) - 1 else ""

    @property
    def parent(self) -> ObjectPath:
        head, sep, _ = self.url.split("://", 1)[1].rpartition("/")
        return ObjectPath(f"{self.protocol}://{head}") if sep else self

    def __truediv__(self, other: str | os.PathLike[str]) -> ObjectPath:
        part = os.fspath(other).strip("/")
        return ObjectPath(f"{self.url}/{part}") if part else self

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __lt__(self, other: ObjectPath) -> bool:
        return self.url < other.url

    def __hash__(self) -> int:
        return hash(self.url)

    def _child(self, key: str, base_key: str) -> ObjectPath:
        """The URL of ``key`` (a filesystem path under ``base_key``, this path's own)."""
        return self / key[len(base_key) :] if key.startswith(base_key) else self

    # -- the filesystem -------------------------------------------------------------------
    def filesystem(self) -> tuple[AbstractFileSystem, str]:
        """fsspec's filesystem for this URL and the path it uses, its listings cache of that
        path dropped (fsspec keeps one instance per protocol and options)."""
        fs, key = filesystem(self.url)
        fs.invalidate_cache(key)
        return fs, key

    def info(self) -> dict[str, Any]:
        fs, key = self.filesystem()
        with explained(self.url):
            return fs.info(key)

    def exists(self) -> bool:
        try:
            self.info()
        except FileNotFoundError:
            return False
        return True

    def is_dir(self) -> bool:
        try:
            return self.info()["type"] == "directory"
        except FileNotFoundError:
            return False

    def is_file(self) -> bool:
        try:
            return self.info()["type"] != "directory"
        except FileNotFoundError:
            return False

    def open(self, mode: str = "rb", **kwargs: Any) -> Any:
        """fsspec's file object (binary modes; ``block_size`` sets the read-ahead)."""
        fs, key = self.filesystem()
        with explained(self.url):
            return fs.open(key, mode, **kwargs)

    def read_bytes(self) -> bytes:
        fs, key = self.filesystem()
        with explained(self.url):
            return fs.cat_file(key)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def unlink(self, missing_ok: bool = False) -> None:
        """Delete the object. Some stores (S3) accept deleting an absent key, so without
        ``missing_ok`` it is looked up first, as ``Path.unlink`` would fail."""
        if not missing_ok:
            self.info()  # FileNotFoundError naming the URL
        fs, key = self.filesystem()
        try:
            with explained(self.url):
                fs.rm_file(key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Create the directory where the store has directories (object stores have none:
        a key's prefix exists once a key is written under it)."""
        if self.protocol.lower() in _FLAT:
            return
        fs, key = self.filesystem()
        with explained(self.url):
            if parents:
                fs.makedirs(key, exist_ok=exist_ok)
            else:
                fs.mkdir(key, create_parents=False)

    def iterdir(self) -> list[ObjectPath]:
        """The entries directly under this prefix (none when there is nothing)."""
        fs, key = self.filesystem()
        try:
            with explained(self.url):
                names = fs.ls(key, detail=False)
        except FileNotFoundError:
            return []
        return sorted(self._child(n, key) for n in names if n.rstrip("/") != key)

    def glob(self, pattern: str) -> list[ObjectPath]:
        """Entries directly under this prefix whose name matches ``pattern`` (sorted): one
        listing, matched here (fsspec's own glob asks the store more than once)."""
        return [p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)]

    def find(self) -> list[FileEntry]:
        """Every file under this prefix, at any depth, sorted by relative path."""
        fs, key = self.filesystem()
        try:
            with explained(self.url):
                found = fs.find(key, detail=True)
        except FileNotFoundError:
            return []
        entries = []
        for name, info in found.items():
            if info.get("type") == "directory" or not name.startswith(key + "/"):
                continue
            relative = name[len(key) + 1 :]
            entries.append(FileEntry(relative, self / relative, int(info["size"]), mtime(info)))
        return sorted(entries, key=lambda e: e.relative)

    def iter_find(self, page: int | None = None) -> Iterator[FileEntry]:
        """``find`` as a stream: on S3, one listing page (``page`` keys, 1,000 by default)
        at a time, so that a caller works on the first files while a prefix of millions is
        still being listed (S3 lists keys in UTF-8 byte order, which is the order of their
        text); other stores list everything first."""
        fs, key = self.filesystem()
        if self.protocol not in ("s3", "s3a") or not callable(getattr(fs, "call_s3", None)):
            yield from self.find()
            return
        bucket, _, prefix = key.partition("/")
        start = f"{prefix}/" if prefix else ""
        request = {"Bucket": bucket, "Prefix": start, **getattr(fs, "req_kw", {})}
        if page is not None:
            request["MaxKeys"] = page
        while True:
            try:
                with explained(self.url):
                    page = fs.call_s3("list_objects_v2", **request)
            except FileNotFoundError:
                return  # as find: nothing there
            for item in page.get("Contents", ()):
                name = item["Key"]
                if name.endswith("/"):  # a folder's marker object
                    continue
                relative = name[len(start) :]
                yield FileEntry(relative, self / relative, int(item["Size"]), mtime(item))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            request["ContinuationToken"] = token

    def remove_tree(self) -> None:
        """Delete every object under this prefix (nothing there is fine)."""
        fs, key = self.filesystem()
        with contextlib.suppress(FileNotFoundError), explained(self.url):
            fs.rm(key, recursive=True)


#: a local path or a URL, as ``location`` makes them
StoragePath = Path | ObjectPath


# -- module-level helpers that take either kind -------------------------------------------
def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """fsspec's filesystem for ``url`` and its path; a clear error when the store's package
    is not installed or the protocol is unknown."""
    try:
        from fsspec.core import url_to_fs
    except ImportError as exc:  # fsspec is a dependency; a broken install says so
        raise ImportError(f"{url}: reading URLs needs fsspec ({exc})") from None
    protocol = url.split("://", 1)[0].lower()
    try:
        return url_to_fs(url)
    except ImportError as exc:
        package = _PACKAGES.get(protocol, "its fsspec implementation")
        raise ImportError(f"{url}: {protocol}:// needs {package}: {exc}") from None
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise ValueError(
                f"{url}: fsspec knows no {protocol}:// protocol (a typo, or a filesystem "
                "package that is not installed?)"
            ) from None
        raise


@contextlib.contextmanager
def explained(url: str) -> Iterator[None]:
    """Re-raise a store's errors with the URL in the message and a hint at the cause:
    a missing bucket or key stays ``FileNotFoundError``, missing credentials and refusals
    become ``PermissionError`` (botocore's credential errors are not even ``OSError``), and
    a store that cannot be reached ``ConnectionError`` (nor are its connection errors)."""
    try:
        yield
    except FileNotFoundError as exc:
        detail = str(exc)
        if "bucket" in detail.lower():
            raise FileNotFoundError(f"{url!r}: {detail}") from None
        raise FileNotFoundError(f"{url!r} does not exist") from None
    except PermissionError as exc:
        raise PermissionError(f"{url!r}: access denied ({exc})") from None
    except OSError as exc:
        if type(exc) is not OSError:  # ConnectionError, TimeoutError, ...: their own words
            raise
        raise OSError(exc.errno, f"{url!r}: {exc.strerror or exc}") from None
    except Exception as exc:
        if type(exc).__name__ in _CREDENTIAL_ERRORS:
            protocol = url.split("://", 1)[0]
            raise PermissionError(
                f"{url!r}: no credentials found for {protocol}:// ({exc}); configure them "
                "the way the store's fsspec package reads them (see docs/storage.md)"
            ) from None
        if type(exc).__name__ in _CONNECTION_ERRORS:
            raise ConnectionError(f"{url!r}: the store cannot be reached ({exc})") from None
        raise


def mtime(info: dict[str, Any]) -> float:
    """A file's modification time (seconds) from an fsspec info record, whichever key its
    filesystem uses (0.0 when it gives none)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def has_magic(path: str) -> bool:
    """Whether ``path`` is a glob (holds ``*``, ``?`` or ``[``)."""
    return any(ch in path for ch in "*?[")


def glob_files(pattern: str) -> list[tuple[str, int]]:
    """The files a glob matches, with their sizes, sorted: a local pattern as ``glob``
    expands it (``**`` at any depth), a URL's against one listing of the prefix before its
    first wildcard (hidden files and folders left out, as every listing here does)."""
    where = location(pattern)
    if isinstance(where, Path):
        import glob

        found = sorted(p for p in glob.glob(str(where), recursive=True) if os.path.isfile(p))
        return [(p, os.path.getsize(p)) for p in found]
    text = str(where)
    head = text
    for i, ch in enumerate(text):
        if ch in "*?[":
            head = text[: text.rfind("/", 0, i)]
            break
    rest = text[len(head) + 1 :]
    return [
        (str(e.path), e.size)
        for e in ObjectPath(head).find()
        if fnmatch.fnmatchcase(e.relative, rest)
        and not any(part.startswith(".") for part in e.relative.split("/"))
    ]


def arrow_file(path: str | os.PathLike[str], mode: str = "rb") -> pa.NativeFile:
    """pyarrow's file at the local ``path``, named to it in bytes: pyarrow refuses a ``str``
    path that is not UTF-8 (an output named in Latin-1 bytes reaches Python with
    surrogates), and its spills and tables failed there."""
    import pyarrow as pa

    return pa.OSFile(os.fsencode(path), mode)


def open_input(path: str | os.PathLike[str] | ObjectPath) -> IO[bytes]:
    """A binary file to read: ``open`` for a local path, a buffered stream for a URL (one
    request per ``READ_BLOCK``, lines read at C speed)."""
    where = location(path)
    if isinstance(where, Path):
        return open(where, "rb")  # closed by the caller's with
    import io

    return io.BufferedReader(where.open("rb", block_size=READ_BLOCK), buffer_size=1 << 20)


def size(path: str | os.PathLike[str] | ObjectPath) -> int:
    """Bytes of a file (``OSError`` naming it when it cannot be read)."""
    where = location(path)
    if isinstance(where, Path):
        return os.path.getsize(where)
    return int(where.info()["size"])


def exists(path: str | os.PathLike[str] | ObjectPath) -> bool:
    return location(path).exists()


def remove_tree(path: str | os.PathLike[str] | ObjectPath) -> None:
    """Delete a directory (or prefix) and everything under it; absent is fine."""
    where = location(path)
    if isinstance(where, Path):
        shutil.rmtree(where, ignore_errors=True)
    else:
        where.remove_tree()


def _create_temporary(folder: Path, prefix: str) -> tuple[int, str]:
    """A new file under a random name in ``folder``, opened for writing with the permissions
    any new file gets (0666 less the umask, which the kernel applies; ``mkstemp`` gives 0600).
    The folder is made when missing, not asked about first: a writer of many small files
    finds it there nearly every time."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(100):
        temp = os.path.join(folder, f"{prefix}{uuid.uuid4().hex[:16]}.tmp")
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:
            continue
        except FileNotFoundError:
            if attempt:
                raise
            folder.mkdir(parents=True, exist_ok=True)
    raise FileExistsError(f"no free temporary name in {folder}")


@contextlib.contextmanager
def atomic_write(
    final: str | os.PathLike[str] | ObjectPath,
    tmp_dir: str | os.PathLike[str] | ObjectPath | None = None,
) -> Iterator[BinaryIO]:
    """A binary file to write that becomes ``final`` only if the block ends without error.

    - a local path: written under a hidden temporary name in ``tmp_dir`` (default: ``final``'s
      folder) and renamed;
    - an object store (S3, GCS, Azure): written to a local temporary file, then uploaded in
      one request (a multipart upload for a large file). The store publishes an object only
      when its upload completes, so that upload is the commit: a failure or a crash before it
      leaves no object at all, and there is no temporary key to copy and delete (one request
      per file instead of four);
    - any other fsspec filesystem: written under a hidden temporary name in ``tmp_dir`` (some,
      like the memory store, show a file while it is written), then moved to ``final``.

    On an error every temporary is removed and ``final`` is untouched.
    """
    target = location(final)
    folder = location(tmp_dir) if tmp_dir is not None else target.parent
    prefix = f".{target.name[:40]}."
    if isinstance(target, Path):
        assert isinstance(folder, Path), "a local file's temporary must be local too"
        fd, temp = _create_temporary(folder, prefix)
        try:
            with os.fdopen(fd, "wb") as out:
                yield out
            try:
                os.replace(temp, target)
            except FileNotFoundError:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temp, target)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
                # a full disk said only "No space left on device", not which file
                raise OSError(exc.errno, exc.strerror, str(target)) from exc
            raise
        return
    fs, final_key = target.filesystem()
    if target.protocol.lower() in _WHOLE_UPLOADS:
        with tempfile.NamedTemporaryFile(prefix="conveyor-upload-", suffix=".tmp") as local:
            yield cast(BinaryIO, local)
            local.flush()
            with explained(str(target)):
                fs.put_file(local.name, final_key)
        return
    assert isinstance(folder, ObjectPath), "a URL's temporary must be in the same store"
    folder.mkdir(parents=True, exist_ok=True)  # (nothing to do on a store without folders)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp_path = folder / f"{prefix}{uuid.uuid4().hex[:16]}.tmp"
    _, temp_key = temp_path.filesystem()
    with explained(str(temp_path)):
        out = fs.open(temp_key, "wb")
    try:
        try:
            yield out
        except BaseException:
            with contextlib.suppress(Exception):
                out.close()  # may show what was written: removed just below
            raise
        with explained(str(temp_path)):
            out.close()
        with explained(str(target)):
            fs.mv(temp_key, final_key)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm_file(temp_key)
        raise
