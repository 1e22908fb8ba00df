"""Finding the videos (directories, files, lists; resume) and probing each one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conveyor.media.layout import OutputLayout
from conveyor.samples.video import write_bad_file
from conveyor.stages.video import reader
from conveyor.stages.video.reader import (
    VideoListing,
    VideoProbe,
    VideoReader,
    VideoSource,
    VideoSources,
    check_inputs,
    input_root,
    iter_videos,
    list_videos,
    pending_videos,
)
from conveyor.storage import special_file
from conveyor.tasks.base import Task
from conveyor.tasks.video import Video, VideoTask, video_id

from .conftest import Media


def touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (len(name) + 1))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "in"
    touch(
        root,
        "b.mp4",
        "a.MOV",
        "sub/c.mkv",
        "sub/deeper/d.WebM",
        "sub/e.avi",
        "notes.txt",
        "clip.mp4.part",
        ".hidden.mp4",
        ".cache/f.mp4",
        "sub/.git/g.mp4",
        "out/clips/h.mp4",
    )
    return root


def relatives(sources: list) -> list[str]:  # type: ignore[type-arg]
    return [s.relative_path for s in sources]


def test_a_directory_is_searched_recursively_in_relative_path_order(tree: Path) -> None:
    found = list_videos(tree, exclude=[tree / "out"])
    assert relatives(found) == [
        "a.MOV",
        "b.mp4",
        "sub/c.mkv",
        "sub/deeper/d.WebM",
        "sub/e.avi",
    ]
    first = found[0]
    assert first.path == str(tree / "a.MOV")
    assert first.size == (tree / "a.MOV").stat().st_size
    assert first.mtime == (tree / "a.MOV").stat().st_mtime


def test_hidden_files_and_directories_are_skipped(tree: Path) -> None:
    names = relatives(list_videos(tree))
    assert not any(part.startswith(".") for name in names for part in name.split("/"))
    assert "out/clips/h.mp4" in names  # nothing excluded unless asked


def test_linked_folders_are_followed_once_and_a_link_up_the_tree_is_no_loop(
    tmp_path: Path,
) -> None:
    root, elsewhere = tmp_path / "in", tmp_path / "disk2"
    touch(root, "a.mp4")
    touch(elsewhere, "b.mp4", "deeper/c.mkv")
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "again").symlink_to(elsewhere, target_is_directory=True)  # the same folder twice
    (elsewhere / "up").symlink_to(root, target_is_directory=True)  # a loop
    (root / "gone").symlink_to(tmp_path / "missing", target_is_directory=True)  # dangling
    (root / "out").mkdir()
    touch(root, "out/clips/x.mp4")
    (root / "out-link").symlink_to(root / "out", target_is_directory=True)
    names = relatives(list_videos(root, exclude=[root / "out"]))
    assert names == ["a.mp4", "again/b.mp4", "again/deeper/c.mkv"]


def test_a_linked_file_is_taken_once_per_real_file_and_never_beside_it(tmp_path: Path) -> None:
    """A link inside the input to one of its videos made that video's clips twice."""
    root, elsewhere = tmp_path / "in", tmp_path / "disk2"
    touch(root, "a.mp4", ".hidden/h.mp4", "out/o.mp4")
    touch(elsewhere, "b.mp4")
    (root / "c.mp4").symlink_to(root / "a.mp4")  # the input's own video
    (root / "sub").mkdir()
    (root / "sub" / "d.mp4").symlink_to(root / "a.mp4")
    (root / "e.mp4").symlink_to(elsewhere / "b.mp4")  # outside: taken, once
    (root / "sub" / "f.mp4").symlink_to(elsewhere / "b.mp4")
    (root / "g.mp4").symlink_to(root / ".hidden" / "h.mp4")  # its file is not listed
    (root / "o.mp4").symlink_to(root / "out" / "o.mp4")  # nor is an excluded one
    names = relatives(list_videos(root, exclude=[root / "out"]))
    assert names == ["a.mp4", "e.mp4", "g.mp4", "o.mp4"]


def test_an_earlier_run_s_output_inside_the_input_is_not_input(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`conveyor video data data/curated`, then `conveyor video data data/curated-2`: the
    second curated the first's clips as videos."""
    root = tmp_path / "data"
    touch(root, "a.mp4", "curated/clips/c.mp4", "curated/.conveyor/journal", "more/b.mkv")
    with caplog.at_level("WARNING", logger="conveyor.stages.video.reader"):
        assert relatives(list_videos(root)) == ["a.mp4", "more/b.mkv"]
    assert "curated is skipped: it holds a Conveyor output (.conveyor/)" in caplog.text
    # an output given as the input itself is read (its clips curated again, as asked)
    assert relatives(list_videos(root / "curated")) == ["clips/c.mp4"]


def test_camera_phone_tv_and_older_web_formats_are_listed_too(tmp_path: Path) -> None:
    names = [
        "cam/00001.MTS",
        "cam/00002.m2ts",
        "dvd.VOB.mpeg",
        "old.mpg",
        "phone.m4v",
        "recording.ts",
        "studio.mxf",
        "web.flv",
        "win.wmv",
        "mobile.3gp",
        "VIDEO_TS/VTS_01_1.VOB",
        "open.ogv",
        "tape.dv",
        "flash.f4v",
        "old.asf",
        "mobile.3g2",
        "cam/00001.MTS.xml",  # a camera's sidecar is not a video
        "VIDEO_TS/VTS_01_0.IFO",  # nor a DVD's index
        "subtitles.srt",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert relatives(list_videos(tmp_path)) == sorted(names[:16])


def test_extensions_are_matched_in_any_case(tree: Path) -> None:
    assert relatives(list_videos(tree, extensions=[".MKV", ".avi"])) == [
        "sub/c.mkv",
        "sub/e.avi",
    ]


def test_limit_takes_the_first_in_sorted_order(tree: Path) -> None:
    assert relatives(list_videos(tree, limit=2)) == ["a.MOV", "b.mp4"]


def test_a_single_file_is_taken_whatever_its_extension(tree: Path) -> None:
    found = list_videos(tree / "notes.txt")
    assert relatives(found) == ["notes.txt"]
    assert input_root(tree / "notes.txt") == tree


def test_a_list_of_paths_is_relative_to_their_common_directory(tree: Path) -> None:
    inputs = [tree / "sub" / "deeper", tree / "b.mp4", str(tree / "sub" / "e.avi")]
    assert input_root(inputs) == tree
    assert relatives(list_videos(inputs)) == ["b.mp4", "sub/deeper/d.WebM", "sub/e.avi"]


def test_a_path_named_twice_is_listed_once(tree: Path) -> None:
    assert relatives(list_videos([tree / "b.mp4", tree / "b.mp4", tree])).count("b.mp4") == 1


def test_the_walk_gives_the_order_of_the_whole_relative_paths(tmp_path: Path) -> None:
    """One directory at a time, yet the order of sorting every relative path: a folder
    sorts as ``name/`` ("a.mp4" < "a/..." < "a-b/..." would be wrong: '-' < '.' < '/')."""
    names = [
        "a.mp4", "a/x.mp4", "a-b/y.mp4", "ab.mp4", "a b/z.mp4", "A/q.mp4", "é.mp4",
        "a/a/deep.mp4", "a/a.mp4", "z/a-b.mp4", "z/a/b.mp4", "z/a.b.mp4", "0/1.mp4",
    ]  # fmt: skip
    touch(tmp_path, *names)
    assert relatives(list_videos(tmp_path)) == sorted(names)


def test_the_listing_reads_a_folder_only_when_the_walk_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(tmp_path, "a/1.mp4", "b/2.mp4", "c/3.mp4", "c/d/4.mp4")
    opened: list[str] = []
    scandir = os.scandir

    def recorded(path: str) -> object:
        opened.append(os.path.relpath(path, tmp_path))
        return scandir(path)

    monkeypatch.setattr(reader.os, "scandir", recorded)
    stream = iter_videos(tmp_path)
    assert opened == []  # nothing is listed before it is asked for
    assert next(stream).relative_path == "a/1.mp4"
    assert opened == [".", "a"]
    assert [s.relative_path for s in stream] == ["b/2.mp4", "c/3.mp4", "c/d/4.mp4"]
    assert opened == [".", "a", "b", "c", "c/d"]


def test_a_missing_input_is_refused_before_the_stream_is_read(tree: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.mp4"):
        iter_videos([tree, tree / "nope.mp4"])


def test_an_unreadable_folder_is_skipped(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scandir = os.scandir

    def refusing(path: str) -> object:
        if path.endswith("deeper"):
            raise PermissionError(13, "Permission denied", path)
        return scandir(path)

    monkeypatch.setattr(reader.os, "scandir", refusing)
    assert "sub/deeper/d.WebM" not in relatives(list_videos(tree))
    assert "sub/e.avi" in relatives(list_videos(tree))


def test_input_root_of_a_directory_is_itself(tree: Path) -> None:
    assert input_root(tree) == tree
    assert input_root(str(tree / "sub")) == tree / "sub"
    with pytest.raises(ValueError):
        input_root([])


def test_missing_inputs_are_named(tree: Path) -> None:
    check_inputs([tree, tree / "b.mp4"])
    with pytest.raises(FileNotFoundError, match=r"nope\.mp4"):
        check_inputs([tree, tree / "nope.mp4"])
    with pytest.raises(FileNotFoundError, match=r"nope\.mp4"):
        list_videos(tree / "nope.mp4")
    with pytest.raises(FileNotFoundError):
        VideoListing(tree / "nope.mp4")


def test_listing_validates_its_limit(tree: Path) -> None:
    with pytest.raises(ValueError, match="limit"):
        VideoListing(tree, limit=0)


# -- the run's sources, listed as they are taken --------------------------------------------
def test_sources_yield_what_is_left_to_do_and_say_what_needs_a_reset(
    tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    complete(layout, tree, "b.mp4")  # done from this very file: skipped
    complete(layout, tree, "sub/c.mkv", mtime=1.0)  # from an older file: redone, reset
    (layout.staging_dir(video_id("sub/e.avi")) / "intent-0.json").parent.mkdir(parents=True)
    told: list[tuple[str, str]] = []
    handed: list[VideoSource] = []
    sources = VideoSources(
        tree,
        out,
        on_complete=lambda s, r: told.append((s.relative_path, r["status"])),
        on_pending=handed.append,
    )
    assert not sources.empty()
    todo = list(sources)
    assert [(s.relative_path, s.reset) for s in todo] == [
        ("a.MOV", False),
        ("out/clips/h.mp4", False),  # the tree's own "out", not the output
        ("sub/c.mkv", True),  # an outdated record
        ("sub/deeper/d.WebM", False),
        ("sub/e.avi", True),  # an earlier run had begun writing it
    ]
    assert (sources.found, sources.complete, sources.pending) == (6, 1, 5)
    assert handed == todo and sources.exhausted
    assert told == [("b.mp4", "ok")]


def test_sources_read_the_records_a_batch_at_a_time_as_the_run_takes_them(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[str]] = []
    read_records = OutputLayout.read_records

    def recorded(self: OutputLayout, paths: list[str]) -> dict[str, object]:
        batches.append(list(paths))
        return read_records(self, paths)

    monkeypatch.setattr(OutputLayout, "read_records", recorded)
    sources = VideoSources(tree, tmp_path / "out", batch=2, limit=5)
    stream = iter(sources)
    assert next(stream).relative_path == "a.MOV"
    assert batches == [["a.MOV", "b.mp4"]] and sources.found == 2
    assert len(list(stream)) == 4
    assert [len(b) for b in batches] == [2, 2, 1] and sources.found == sources.pending == 5


def test_sources_without_videos_are_empty_and_are_iterated_once(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    touch(tmp_path, "in/notes.txt")
    sources = VideoSources(tmp_path / "in", tmp_path / "out")
    assert sources.empty() and list(sources) == []
    again = VideoSources(tmp_path / "in", None)
    list(again)
    with pytest.raises(RuntimeError, match="once"):
        iter(again)
    with pytest.raises(ValueError, match="limit"):
        VideoSources(tmp_path / "in", None, limit=0)
    with pytest.raises(FileNotFoundError, match="nope"):
        VideoSources(tmp_path / "nope", None)


def test_draining_counts_what_a_stopped_run_did_not_take(tree: Path, tmp_path: Path) -> None:
    sources = VideoSources(tree, tmp_path / "out", batch=2)
    stream = iter(sources)
    next(stream)
    sources.drain()
    assert sources.exhausted and sources.found == sources.pending == 6
    untouched = VideoSources(tree, tmp_path / "out")
    untouched.drain()
    assert untouched.found == 6


def test_a_source_not_marked_for_reset_is_not_reset(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reset: list[str] = []
    monkeypatch.setattr(OutputLayout, "reset", lambda self, rel: reset.append(rel) or 0)
    listing = VideoListing(tree, tmp_path / "out")
    fresh = VideoSource(str(tree / "b.mp4"), "b.mp4", 6, 1.0, reset=False)
    again = VideoSource(str(tree / "a.MOV"), "a.MOV", 6, 1.0)
    tasks = listing.process(fresh) + listing.process(again)
    assert [t.data.relative_path for t in tasks] == ["b.mp4", "a.MOV"]
    assert reset == ["a.MOV"]


# -- the listing stage -------------------------------------------------------------------
def seed() -> Task:  # type: ignore[type-arg]
    return Task(data=None, dataset_name="ds")


def listed(stage: VideoListing) -> list[Video]:
    tasks = stage.process(seed())
    assert all(isinstance(t, VideoTask) and t.dataset_name == "ds" for t in tasks)
    return [t.data for t in tasks]


def complete(layout: OutputLayout, tree: Path, relative: str, **source: object) -> None:
    """A finished record of ``relative`` as the writer leaves it."""
    stat = (tree / relative).stat()
    stamp = {"size_bytes": stat.st_size, "mtime": stat.st_mtime, **source}
    layout.write_json(
        layout.video_record(relative), {"source": stamp, "status": "ok", "clips": ["old-clip"]}
    )


def test_listing_makes_one_task_per_video_and_excludes_its_output(tree: Path) -> None:
    videos = listed(VideoListing(tree, tree / "out"))
    assert [v.relative_path for v in videos] == [
        "a.MOV",
        "b.mp4",
        "sub/c.mkv",
        "sub/deeper/d.WebM",
        "sub/e.avi",
    ]
    b = videos[1]
    stat = (tree / "b.mp4").stat()
    assert (b.path, b.source_size, b.source_mtime) == (
        str(tree / "b.mp4"),
        stat.st_size,
        stat.st_mtime,
    )
    assert b.metadata is None and not b.clips and not b.failed


def test_listing_honours_extensions_and_limit(tree: Path) -> None:
    videos = listed(VideoListing(tree, extensions=[".mkv", ".avi", ".mp4"], limit=2))
    assert [v.relative_path for v in videos] == ["b.mp4", "out/clips/h.mp4"]


def test_resume_skips_complete_videos_and_resets_the_others(tree: Path) -> None:
    out = tree / "out"  # inside the input: never listed
    layout = OutputLayout(out)
    complete(layout, tree, "b.mp4")  # done from this very file: skipped
    complete(layout, tree, "sub/c.mkv", mtime=1.0)  # done from an older file: redone
    layout.write_bytes(layout.clip_path("old-clip"), b"old")
    layout.write_json(layout.meta_path("old-clip"), {})
    layout.tmp.mkdir(parents=True, exist_ok=True)
    (layout.tmp / "half-written.json.abc").write_text("{")

    videos = listed(VideoListing(tree, out, limit=3))

    assert [v.relative_path for v in videos] == ["a.MOV", "sub/c.mkv"]
    assert layout.read_record("b.mp4") is not None
    assert layout.read_record("sub/c.mkv") is None  # the outdated record was reset
    assert not layout.clip_path("old-clip").exists()
    assert not layout.meta_path("old-clip").exists()
    assert list(layout.tmp.iterdir()) == []


def test_resume_calls_reset_on_every_pending_video(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    complete(OutputLayout(out), tree, "b.mp4")
    reset: list[str] = []
    monkeypatch.setattr(OutputLayout, "reset", lambda self, rel: reset.append(rel) or 0)
    videos = listed(VideoListing(tree, out, extensions=[".mp4", ".mov"]))
    assert reset == [v.relative_path for v in videos] == ["a.MOV", "out/clips/h.mp4"]


def test_a_changed_size_means_not_complete(tree: Path, tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path / "out")
    complete(layout, tree, "b.mp4")
    sources = list_videos(tree / "b.mp4")
    assert pending_videos(sources, tmp_path / "out") == []
    assert pending_videos(sources, None) == sources
    (tree / "b.mp4").write_bytes(b"longer now")
    os.utime(tree / "b.mp4", (sources[0].mtime, sources[0].mtime))
    assert relatives(pending_videos(list_videos(tree / "b.mp4"), tmp_path / "out")) == ["b.mp4"]


def test_a_kept_clip_deleted_by_hand_makes_its_video_pending(tree: Path, tmp_path: Path) -> None:
    """Listed by the ``VideoListing`` stage too (it counted the clip as there); a clip kept
    in the record and on the disk leaves the video done."""
    layout = OutputLayout(tmp_path / "out")
    complete(layout, tree, "b.mp4")
    record = json.loads(layout.video_record("b.mp4").read_text())
    layout.write_json(layout.video_record("b.mp4"), {**record, "kept": ["b-0"]})
    layout.clips.mkdir(parents=True)
    Path(layout.clip_path("b-0")).write_bytes(b"clip")
    assert pending_videos(list_videos(tree / "b.mp4"), tmp_path / "out") == []
    Path(layout.clip_path("b-0")).unlink()
    assert relatives(pending_videos(list_videos(tree / "b.mp4"), tmp_path / "out")) == ["b.mp4"]


def test_a_record_without_source_is_not_complete(tree: Path, tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path / "out")
    layout.video_record("b.mp4").parent.mkdir(parents=True)
    layout.video_record("b.mp4").write_text(json.dumps({"status": "ok"}))
    assert relatives(pending_videos(list_videos(tree / "b.mp4"), tmp_path / "out")) == ["b.mp4"]


# -- probing -----------------------------------------------------------------------------
def test_probe_fills_the_metadata(media: Media) -> None:
    source = media.standard()
    video = Video(str(source.path), "standard.mp4")
    task = VideoTask(data=video)
    assert VideoProbe().process(task) is task
    assert video.metadata is not None
    assert (video.metadata.width, video.metadata.height, video.metadata.num_frames) == (
        160,
        120,
        48,
    )
    assert not video.failed and not video.last_chunk


@pytest.mark.parametrize("kind", ["empty", "not_video", "audio_only"])
def test_a_bad_file_fails_the_video_as_its_last_chunk(tmp_path: Path, kind: str) -> None:
    path = write_bad_file(tmp_path / f"{kind}.mp4", kind)
    video = Video(str(path), path.name)
    task = VideoTask(data=video)
    assert VideoProbe().process(task) is task
    assert video.failed and video.last_chunk
    assert list(video.errors) == ["VideoProbe"]
    assert video.metadata is None and video.clips == []


def test_probe_leaves_a_failed_video_alone(tmp_path: Path) -> None:
    video = Video(str(tmp_path / "gone.mp4"), "gone.mp4", errors={"earlier": "bad"})
    VideoProbe().process(VideoTask(data=video))
    assert video.errors == {"earlier": "bad"} and video.metadata is None


def test_reader_is_the_listing_then_the_probe(tree: Path, tmp_path: Path) -> None:
    reader = VideoReader(tree, tmp_path / "out", limit=1, verify=False)
    listing, prober = reader.decompose()
    assert isinstance(listing, VideoListing) and isinstance(prober, VideoProbe)
    assert listing.limit == 1 and listing.output == tmp_path / "out"
    assert prober.verify is False


def test_an_output_written_beside_its_videos_is_not_read_with_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`conveyor video a.mp4 .`, then `conveyor video . other`: the second curated a.mp4
    and, as videos, the first's clips of it."""
    root = tmp_path / "data"
    touch(root, "a.mp4", "clips/a/c.mp4", "filtered_clips/a/d.mp4", ".conveyor/config.json")
    touch(root, "sub/b.mp4")
    with caplog.at_level("WARNING", logger="conveyor.stages.video.reader"):
        assert relatives(list_videos(root)) == ["a.mp4", "sub/b.mp4"]
    assert "(clips/, filtered_clips/): give " in caplog.text
    assert f"{root / 'clips'}/ as INPUT" in caplog.text
    # an output alone is read whole: its clips curated again, as asked
    alone = tmp_path / "curated"
    touch(alone, "clips/a/c.mp4", ".conveyor/config.json")
    assert relatives(list_videos(alone)) == ["clips/a/c.mp4"]


def test_links_to_nothing_are_listed_for_their_failure_to_say_so(tmp_path: Path) -> None:
    """A link to a missing file of the input, or a loop of links, vanished without a word
    (a link out of the input to nothing was said)."""
    root = tmp_path / "in"
    touch(root, "a.mp4")
    (root / "d.mp4").symlink_to("nothere.mp4")
    (root / "l1.mp4").symlink_to("l2.mp4")
    (root / "l2.mp4").symlink_to("l1.mp4")
    (root / "out.mp4").symlink_to(tmp_path / "nowhere" / "x.mp4")
    assert relatives(list_videos(root)) == ["a.mp4", "d.mp4", "l1.mp4", "l2.mp4", "out.mp4"]
    assert special_file(str(root / "d.mp4")) == (
        "a broken symbolic link (to nothere.mp4, which is missing)"
    )
    assert special_file(str(root / "l1.mp4")) == "a loop of symbolic links (to l2.mp4)"


def test_a_folder_that_cannot_be_read_is_skipped_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its videos (or documents) were left out without a word."""
    from conveyor.stages.text.readers import list_inputs

    root = tmp_path / "in"
    touch(root, "a.mp4", "a.jsonl", "locked/b.mp4", "locked/b.jsonl")
    scandir = os.scandir

    def refusing(path: str = ".") -> Any:
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with caplog.at_level("WARNING"):
        assert relatives(list_videos(root)) == ["a.mp4"]
        assert [Path(f.path).name for f in list_inputs(str(root)).files] == ["a.jsonl"]
    said = f"{root / 'locked'} is skipped: it cannot be read (Permission denied)"
    assert caplog.text.count(said) == 2
