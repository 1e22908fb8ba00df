"""The motion filter: codec motion vectors of the encoded clips, and its thresholds."""

from __future__ import annotations

import copy
import gc

import numpy as np
import pytest

from conveyor.samples.video import Segment
from conveyor.stages.video import motion
from conveyor.stages.video.frames import ClipFrameExtractor
from conveyor.stages.video.motion import COLLECT_EVERY, MotionFilter, motion_scores
from conveyor.stages.video.transcode import ClipTranscoder
from conveyor.tasks.video import Clip, MotionScores, VideoTask

from .conftest import Media

FPS = 12
#: 2 s each at 160x120: a pan, moving shapes, then two frozen stretches
SEGMENTS = [
    Segment("pan", 2.0, 1),
    Segment("shapes", 2.0, 2),
    Segment("noise", 2.0, 3, static=True),
    Segment("checker", 2.0, 4, static=True),
]
NAMES = ["pan", "shapes", "still noise", "still checker"]


@pytest.fixture(scope="module")
def encoded(media: Media) -> VideoTask:
    """One clip per segment, transcoded as the pipeline does (libx264, veryfast)."""
    source = media.video("motion.mp4", SEGMENTS, width=160, height=120, fps=FPS)
    spans = [(i * 2 * FPS, (i + 1) * 2 * FPS) for i in range(len(SEGMENTS))]
    task = media.task(source.path, media.metadata(source.path), spans)
    list(media.ready(ClipTranscoder(encoder="libx264")).process(task))
    assert all(clip.encoded for clip in task.data.clips)
    return task


def run(stage: MotionFilter, task: VideoTask) -> dict[str, Clip]:
    fresh = copy.deepcopy(task)
    stage.process(fresh)
    return dict(zip(NAMES, fresh.data.clips, strict=True))


def test_scores_of_moving_and_still_clips(encoded: VideoTask) -> None:
    scores = {
        name: motion_scores(clip.encoded or b"")
        for name, clip in zip(NAMES, encoded.data.clips, strict=True)
    }
    for name in ("pan", "shapes"):
        moving = scores[name]
        assert moving.global_mean > 1e-3 and moving.patch_min > 0
        assert moving.frames == 2 * FPS - 1 and moving.patch == 256
    for name in ("still noise", "still checker"):
        still = scores[name]
        assert still.global_mean < 1e-6 and still.patch_min < 1e-6
        assert still.frames == 2 * FPS - 1


def test_frames_are_freed_while_reading_not_when_python_gets_round_to_it(
    encoded: VideoTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a frame whose side data was read is freed by the cycle collector only: left to
    # Python, a clip's frames (1.4 MB each at 720p) would pile up for hundreds of frames
    import av

    def frames_alive() -> int:
        return sum(type(o) is av.VideoFrame for o in gc.get_objects())

    alive: list[int] = []
    read = motion._vectors
    monkeypatch.setattr(
        motion, "_vectors", lambda frame: alive.append(frames_alive()) or read(frame)
    )
    gc.collect()
    before = frames_alive()  # held elsewhere in this test process
    motion_scores(encoded.data.clips[0].encoded or b"")
    assert len(alive) == 2 * FPS
    assert max(alive) - before <= COLLECT_EVERY + 2 * FPS // COLLECT_EVERY + 1
    assert frames_alive() == before


def test_smaller_patches_find_the_still_background(encoded: VideoTask) -> None:
    shapes = encoded.data.clips[1].encoded or b""
    whole, small = motion_scores(shapes, patch=256), motion_scores(shapes, patch=32)
    # one patch covers the whole frame
    assert whole.patch_min == pytest.approx(whole.global_mean, rel=0.05)
    assert small.patch_min < whole.global_mean / 5  # a 32 px square of background is still


def test_still_clips_are_filtered_and_moving_ones_kept(encoded: VideoTask) -> None:
    clips = run(MotionFilter(), encoded)
    for name in ("pan", "shapes"):
        assert clips[name].filtered_by is None and clips[name].kept
    for name in ("still noise", "still checker"):
        assert clips[name].filtered_by == "motion" and not clips[name].kept
    for clip in clips.values():
        assert set(clip.scores) == {"motion_global_mean", "motion_patch_min"}
        assert not clip.errors


def test_score_only_keeps_everything_and_scores_it(encoded: VideoTask) -> None:
    clips = run(MotionFilter(score_only=True), encoded)
    assert all(clip.filtered_by is None for clip in clips.values())
    assert clips["still noise"].scores["motion_global_mean"] < 1e-6
    assert clips["pan"].scores["motion_global_mean"] > 1e-3


def test_thresholds(encoded: VideoTask) -> None:
    strict = run(MotionFilter(global_threshold=1.0), encoded)
    assert all(clip.filtered_by == "motion" for clip in strict.values())
    lenient = run(MotionFilter(global_threshold=0.0), encoded)
    assert all(clip.filtered_by is None for clip in lenient.values())
    patches = run(MotionFilter(global_threshold=0.0, patch_threshold=1e-3, patch=32), encoded)
    assert patches["pan"].filtered_by is None
    assert patches["shapes"].filtered_by == "motion"  # its background stands still


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        MotionFilter(global_threshold=-1)
    with pytest.raises(ValueError):
        MotionFilter(patch_threshold=-1)
    with pytest.raises(ValueError, match="patch"):
        MotionFilter(patch=8)


def test_a_clip_of_key_frames_only_is_left_alone(media: Media) -> None:
    intra = media.video(
        "intra.mp4", [Segment("pan", 1.0, 1)], width=160, height=120, fps=FPS, gop=1
    )
    data = intra.path.read_bytes()
    assert motion_scores(data) == MotionScores(256, 0.0, 0.0, 0)
    clip = Clip("c", "intra.mp4", (0.0, 1.0), (0, 12), encoded=data, num_frames=12)
    task = media.task(intra.path, media.metadata(intra.path))
    task.data.clips = [clip]
    MotionFilter().process(task)
    assert clip.filtered_by is None and clip.scores == {} and not clip.errors


def test_a_clip_without_bytes_fails_alone(encoded: VideoTask) -> None:
    task = copy.deepcopy(encoded)
    task.data.clips[0].encoded = None
    MotionFilter().process(task)
    first, *others = task.data.clips
    assert first.filtered_by == "error" and "ClipTranscoder first" in first.errors["MotionFilter"]
    assert all(not clip.errors for clip in others)


def test_undecodable_bytes_fail_the_clip(encoded: VideoTask) -> None:
    task = copy.deepcopy(encoded)
    task.data.clips[0].encoded = np.random.default_rng(0).bytes(4096)
    MotionFilter().process(task)
    assert "MotionFilter" in task.data.clips[0].errors
    assert not task.data.failed


def test_a_frozen_frame_of_shapes_is_filtered(media: Media) -> None:
    still = media.video(
        "still-shapes.mp4",
        [Segment("shapes", 2.0, 3, static=True)],
        width=320,
        height=240,
        fps=24,
    )
    task = media.task(still.path, media.metadata(still.path), [(0, 48)])
    list(media.ready(ClipTranscoder(encoder="libx264")).process(task))
    MotionFilter().process(task)
    (clip,) = task.data.clips
    assert clip.filtered_by == "motion", clip.scores


def test_a_slow_pan_is_motion_even_where_most_frames_move_less_than_a_pixel(media: Media) -> None:
    # a checkerboard panning about half a pixel per frame at 160 pixels wide: the encoder
    # finds a vector in only some frames, which a median would call still
    slow = media.video("slow-pan.mp4", [Segment("checker", 3.0, 3)], width=160, height=96, fps=12)
    task = media.task(slow.path, media.metadata(slow.path), [(0, 36)])
    list(media.ready(ClipTranscoder(encoder="libx264")).process(task))
    MotionFilter().process(task)
    (clip,) = task.data.clips
    assert clip.filtered_by is None, clip.scores
    assert clip.scores["motion_global_mean"] > 1e-4


def test_the_frame_extractors_pass_scores_for_the_filter_behind_it(
    encoded: VideoTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extractor decodes every frame anyway: with ``motion_patch`` it exports the vectors
    in that pass, and the filter judges from them without decoding the clip again. The
    vectors come from the bitstream, so the loop filter it keeps on changes no score."""
    clips = zip(NAMES, encoded.data.clips, strict=True)
    alone = {name: motion_scores(clip.encoded or b"") for name, clip in clips}
    task = copy.deepcopy(encoded)
    ClipFrameExtractor(rates={1.0}, motion_patch=256).process(task)
    extracted = dict(zip(NAMES, task.data.clips, strict=True))
    assert {name: clip.motion for name, clip in extracted.items()} == alone
    assert all(clip.frames[1.0].shape[0] == 2 for clip in extracted.values())

    def no_second_decode(encoded: bytes, patch: int = 256) -> MotionScores:
        raise AssertionError("the motion filter decoded a clip the extractor had scored")

    monkeypatch.setattr(motion, "motion_scores", no_second_decode)
    MotionFilter().process(task)
    for name in ("pan", "shapes"):
        assert extracted[name].kept and extracted[name].frames  # on to the models
    for name in ("still noise", "still checker"):
        assert extracted[name].filtered_by == "motion"
        assert not extracted[name].frames  # filtered: its frames go no further
    assert extracted["pan"].scores["motion_global_mean"] == alone["pan"].global_mean


def test_scores_of_another_patch_are_not_taken_for_the_filters(encoded: VideoTask) -> None:
    task = copy.deepcopy(encoded)
    ClipFrameExtractor(rates={1.0}, motion_patch=32).process(task)
    shapes = task.data.clips[1]
    assert shapes.motion is not None and shapes.motion.patch == 32
    MotionFilter(global_threshold=0.0, patch_threshold=1e-3, patch=256).process(task)
    assert shapes.scores["motion_patch_min"] == motion_scores(shapes.encoded or b"").patch_min
    assert shapes.filtered_by is None  # judged by whole frames, as the filter asks


def test_the_extractor_checks_its_motion_patch() -> None:
    with pytest.raises(ValueError, match="motion_patch"):
        ClipFrameExtractor(motion_patch=8)


def test_the_source_vectors_the_transcoder_read_are_judged_without_a_decode(
    media: Media, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default the filter judges from the source's vectors, read while the clips were
    cut; the definition of earlier versions (``source="clip"``) decodes each clip instead.
    On these clips both filter the same: the still ones, and only them."""
    source = media.video("motion.mp4", SEGMENTS, width=160, height=120, fps=FPS)
    spans = [(i * 2 * FPS, (i + 1) * 2 * FPS) for i in range(len(SEGMENTS))]
    task = media.task(source.path, media.metadata(source.path), spans)
    list(media.ready(ClipTranscoder(encoder="libx264", motion_patch=256)).process(task))
    assert all(c.motion is not None and c.motion.source == "source" for c in task.data.clips)
    own = copy.deepcopy(task)

    def no_decode(encoded: bytes, patch: int = 256) -> MotionScores:
        raise AssertionError("the motion filter decoded a clip whose source was scored")

    with monkeypatch.context() as patched:
        patched.setattr(motion, "motion_scores", no_decode)
        MotionFilter().process(task)
    MotionFilter(source="clip").process(own)
    for judged in (task, own):
        clips = dict(zip(NAMES, judged.data.clips, strict=True))
        assert [n for n, c in clips.items() if c.filtered_by == "motion"] == NAMES[2:]
    assert all(c.motion is not None and c.motion.source == "clip" for c in own.data.clips)
    pan, theirs = task.data.clips[0], own.data.clips[0]
    assert pan.scores["motion_global_mean"] != theirs.scores["motion_global_mean"]
    assert theirs.scores["motion_global_mean"] == motion_scores(theirs.encoded or b"").global_mean


def test_a_clip_without_source_scores_is_scored_from_its_own_vectors(encoded: VideoTask) -> None:
    task = copy.deepcopy(encoded)  # cut without motion_patch: nothing was read
    assert all(clip.motion is None for clip in task.data.clips)
    MotionFilter().process(task)
    clips = dict(zip(NAMES, task.data.clips, strict=True))
    assert clips["still noise"].filtered_by == "motion" and clips["pan"].kept
    assert all(c.motion is not None and c.motion.source == "clip" for c in clips.values())


def test_the_motion_source_is_validated() -> None:
    with pytest.raises(ValueError, match="source"):
        MotionFilter(source="pixels")  # type: ignore[arg-type]
    assert MotionFilter().source == "source" and MotionFilter(source="clip").source == "clip"
