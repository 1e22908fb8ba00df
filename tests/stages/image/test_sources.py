"""Listing an input and cutting it into parts; reading a part: files, tar members by byte
range, Parquet rows of bytes or paths; resuming skips the parts whose records match."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.samples.image import encode, render_image, write_folder, write_shards
from conveyor.stages.image import read as read_module
from conveyor.stages.image.layout import ImageLayout
from conveyor.stages.image.read import ImageReader
from conveyor.stages.image.sources import (
    ImageInputError,
    ImageSources,
    Planner,
    list_files,
    scan_tar,
    split_key,
)
from conveyor.tasks.image import ImagePart


def parts(inputs: str | list[str], output: Path, **options: object) -> list[ImagePart]:
    return list(ImageSources(inputs, str(output), **options))  # type: ignore[arg-type]


def read(part: ImagePart) -> list:
    return ImageReader().process(part).data


def test_a_folder_is_listed_recursively_in_order_without_hidden_files_or_the_output(
    tmp_path: Path,
) -> None:
    write_folder(tmp_path / "in", 3, sizes=[(40, 30)])
    write_folder(tmp_path / "in" / "sub", 2, sizes=[(40, 30)])
    (tmp_path / "in" / ".hidden.jpg").write_bytes(b"x")
    (tmp_path / "in" / "notes.txt").write_text("not listed")
    write_folder(tmp_path / "in" / "out" / "shards", 1)  # the output, inside the input
    found = parts(str(tmp_path / "in"), tmp_path / "in" / "out", images_per_task=2)
    keys = [f.relative for p in found for f in p.items]
    assert keys == [
        "img-000000.jpg", "img-000001.jpg", "img-000002.jpg",
        "sub/img-000000.jpg", "sub/img-000001.jpg",
    ]  # fmt: skip
    assert [p.index for p in found] == [0, 1, 2] and [p.count for p in found] == [2, 2, 1]


def test_parts_are_cut_by_bytes_too(tmp_path: Path) -> None:
    paths = write_folder(tmp_path / "in", 4, sizes=[(64, 48)])
    biggest = max(p.stat().st_size for p in paths)
    planner = Planner(images_per_task=100, bytes_per_task=2 * biggest)
    found = list(planner.plan(list_files(str(tmp_path / "in"))))
    assert [p.count for p in found] == [2, 2]


def test_limit_counts_images_across_kinds(tmp_path: Path) -> None:
    write_folder(tmp_path / "in", 3, sizes=[(40, 30)])
    write_shards(tmp_path / "in" / "shards", 6, 3, sizes=[(40, 30)])
    found = parts(str(tmp_path / "in"), tmp_path / "out", images_per_task=2, limit=5)
    assert sum(p.count for p in found) == 5
    assert [p.kind for p in found] == ["files", "files", "tar"]


def test_a_glob_and_a_missing_input_and_a_glob_matching_nothing(tmp_path: Path) -> None:
    write_folder(tmp_path / "in", 3, sizes=[(40, 30)])
    found = parts(str(tmp_path / "in" / "img-00000[12].jpg"), tmp_path / "out")
    assert [f.relative for f in found[0].items] == ["img-000001.jpg", "img-000002.jpg"]
    with pytest.raises(ImageInputError, match=r"INPUT '.*missing' does not exist"):
        ImageSources(str(tmp_path / "missing"), str(tmp_path / "out"))
    with pytest.raises(ImageInputError, match="matches no file"):
        ImageSources(str(tmp_path / "in" / "*.png"), str(tmp_path / "out"))


def test_webdataset_keys_split_at_the_first_dot_of_the_name() -> None:
    assert split_key("dir/000123.jpg") == ("dir/000123", "jpg")
    assert split_key("a.b.JPG") == ("a", "b.jpg")


def test_img2dataset_shards_are_read_with_captions_and_fields_by_byte_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_shards(tmp_path / "in", 7, 4, sizes=[(48, 36)])
    found = parts(str(tmp_path / "in"), tmp_path / "out", images_per_task=3)
    # the img2dataset tables beside each tar are not inputs
    assert [(p.kind, p.relative, p.count) for p in found] == [
        ("tar", "00000.tar", 3), ("tar", "00000.tar", 1), ("tar", "00001.tar", 3),
    ]  # fmt: skip
    ranges = []
    real = read_module.read_range

    def recorded(path: str, start: int, stop: int) -> bytes:
        ranges.append((Path(path).name, start, stop))
        return real(path, start, stop)

    monkeypatch.setattr(read_module, "read_range", recorded)
    images = [image for part in found for image in read(part)]
    assert [i.key for i in images] == [f"0000{i // 4}.tar/{i:09d}" for i in range(7)]
    assert images[5].caption == "shapes on a gradient 5"
    assert images[5].extra is not None and images[5].extra["key"] == "000000005"
    assert images[5].data == encode(render_image(5, 48, 36), quality=90)
    size = (tmp_path / "in" / "00000.tar").stat().st_size
    assert len(ranges) == 3 and all(stop - start < size for _, start, stop in ranges)
    assert ranges[0][2] <= ranges[1][1]  # each part reads its own members' bytes, once


def tar_of(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_sample_without_an_image_and_a_shard_cut_short_fail_alone(tmp_path: Path) -> None:
    jpeg = encode(render_image(0, 40, 30))
    (tmp_path / "in").mkdir()
    members = [("k1.jpg", jpeg), ("k1.txt", b"one"), ("k2.json", b"{}"), ("k3.jpg", jpeg)]
    tar_of(tmp_path / "in" / "a.tar", members)
    data = (tmp_path / "in" / "a.tar").read_bytes()
    (tmp_path / "in" / "b.tar").write_bytes(data[: 512 + 200])  # inside k1.jpg's data
    found = parts(str(tmp_path / "in"), tmp_path / "out")
    images = {i.key: i for part in found for i in read(part)}
    assert images["a.tar/k1"].caption == "one" and images["a.tar/k1"].data == jpeg
    assert images["a.tar/k2"].errors["ImageReader"] == "the sample has no image member"
    assert images["a.tar/k3"].data == jpeg
    assert images["b.tar/k1"].errors["ImageReader"] == "truncated: the shard ends inside k1.jpg"
    assert images["b.tar"].errors["ImageReader"] == (
        "tar shard unreadable after 1 sample(s): ReadError: unexpected end of data"
    )


def test_a_file_that_is_no_tar_is_one_failure(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.tar").write_bytes(b"\x01" * 2000)
    found = parts(str(tmp_path / "in"), tmp_path / "out")
    assert [p.kind for p in found] == ["unreadable"]
    (image,) = read(found[0])
    assert image.key == "broken.tar" and "tar shard unreadable" in image.errors["ImageReader"]


def test_special_files_named_like_images_fail_alone(tmp_path: Path) -> None:
    """A named pipe blocked the reader (or the listing, named like a shard) for ever; a link
    to /dev/zero filled a worker's memory until it was killed, with the part's images."""
    paths = write_folder(tmp_path / "in", 1, sizes=[(40, 30)])
    os.mkfifo(tmp_path / "in" / "pipe.png")
    os.mkfifo(tmp_path / "in" / "pipe.tar")
    (tmp_path / "in" / "zero.png").symlink_to("/dev/zero")
    found = parts(str(tmp_path / "in"), tmp_path / "out")
    images = {i.key: i for part in found for i in read(part)}
    assert images[paths[0].name].data == paths[0].read_bytes()
    assert images["pipe.png"].errors["ImageReader"] == "not a regular file but a named pipe"
    assert images["pipe.tar"].errors["ImageReader"] == "not a regular file but a named pipe"
    assert images["zero.png"].errors["ImageReader"] == "not a regular file but a character device"


def test_scan_reads_headers_only(tmp_path: Path) -> None:
    write_shards(tmp_path, 3, 3, sizes=[(40, 30)])
    samples = list(scan_tar(str(tmp_path / "00000.tar")))
    assert [s.key for s in samples] == ["000000000", "000000001", "000000002"]
    assert all(s.image and s.caption and s.meta for s in samples)


def test_parquet_of_bytes_and_of_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "in" / "pics").mkdir(parents=True)
    jpegs = [encode(render_image(i, 40, 30)) for i in range(3)]
    for i, data in enumerate(jpegs):
        (tmp_path / "in" / "pics" / f"{i}.bin").write_bytes(data)
    hf = pa.table(
        {
            "image": [{"bytes": d, "path": None} for d in jpegs[:2]] + [None],
            "caption": ["a", "b", "c"],
            "score": [1.0, 2.0, 3.0],
        }
    )
    pq.write_table(hf, tmp_path / "in" / "bytes.parquet", row_group_size=2)
    pq.write_table(
        pa.table({"path": [f"pics/{i}.bin" for i in range(3)] + ["pics/missing.bin"]}),
        tmp_path / "in" / "paths.parquet",
    )
    found = parts(str(tmp_path / "in"), tmp_path / "out")
    images = {i.key: i for part in found for i in read(part)}
    assert [images[f"bytes.parquet#{r}"].data for r in range(2)] == jpegs[:2]
    assert images["bytes.parquet#1"].caption == "b"
    assert images["bytes.parquet#1"].extra == {"score": 2.0}
    assert "null" in images["bytes.parquet#2"].errors["ImageReader"]
    assert [images[f"paths.parquet#{r}"].data for r in range(3)] == jpegs
    assert "unreadable" in images["paths.parquet#3"].errors["ImageReader"]


def test_parquet_of_large_strings_as_pandas_writes_them(tmp_path: Path) -> None:
    """pandas writes every string column as large_string: the captions and fields of a
    table of bytes were dropped without a word, and a table of paths refused as having no
    column of paths."""
    (tmp_path / "in" / "pics").mkdir(parents=True)
    jpegs = [encode(render_image(i, 40, 30)) for i in range(2)]
    for i, data in enumerate(jpegs):
        (tmp_path / "in" / "pics" / f"{i}.jpg").write_bytes(data)
    text = pa.large_string()
    pq.write_table(
        pa.table(
            {
                "image": pa.array([{"bytes": d, "path": None} for d in jpegs],
                                  pa.struct([("bytes", pa.large_binary()), ("path", text)])),
                "caption": pa.array(["a", "b"], text),
                "url": pa.array(["http://x/0", "http://x/1"], text),
            }
        ),
        tmp_path / "in" / "bytes.parquet",
    )  # fmt: skip
    paths = pa.array([f"pics/{i}.jpg" for i in range(2)], text)
    pq.write_table(pa.table({"path": paths, "caption": pa.array(["c", "d"], text)}),
                   tmp_path / "in" / "paths.parquet")  # fmt: skip
    images = {
        i.key: i for part in parts(str(tmp_path / "in"), tmp_path / "out") for i in read(part)
    }
    assert [images[f"bytes.parquet#{r}"].data for r in range(2)] == jpegs
    assert (images["bytes.parquet#1"].caption, images["bytes.parquet#1"].extra) == (
        "b",
        {"url": "http://x/1"},
    )
    assert [images[f"paths.parquet#{r}"].data for r in range(2)] == jpegs
    assert images["paths.parquet#0"].caption == "c"


def test_a_parquet_without_images_is_one_failure_naming_its_columns(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "in" / "t.parquet")
    (image,) = read(parts(str(tmp_path / "in"), tmp_path / "out")[0])
    assert "no column of image bytes" in image.errors["ImageReader"]
    assert "its columns: a, b" in image.errors["ImageReader"]


def test_an_image_the_machine_could_not_read_for_now_has_its_part_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permission or I/O error failed the image for good: a rerun once the permissions
    were fixed skipped its part as complete. Its part's record says so, and the next run
    does the part again; a file that is gone is the image's own failure."""
    import errno

    from conveyor.stages.image.writer import part_record
    from conveyor.tasks.image import ImageBatch

    paths = write_folder(tmp_path / "in", 3, sizes=[(40, 30)])
    (part,) = parts(str(tmp_path / "in"), tmp_path / "out", images_per_task=8)
    paths[2].unlink()  # gone since the listing: the image's own failure, not read again
    real = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == paths[0].name:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    denied, fine, missing = read(part)
    assert denied.again and "PermissionError" in denied.errors["ImageReader"]
    assert not fine.errors and not fine.again
    assert "FileNotFoundError" in missing.errors["ImageReader"] and not missing.again
    record = part_record(ImageBatch(data=[denied, fine, missing], part=part))
    assert record["read_again"] == 1 and len(record["failures"]) == 2


def test_a_part_with_a_matching_record_is_skipped_and_counted(tmp_path: Path) -> None:
    write_folder(tmp_path / "in", 4, sizes=[(40, 30)])
    output = tmp_path / "out"
    first = parts(str(tmp_path / "in"), output, images_per_task=2)
    layout = ImageLayout(output)
    record = {"key": list(first[0].key), "part": 0}
    layout.write_json(layout.part_record(0), record)
    layout.metadata_path(0).parent.mkdir(parents=True)
    layout.metadata_path(0).write_bytes(b"")  # a complete part's metadata is there too
    layout.write_json(layout.part_record(1), {"key": ["image-part", 1, "stale"], "part": 1})
    told = []
    sources = ImageSources(
        str(tmp_path / "in"),
        str(output),
        images_per_task=2,
        on_complete=lambda p, r: told.append(r),
    )
    assert [p.index for p in sources] == [1]  # part 1's input changed: done again
    assert told == [record] and (sources.found, sources.complete, sources.pending) == (2, 1, 1)
    assert json.loads(layout.part_record(0).read_text()) == record
    layout.metadata_path(0).unlink()  # deleted: the part is done again
    again = ImageSources(str(tmp_path / "in"), str(output), images_per_task=2)
    assert [p.index for p in again] == [0, 1]
    layout.metadata_path(0).write_bytes(b"")
    layout.write_json(layout.part_record(0), {**record, "read_again": 1})
    again = ImageSources(str(tmp_path / "in"), str(output), images_per_task=2)
    assert [p.index for p in again] == [0, 1]  # an image it could not read for now
