"""What every video stage shares: failed videos pass through, clip failures are recorded on
the clip, frames are taken from what the transcoder (or a frame extractor) decoded, torch runs
where the worker was placed.

A stage that works on whole videos subclasses ``VideoStage`` and implements
``process_video``; one that works clip by clip subclasses ``ClipStage`` and implements
``process_clip`` (or ``process_clips`` to batch a chunk's clips through a model). Errors that
belong to the input (a clip that cannot be decoded) are data: they are recorded on the clip or
video and the run goes on; anything else is a defect and goes to the engine, which retries it
and records it as a failure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from conveyor.media.errors import InputError, describe_error, input_errors
from conveyor.stage import ProcessingStage
from conveyor.tasks.video import Clip, Video, VideoTask

if TYPE_CHECKING:
    from conveyor.cluster import WorkerInfo


def check_numbers(**values: float | None) -> None:
    """``ValueError`` naming the first of ``values`` (a stage's settings) that is not a
    finite number (None passes): ``inf`` and NaN reached the stages' frame arithmetic and
    failed every clip ("cannot convert float NaN to integer"), or compared false everywhere
    and filtered nothing."""
    import math

    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")


def check_rate(frame_rate: float) -> None:
    """``ValueError`` unless ``frame_rate`` (frames sampled per second) is finite and > 0."""
    check_numbers(frame_rate=frame_rate)
    if not frame_rate > 0:
        raise ValueError(f"frame_rate must be > 0, got {frame_rate}")


class VideoStage(ProcessingStage[VideoTask, VideoTask]):
    """A stage over ``VideoTask``s. Failed videos go straight through to the writer.

    ``process_video`` changes the video in place (return ``None``) or returns a list of
    ``Video``s to fan out into (chunks, windows); an empty list drops the task.
    """

    def process(self, task: VideoTask) -> VideoTask | list[VideoTask] | None:
        video = task.data
        if video.failed:
            return task
        try:
            result = self.process_video(video)
        except input_errors() as exc:
            self.on_input_error(video, exc)
            return task
        if result is None:
            return task
        return [_child(task, part) for part in result]

    def process_video(self, video: Video) -> list[Video] | None:
        raise NotImplementedError(f"stage {self.name!r} must implement process_video")

    def on_input_error(self, video: Video, exc: BaseException) -> None:
        """The media was bad: the whole video fails (a clip stage fails the chunk's clips)."""
        video.fail(self.name, describe_error(exc))


def _child(parent: VideoTask, video: Video) -> VideoTask:
    return VideoTask(data=video, dataset_name=parent.dataset_name, metadata=dict(parent.metadata))


class ClipStage(VideoStage):
    """A stage over the clips of each chunk. Only active clips (not filtered, not failed)
    are processed; a failure that belongs to one clip is recorded on it and the others go on.
    """

    def process_video(self, video: Video) -> list[Video] | None:
        active = [clip for clip in video.clips if clip.active]
        if active:
            self.process_clips(active, video)
        return None

    def on_input_error(self, video: Video, exc: BaseException) -> None:
        reason = describe_error(exc)
        for clip in video.clips:
            if clip.active:
                clip.fail(self.name, reason)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        """Process the chunk's active clips; the default runs ``process_clip`` on each."""
        errors = input_errors()
        for clip in clips:
            try:
                self.process_clip(clip, video)
            except errors as exc:
                clip.fail(self.name, describe_error(exc))

    def process_clip(self, clip: Clip, video: Video) -> None:
        raise NotImplementedError(f"stage {self.name!r} must implement process_clip")


class FrameConsumer(ClipStage):
    """A clip stage that reads the clip's frames at ``frame_rate``, which the
    ``ClipTranscoder`` sampled from the source as it cut the clip (or a
    ``ClipFrameExtractor`` decoded from an encoded clip).

    The pipeline builder asks every consumer for its rate, has the transcoder take them all
    in its one pass, and sets ``release_frames`` on the last consumer so the frames travel no
    further than they are needed.
    """

    frame_rate: float = 1.0
    release_frames: bool = False

    def process_video(self, video: Video) -> list[Video] | None:
        try:
            return super().process_video(video)
        finally:
            if self.release_frames:
                for clip in video.clips:
                    clip.drop_frames()

    def scored_together(
        self, clips: list[Clip], score: Callable[[list[Any]], Any]
    ) -> Iterator[tuple[Clip, Any]]:
        """Every clip's frames through ``score`` in one go (a model batches them); yields each
        clip with its frames' scores. A clip without frames fails alone."""
        ready: list[tuple[Clip, Any]] = []
        errors = input_errors()
        for clip in clips:
            try:
                ready.append((clip, self.frames_of(clip)))
            except errors as exc:
                clip.fail(self.name, describe_error(exc))
        if not ready:
            return
        scores = score([frame for _, frames in ready for frame in frames])
        start = 0
        for clip, frames in ready:
            yield clip, scores[start : start + len(frames)]
            start += len(frames)

    def frames_of(self, clip: Clip) -> Any:
        """The clip's frames at this stage's rate (N x H x W x 3 uint8 RGB)."""
        frames = clip.frames.get(self.frame_rate)
        if frames is None and not clip.frames and clip.encoded is not None and not clip.num_frames:
            raise InputError("the clip holds no frame")
        if frames is None:
            have = ", ".join(f"{r:g}" for r in clip.frames) or "none"
            raise RuntimeError(
                f"stage {self.name!r} needs frames at {self.frame_rate:g} fps but clip "
                f"{clip.clip_id} has {have}: give ClipTranscoder(frame_rates=[..., "
                f"{self.frame_rate:g}]) (or a ClipFrameExtractor's rates) that rate"
            )
        if len(frames) == 0:
            raise InputError(f"no frames could be decoded at {self.frame_rate:g} fps")
        return frames


#: the most threads a model or encoder stage takes when cores idle (``max_threads``): a
#: clip's batch of frames, or one encoder, gains little past four here
ELASTIC_THREADS = 4


class TorchStage:
    """Mix-in for stages that run a torch model: the device follows the worker's placement
    (a GPU only where the backend gave one), and CPU threads follow the batch's ``threads``
    (the stage's CPUs, more while cores idle): call ``limit_threads`` in ``setup`` and again
    before each batch's model work, and set ``max_threads`` (``ELASTIC_THREADS``)."""

    resources: ClassVar[Any]
    threads: Any

    def torch_device(self, worker: WorkerInfo) -> str:
        import torch

        return "cuda" if worker.gpu_ids and torch.cuda.is_available() else "cpu"

    def limit_threads(self) -> None:
        import torch

        threads = self.threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != 1:
            with contextlib.suppress(RuntimeError):  # it can be set once per process
                torch.set_num_interop_threads(1)
