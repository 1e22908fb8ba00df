"""Shot detection window by window, as the pipeline runs it: the windows of a generated
video, and the transitions the splitter would take from a decoder and a detector."""

from __future__ import annotations

from conveyor.media.decode import probe
from conveyor.media.dissolves import VarianceDissolves
from conveyor.media.transitions import GradualRuns, merge_transitions
from conveyor.samples.video import SyntheticVideo
from conveyor.stages.video.shots import ShotFrameDecoder, ShotWindows, TransNetV2Detector
from conveyor.tasks.video import Video, VideoTask


def windowed(
    truth: SyntheticVideo, window_s: float, context: int, first_end_s: float = 0.0
) -> list[VideoTask]:
    video = Video(str(truth.path), truth.path.name, probe(str(truth.path)))
    stage = ShotWindows(window_s, context, first_end_s)
    return [VideoTask(data=v) for v in stage.process_video(video)]


def detect(
    truth: SyntheticVideo,
    detector: object,
    decoder: ShotFrameDecoder,
    window_s: float,
    context: int,
    first_end_s: float = 0.0,
) -> list[tuple[int, int]]:
    """The transitions the splitter would take: each window's, and the gradual runs and
    variance sags that are transitions over the whole video."""
    found: list[tuple[int, int]] = []
    gradual = GradualRuns(truth.fps)
    sags = VarianceDissolves(truth.fps)
    for task in windowed(truth, window_s, context, first_end_s):
        decoder.process(task)
        if isinstance(detector, TransNetV2Detector):
            detector.process_batch([task])
        else:
            detector.process(task)  # type: ignore[attr-defined]
        window = task.data.window
        assert window is not None and window.frames is None  # dropped
        found += window.transitions or []
        found += gradual.feed(window.start, window.gradual, window.end)
        found += sags.feed(window.start, window.variance, window.end)
    return merge_transitions(found + gradual.finish() + sags.finish())
