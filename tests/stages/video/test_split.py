"""Splitting rules: fixed stride, shots to clips (incremental and at once agree), chunking,
and the shot splitter's handling of windows in any order, interleaved and failed."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from conveyor.media.transitions import STRONG
from conveyor.stages.video.split import (
    FixedStrideSplitter,
    SceneClipper,
    ShotSplitter,
    SplitRules,
    chunk_clips,
    chunk_sizes,
    fixed_stride_spans,
    scene_spans,
    windows,
)
from conveyor.tasks.video import FrameWindow, Video, VideoMetadata, VideoTask, clip_id

FPS = 10.0


def meta(frames: int, fps: float = FPS) -> VideoMetadata:
    return VideoMetadata(frames / fps, fps, frames, 64, 48, "h264")


# -- fixed stride ------------------------------------------------------------------------
def test_fixed_stride_cuts_the_video_and_drops_a_short_tail() -> None:
    # 35 s at 10 fps: 0-10, 10-20, 20-30, and 30-35 (5 s >= 2 s kept)
    assert fixed_stride_spans(350, FPS, 10, 10, 2) == [(0, 100), (100, 200), (200, 300), (300, 350)]
    # 31 s: the 1 s tail is shorter than min_clip_s
    assert fixed_stride_spans(310, FPS, 10, 10, 2) == [(0, 100), (100, 200), (200, 300)]


def test_fixed_stride_with_overlap_and_with_gaps() -> None:
    assert fixed_stride_spans(200, FPS, 10, 5, 2) == [(0, 100), (50, 150), (100, 200)]
    assert fixed_stride_spans(250, FPS, 5, 10, 2) == [(0, 50), (100, 150), (200, 250)]


@pytest.mark.parametrize("fps", [25.0, 24.0, 30000 / 1001, 50.0])
@pytest.mark.parametrize("length", [0.1, 0.7, 2.5, 3.3, 10.0])
def test_back_to_back_clips_leave_no_frame_out_and_none_twice(fps: float, length: float) -> None:
    # a clip length that is not a whole number of frames: its end and the next start are
    # the same time computed two ways, and rounded apart they put a frame in no clip (or in
    # two): 54 overlaps and 33 gaps in an hour of 3.3 s clips at 25 fps
    frames = round(3600 * fps)
    spans = fixed_stride_spans(frames, fps, length, length, 0)
    assert spans[0][0] == 0 and spans[-1][1] == frames
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    # every clip within a frame of its length
    assert all(abs((end - start) - length * fps) <= 1 for start, end in spans[:-1])


def test_fixed_stride_on_a_video_shorter_than_the_minimum_gives_nothing() -> None:
    assert fixed_stride_spans(15, FPS, 10, 10, 2) == []
    assert fixed_stride_spans(0, FPS, 10, 10, 2) == []


@pytest.mark.parametrize(
    "args", [(100, FPS, 0, 10, 2), (100, FPS, 10, 0, 2), (100, FPS, 10, 10, -1)]
)
def test_fixed_stride_rejects_bad_lengths(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        fixed_stride_spans(*args)  # type: ignore[arg-type]


# -- shots to clips ----------------------------------------------------------------------
RULES = SplitRules(min_len_s=2, max_len_s=10, max_len_mode="stride", crop_s=0.5)


def test_a_scene_is_cropped_and_short_scenes_dropped() -> None:
    # scenes [0, 41) (4.1 s), [41, 56) (1.5 s: too short once cropped), [56, 200)
    transitions = [(41, 40), (56, 55)]
    spans = scene_spans(transitions, 200, RULES, FPS)
    assert spans[0] == (5, 36)  # 0.5 s cropped at each end
    assert all(not (41 <= a < 56) for a, _ in spans)  # the short scene made no clip
    assert spans[1] == (61, 161)  # a long scene cut every 10 s ...
    assert spans[2] == (161, 195)  # ... and its remainder (3.4 s) kept


def test_long_scene_truncated_gives_one_clip() -> None:
    rules = SplitRules(2, 10, "truncate", 0.5)
    assert scene_spans([], 500, rules, FPS) == [(5, 105)]


def test_a_transition_of_several_frames_is_excluded_from_both_scenes() -> None:
    # a crossfade over frames 95..104: the scene before ends at 95, the next starts at 105
    spans = scene_spans([(95, 104)], 300, RULES, FPS)
    assert spans[0] == (5, 90)
    assert spans[1][0] == 110
    assert all(not (a < 105 and b > 95) for a, b in spans)  # no clip spans the transition


def test_no_clip_spans_a_cut() -> None:
    rng = random.Random(4)
    for _ in range(50):
        cuts = sorted(rng.sample(range(5, 995), 8))
        transitions = [(c, c - 1) for c in cuts]
        for a, b in scene_spans(transitions, 1000, RULES, FPS):
            assert not any(a < c < b for c in cuts)
            assert b - a >= RULES.min_len_s * FPS
            assert b - a <= RULES.max_len_s * FPS


@pytest.mark.parametrize("mode", ["stride", "truncate"])
def test_incremental_clipping_agrees_with_clipping_at_once(mode: str) -> None:
    rules = SplitRules(2, 10, mode, 0.5)  # type: ignore[arg-type]
    rng = random.Random(mode)
    for _ in range(40):
        total = rng.randint(50, 3000)
        cuts = sorted(rng.sample(range(1, total), rng.randint(0, 10)))
        transitions = [(c, c + rng.choice([-1, 0, 3])) for c in cuts]
        transitions = [(a, b) for a, b in transitions if b < total]
        whole = scene_spans(transitions, total, rules, FPS)
        # feed the same transitions window by window, asking for certain clips after each
        clipper = SceneClipper(rules, FPS)
        got: list[tuple[int, int]] = []
        step = rng.randint(7, 200)
        for start in range(0, total, step):
            end = min(total, start + step)
            for first, last in transitions:
                if start <= first < end:
                    got += clipper.transition(first, last)
            got += clipper.advance(end)
        got += clipper.finish(total)
        assert got == whole


def test_split_rules_are_validated() -> None:
    with pytest.raises(ValueError):
        SplitRules(min_len_s=5, max_len_s=2)
    with pytest.raises(ValueError):
        SplitRules(max_len_mode="cut")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SplitRules(crop_s=-1)


# -- chunks ------------------------------------------------------------------------------
def test_chunks_grow_from_one_clip_to_the_cap() -> None:
    sizes = chunk_sizes(4)
    assert [next(sizes) for _ in range(6)] == [1, 2, 4, 4, 4, 4]
    assert [next(chunk_sizes(8, start=2)) for _ in range(1)] == [4]
    with pytest.raises(ValueError):
        next(chunk_sizes(0))


def test_chunk_clips_numbers_and_marks_the_last() -> None:
    video = Video("/x/a.mp4", "a.mp4", meta(1000))
    clips = FixedStrideSplitter(clip_len_s=10, clips_per_chunk=4).process_video(video)
    assert [len(c.clips) for c in clips] == [1, 2, 4, 3]
    assert [c.chunk_index for c in clips] == [0, 1, 2, 3]
    assert [c.last_chunk for c in clips] == [False, False, False, True]
    empty = chunk_clips(video, [], 4)
    assert len(empty) == 1 and empty[0].last_chunk and not empty[0].clips


def test_clip_ids_are_deterministic_and_depend_on_path_and_span() -> None:
    a = clip_id("dir/a.mp4", 0, 100)
    assert a == clip_id("dir/a.mp4", 0, 100)
    assert a != clip_id("dir/a.mp4", 0, 101)
    assert a != clip_id("dir/b.mp4", 0, 100)
    video = Video("/x/a.mp4", "a.mp4", meta(300))
    first = FixedStrideSplitter().process_video(video)
    again = FixedStrideSplitter().process_video(Video("/elsewhere/a.mp4", "a.mp4", meta(300)))
    ids = [c.clip_id for chunk in first for c in chunk.clips]
    assert ids == [c.clip_id for chunk in again for c in chunk.clips]


# -- the shot splitter -------------------------------------------------------------------
def window_tasks(
    name: str,
    frames: int,
    size: int,
    cuts: list[int],
    fail: int | None = None,
    first_end: int = 0,
) -> list[VideoTask]:
    spans = windows(frames, size, first_end)
    tasks = []
    for i, (start, end) in enumerate(spans):
        window = FrameWindow(i, len(spans), start, end)
        window.transitions = [(c, c - 1) for c in cuts if start <= c < end]
        video = Video(f"/x/{name}", name, meta(frames), window=window)
        if i == fail:
            video.fail("ShotFrameDecoder", "corrupt data at 12 s")
        tasks.append(VideoTask(data=video))
    return tasks


def run_splitter(tasks: list[VideoTask]) -> list[Video]:
    splitter = ShotSplitter(RULES, clips_per_chunk=4)
    splitter.setup(None)
    out = []
    for task in tasks:
        out += [t.data for t in splitter.process(task)]
    return out


def spans_of(chunks: list[Video]) -> list[tuple[int, int]]:
    return [c.frame_span for chunk in chunks for c in chunk.clips]


def test_windows_in_any_order_give_the_same_clips_and_one_last_chunk() -> None:
    cuts = [120, 310, 330, 700]
    ordered = run_splitter(window_tasks("a.mp4", 1000, 50, cuts))
    expected = scene_spans([(c, c - 1) for c in cuts], 1000, RULES, FPS)
    assert spans_of(ordered) == expected
    rng = random.Random(0)
    for _ in range(10):
        tasks = window_tasks("a.mp4", 1000, 50, cuts)
        rng.shuffle(tasks)
        chunks = run_splitter(tasks)
        assert sorted(spans_of(chunks)) == expected
        assert sorted(c.chunk_index for c in chunks) == list(range(len(chunks)))
        assert [c.last_chunk for c in chunks].count(True) == 1
        assert max(chunks, key=lambda c: c.chunk_index).last_chunk
        found = sorted(t for c in chunks for t in c.transitions)
        assert found == [(c, c - 1) for c in cuts]  # each transition reported once


def test_interleaved_videos_are_kept_apart() -> None:
    a = window_tasks("a.mp4", 400, 50, [100])
    b = window_tasks("b.mp4", 300, 50, [250])
    mixed = [t for pair in zip(a, b, strict=False) for t in pair] + a[len(b) :]
    chunks = run_splitter(mixed)
    by_video: dict[str, list[Video]] = {}
    for chunk in chunks:
        by_video.setdefault(chunk.relative_path, []).append(chunk)
    assert spans_of(by_video["a.mp4"]) == scene_spans([(100, 99)], 400, RULES, FPS)
    assert spans_of(by_video["b.mp4"]) == scene_spans([(250, 249)], 300, RULES, FPS)


def test_clips_of_a_long_shot_leave_before_the_video_is_done() -> None:
    # one 100 s shot in 10 s windows: clips go out while later windows are still missing
    tasks = window_tasks("long.mp4", 1000, 100, [])
    splitter = ShotSplitter(RULES)
    splitter.setup(None)
    first_three = [t.data for task in tasks[:3] for t in splitter.process(task)]
    assert spans_of(first_three)  # certain clips were emitted already
    assert not any(c.last_chunk for c in first_three)


def test_windows_cover_the_video_and_one_ends_where_the_first_clip_is_certain() -> None:
    assert windows(1000, 50) == [(i, i + 50) for i in range(0, 1000, 50)]
    assert windows(1800, 150, 330)[:4] == [(0, 165), (165, 330), (330, 480), (480, 630)]
    assert windows(1800, 600, 330)[:2] == [(0, 330), (330, 930)]  # one window fits best
    assert windows(1000, 150, 400)[:4] == [(0, 133), (133, 267), (267, 400), (400, 550)]
    assert windows(300, 150, 330) == windows(300, 150) == [(0, 150), (150, 300)]  # shorter
    for frames, size, first_end in [(1800, 150, 330), (331, 150, 330), (7, 3, 5), (1, 4, 2)]:
        spans = windows(frames, size, first_end)
        assert spans[0][0] == 0 and spans[-1][0] < spans[-1][1] == frames
        assert all(a < b == c for (a, b), (c, _) in itertools.pairwise(spans))
    with pytest.raises(ValueError, match="window"):
        windows(10, 0)


def run(splitter: ShotSplitter, task: VideoTask) -> list[Video]:
    return [t.data for t in splitter.process(task)]


def test_a_long_first_shot_gives_its_first_clip_with_the_window_ending_there() -> None:
    """10 s clips cropped 0.5 s at each end are certain at 11 s: with 5 s windows the
    first clip waited for the third window (to 15 s); planned to end at 11 s, it leaves
    with the second."""
    rules = SplitRules(2.0, 10.0, "stride", 0.5)
    for first_end, wanted in [(0, 3), (110, 2)]:
        tasks = window_tasks("long.mp4", 600, 50, [], first_end=first_end)
        splitter = ShotSplitter(rules)
        splitter.setup(None)
        arrived = (i for i, task in enumerate(tasks, 1) if spans_of(run(splitter, task)))
        assert next(arrived) == wanted


def test_a_failed_window_fails_the_video_in_its_last_chunk() -> None:
    chunks = run_splitter(window_tasks("a.mp4", 1000, 50, [500], fail=12))
    last = [c for c in chunks if c.last_chunk]
    assert len(last) == 1
    assert last[0].errors == {"ShotFrameDecoder": "corrupt data at 12 s"}
    # clips certain before the failure stay; none is made after it
    assert all(b <= 600 for _, b in spans_of(chunks))


def test_a_video_that_failed_before_windows_becomes_one_last_chunk() -> None:
    video = Video("/x/bad.mp4", "bad.mp4")
    video.fail("VideoProbe", "empty file (0 bytes)")
    chunks = run_splitter([VideoTask(data=video)])
    assert len(chunks) == 1 and chunks[0].last_chunk and chunks[0].failed


def test_a_window_without_transitions_is_a_clear_error() -> None:
    task = window_tasks("a.mp4", 100, 50, [])[0]
    task.data.window.transitions = None  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="without detected transitions"):
        run_splitter([task])


def test_a_shot_shorter_than_a_clip_and_its_crops_is_cropped_less_not_lost() -> None:
    # scenes of 2.0 s, 2.5 s and 1.9 s at 10 fps with 2 s clips and 0.5 s crops
    spans = scene_spans([(20, 19), (45, 44)], 64, RULES, FPS)
    assert spans == [(0, 20), (22, 43)]  # the 1.9 s scene stays too short for any clip
    assert scene_spans([], 31, RULES, FPS) == [(5, 26)]  # 3.1 s: the whole crop fits


def gradual_tasks(frames: int, size: int, runs: list[tuple[int, int]]) -> list[VideoTask]:
    """Windows whose detector marked runs of gradual evidence (all of it strong)."""
    tasks = window_tasks("g.mp4", frames, size, [])
    for task in tasks:
        window = task.data.window
        assert window is not None
        codes = np.zeros(window.end - window.start, dtype=np.uint8)
        for a, b in runs:
            lo, hi = max(a, window.start), min(b + 1, window.end)
            codes[lo - window.start : hi - window.start] = STRONG if lo < hi else 0
        window.gradual = codes if codes.any() else None
    return tasks


def test_a_dissolve_across_windows_is_one_transition_and_a_long_drift_stays_a_shot() -> None:
    """At 10 fps with 5 s windows: a 2 s dissolve over a window border is one transition;
    14 s of gradual change (a scrolling gradient TransNetV2 scores as a dissolve) is a shot,
    with clips."""
    tasks = gradual_tasks(600, 50, [(90, 109), (300, 439)])
    chunks = run_splitter(tasks)
    assert sorted(t for c in chunks for t in c.transitions) == [(91, 109)]
    spans = spans_of(chunks)
    assert spans == scene_spans([(91, 109)], 600, RULES, FPS)
    assert not any(a < 110 and b > 91 for a, b in spans)  # no clip into the dissolve
    assert sum(1 for a, b in spans if a < 440 and b > 300) >= 1  # the drift has clips


def test_no_clip_is_made_past_a_run_that_may_still_become_a_dissolve() -> None:
    # a run from frame 145 open at the end of window 2 (frame 150): the clip that would end
    # past it waits, and comes once the run is known
    tasks = gradual_tasks(400, 50, [(145, 170)])
    splitter = ShotSplitter(SplitRules(1, 1, "stride", 0.0), clips_per_chunk=8)
    splitter.setup(None)
    early = [t.data for task in tasks[:3] for t in splitter.process(task)]
    assert spans_of(early) and max(b for _, b in spans_of(early)) <= 145
    rest = [t.data for task in tasks[3:] for t in splitter.process(task)]
    assert not any(a < 171 and b > 146 for a, b in spans_of(early + rest))
    assert (146, 170) in [t for c in early + rest for t in c.transitions]
