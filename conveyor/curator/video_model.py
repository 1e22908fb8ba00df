"""Where a NeMo Curator-style stage meets Conveyor's video stages: the two video models,
converted.

A Curator-style stage is given NeMo Curator's ``Video`` (``conveyor.curator.tasks.video``):
a Conveyor ``VideoTask`` is converted on its way in, its clips still in play in ``clips``,
those a filter rejected in ``filtered_clips``; clips Conveyor's model keeps but Curator's
stages never see (failed, or finished by an interrupted earlier run) are held back. What the
stage gives goes on as it is to another Curator-style stage, and is converted back before
one of Conveyor's: into the Conveyor objects it came from, so that what Curator's model has
no field for (frame spans, decoded frames, tags, a chunk's place among its video's parts)
is kept, and what Conveyor's has no field for (caption windows, ``source_bytes``, ...)
rides along in ``carried`` until the next Curator-style stage.

A clip a stage moves to ``filtered_clips`` is rejected in the stage's name; one it drops
from both lists is too (Conveyor's writer records every clip of a video). A video that
failed is passed on without calling the stage, as Conveyor's own video stages do, so that
the writer records it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from conveyor.curator.tasks.video import (
    Clip,
    ClipStats,
    Video,
    VideoMetadata,
    _Window,
    curator_metadata,
)
from conveyor.curator.tasks.video import VideoTask as CuratorVideoTask
from conveyor.curator.utils.decoder_utils import FrameExtractionPolicy
from conveyor.storage import is_url
from conveyor.tasks.video import ERROR_FILTER
from conveyor.tasks.video import Clip as _Clip
from conveyor.tasks.video import Video as _Video
from conveyor.tasks.video import VideoMetadata as _VideoMetadata
from conveyor.tasks.video import VideoTask as _VideoTask

#: ``FrameExtractionSignature(FrameExtractionPolicy.sequence, fps).to_str()`` is this, a
#: dash and the rate in thousandths: the frames Conveyor's extractor samples at ``fps``
SEQUENCE = str(FrameExtractionPolicy.sequence)
#: Curator ``Clip`` fields kept in ``Clip.carried`` on Conveyor's side
CLIP_CARRIED = (
    "decoded_motion_data",
    "cosmos_embed1_frames",
    "egomotion",
    "cosmos_embed1_text_match",
    "windows",
)
#: Curator ``Video`` fields kept in ``Video.carried`` on Conveyor's side
VIDEO_CARRIED = ("source_bytes", "frame_array", "num_total_clips", "num_clip_chunks", "clip_stats")
#: Curator score fields -> Conveyor's ``Clip.scores`` keys
SCORES = {
    "aesthetic_score": "aesthetic",
    "motion_score_global_mean": "motion_global_mean",
    "motion_score_per_patch_min_256": "motion_patch_min",
}


def frames_key(fps: float) -> str:
    """The ``extracted_frames`` key of frames sampled at ``fps``."""
    return f"{SEQUENCE}-{int(fps * 1000)}"


def frames_fps(key: str) -> float | None:
    """The sampling rate ``frames_key`` wrote into ``key``, else ``None``."""
    head, _, rate = key.rpartition("-")
    if head != SEQUENCE or not rate.isdigit():
        return None
    return int(rate) / 1000


def is_video_task(task: Any) -> bool:
    return isinstance(task, (_VideoTask, CuratorVideoTask))


# -- Conveyor -> NeMo Curator --------------------------------------------------------------
@dataclass
class _Held:
    """What the Curator side does not show of a Conveyor video (on ``Video._conveyor``'s
    side): the clips held back, and the ones a stage dropped (rejected in its name)."""

    hidden: list[_Clip] = field(default_factory=list)
    dropped: list[_Clip] = field(default_factory=list)
    #: (this output's index, outputs) where a stage gave several tasks of one video
    part: tuple[int, int] | None = None


def to_curator(task: _VideoTask) -> CuratorVideoTask:
    """``task`` as a Curator-style stage reads it (see the module docstring)."""
    return CuratorVideoTask(
        task_id=task.task_id,
        dataset_name=task.dataset_name,
        data=curator_video(task.data),
        _metadata=task.metadata,
        _stage_perf=task.stage_perf,
    )


def curator_video(video: _Video) -> Video:
    carried = video.carried
    if video.metadata is not None:
        meta = curator_metadata(video.metadata, video.metadata.size_bytes or video.source_size)
    else:
        meta = VideoMetadata(size=video.source_size or None)
    shown: list[Clip] = []
    filtered: list[Clip] = []
    held = _Held()
    for clip in video.clips:
        if clip.restored or clip.errors or clip.filtered_by == ERROR_FILTER:
            held.hidden.append(clip)
        else:
            (shown if clip.filtered_by is None else filtered).append(curator_clip(clip, video))
    return Video(
        input_video=video.path if is_url(video.path) else Path(video.path),
        source_bytes=carried.get("source_bytes"),
        metadata=meta,
        frame_array=carried.get("frame_array"),
        clips=shown,
        filtered_clips=filtered,
        num_total_clips=carried.get("num_total_clips", 0),
        num_clip_chunks=carried.get("num_clip_chunks", 0),
        clip_chunk_index=video.chunk_index,
        clip_stats=carried.get("clip_stats") or ClipStats(),
        errors=dict(video.errors),
        _conveyor=video,
        _held=held,
    )


def curator_clip(clip: _Clip, video: _Video) -> Clip:
    carried = clip.carried
    frames = {frames_key(fps): array for fps, array in clip.frames.items()}
    frames.update(carried.get("extracted_frames", {}))
    windows = carried.get("windows")
    if windows is None and clip.captions:
        windows = [_Window(clip.frame_span[0], clip.frame_span[1], caption=dict(clip.captions))]
    elif windows and clip.captions != _captions(windows):
        _recaption(windows, clip.captions)  # one of Conveyor's stages captioned it since
    motion = clip.motion  # the transcoder's, before a motion filter scores the clip
    scores = {
        "motion_global_mean": motion.global_mean if motion is not None else None,
        "motion_patch_min": motion.patch_min if motion is not None else None,
        **clip.scores,
    }
    return Clip(
        uuid=UUID(clip.clip_id),
        source_video=video.path,
        span=clip.span,
        buffer=clip.encoded,
        extracted_frames=frames,
        decoded_motion_data=carried.get("decoded_motion_data"),
        motion_score_global_mean=scores["motion_global_mean"],
        motion_score_per_patch_min_256=scores["motion_patch_min"],
        aesthetic_score=scores.get("aesthetic"),
        cosmos_embed1_frames=carried.get("cosmos_embed1_frames"),
        cosmos_embed1_embedding=clip.embedding,
        windows=windows or [],
        egomotion=carried.get("egomotion", {}),
        cosmos_embed1_text_match=carried.get("cosmos_embed1_text_match"),
        errors=dict(clip.errors),
        _conveyor=clip,
    )


# -- one call of a Curator-style stage -----------------------------------------------------
class Call:
    """The inputs of one call of Curator-style stage ``stage`` as it reads them, and its
    outputs as the next stage reads them (``to_conveyor``: one of Conveyor's)."""

    def __init__(self, stage: str, tasks: list[Any]) -> None:
        self.stage = stage
        self.inputs: list[Any] = []
        #: failed Conveyor videos (also as the Curator-style stage before gave them on),
        #: passed on without a call
        self.through: list[Any] = []
        #: id of each Curator video given -> its clips before the call
        self.shown: dict[int, list[Clip]] = {}
        #: path of each Curator video given that came from a Conveyor video -> those videos
        self.sources: dict[str, list[Video]] = {}
        for task in tasks:
            if isinstance(task, _VideoTask):
                if task.data is not None and task.data.failed:
                    self.through.append(task)
                    continue
                task = to_curator(task)
            elif _failed(task):
                self.through.append(task)
                continue
            if isinstance(task, CuratorVideoTask) and task.data is not None:
                video = task.data
                self.shown[id(_origin_key(video))] = video.clips + video.filtered_clips
                if video._conveyor is not None:
                    self.sources.setdefault(video.input_path, []).append(video)
            self.inputs.append(task)

    def outputs(self, result: Any, to_conveyor: bool) -> Any:
        single = not isinstance(result, list)
        outputs = ([] if result is None else [result]) if single else list(result)
        if not self.shown and not self.through and not any(map(is_video_task, outputs)):
            return result  # no video on either side
        self._account(outputs)
        through: list[Any] = list(self.through)
        if to_conveyor:
            outputs = [to_conveyor_task(t, self.stage) for t in outputs]
            through = [to_conveyor_task(t, self.stage) for t in through]
        else:
            through = [to_curator(t) if isinstance(t, _VideoTask) else t for t in through]
        if single and not through:
            return outputs[0] if outputs else None
        return outputs + through

    def _account(self, outputs: list[Any]) -> None:
        """Name the filter of each clip moved to ``filtered_clips``; reject each clip
        dropped from both lists and keep it with its video's first output; number the
        outputs of one video given as several."""
        groups: dict[int, list[Video]] = {}
        for task in outputs:
            if isinstance(task, CuratorVideoTask) and task.data is not None:
                _adopt(task.data, self.sources)
                groups.setdefault(id(_origin_key(task.data)), []).append(task.data)
        for key, before in self.shown.items():
            videos = groups.get(key, [])
            # clips are told apart by uuid: a copy the stage made of a clip
            # (``dataclasses.replace``, ``copy.deepcopy``) is that clip still
            present = {c.uuid for v in videos for c in v.clips + v.filtered_clips}
            given = {c.uuid for c in before}
            for video in videos:
                for clip in video.filtered_clips:
                    if clip._filtered_by is None and clip.uuid in given:
                        clip._filtered_by = self.stage
            dropped = [c for c in before if c.uuid not in present]
            if videos and dropped:
                held = _held(videos[0])
                for clip in dropped:
                    if clip._conveyor is not None:
                        clip._conveyor.reject(clip._filtered_by or self.stage)
                        held.dropped.append(clip._conveyor)
        for videos in groups.values():
            if len(videos) < 2:
                continue
            origin = videos[0]._conveyor
            if origin is not None and (origin.parts > 1 or _held(videos[0]).part is not None):
                raise ValueError(
                    f"stage {self.stage!r} gave {len(videos)} tasks of one part of video "
                    f"{origin.relative_path!r}; Conveyor's writer counts a chunk's parts, and "
                    "a part cannot be split again (split a whole chunk, before the transcoder)"
                )
            for index, video in enumerate(videos):
                if index:  # each output its own record of what is held back
                    video._held = _Held()
                _held(video).part = (index, len(videos))


def _adopt(video: Video, sources: dict[str, list[Video]]) -> None:
    """A video the stage made anew (``Video(input_video=task.data.input_video, ...)``, as
    NeMo Curator's stages chunk a video) of a video it was given: of that one's Conveyor
    video, so that it keeps its name, chunk and held-back clips (a part of the chunk where
    the stage made several). Where the call was given several tasks of the source (parts
    of a chunk, in a batch), the one whose clips it holds."""
    if video._conveyor is not None:
        return
    given = sources.get(video.input_path, [])
    if len(given) > 1:
        mine = {c.uuid for c in video.clips + video.filtered_clips}
        given = [g for g in given if any(c.uuid in mine for c in g.clips + g.filtered_clips)]
    if given and given[0] is not video:
        video._conveyor = given[0]._conveyor
        video._held = given[0]._held


def _failed(task: Any) -> bool:
    """A Curator video task made of a Conveyor video that failed."""
    if not isinstance(task, CuratorVideoTask) or task.data is None:
        return False
    origin = task.data._conveyor
    return origin is not None and origin.failed


def _origin_key(video: Video) -> Any:
    """What tells the videos of one input apart: the Conveyor video it came from, else
    itself."""
    return video._conveyor if video._conveyor is not None else video


def _held(video: Video) -> _Held:
    if video._held is None:
        video._held = _Held()
    held: _Held = video._held
    return held


# -- NeMo Curator -> Conveyor --------------------------------------------------------------
def to_conveyor_task(task: Any, stage: str) -> Any:
    """``task`` as Conveyor's stages read it (anything but a Curator video task as it is)."""
    if not isinstance(task, CuratorVideoTask) or task.data is None:
        return task
    return _VideoTask(
        data=conveyor_video(task.data, stage),
        dataset_name=task.dataset_name,
        metadata=task.metadata,
        task_id=task.task_id,
        stage_perf=task.stage_perf,
    )


def conveyor_video(video: Video, stage: str) -> _Video:
    _check_one_each(video, stage)
    origin = video._conveyor
    held = _held(video)
    if origin is None:
        origin = _new_video(video)
    elif origin.metadata is None and video.has_metadata():
        origin.metadata = _conveyor_metadata(video.metadata)
    clips = [conveyor_clip(c, origin, False) for c in video.clips]
    for clip in video.filtered_clips:
        clips.append(conveyor_clip(clip, origin, True, clip._filtered_by or stage))
    if held.part is None or held.part[0] == 0:
        clips += held.hidden + held.dropped
    place = {c.clip_id: i for i, c in enumerate(origin.clips)}
    clips.sort(key=lambda c: place.get(c.clip_id, len(place)))
    if held.part is not None:
        out = origin.part_of(held.part[0], held.part[1], clips)
    else:
        out = origin
        out.clips = clips
    out.carried = {
        name: getattr(video, name) for name in VIDEO_CARRIED if _set(getattr(video, name))
    }
    for key, reason in video.errors.items():
        if key not in out.errors:
            out.fail(key, reason)
    return out


def _check_one_each(video: Video, stage: str) -> None:
    """``ValueError`` where two of ``video``'s clips share a uuid: Conveyor's model tells
    clips apart by it, and the second overwrote the first."""
    seen: set[UUID] = set()
    for clip in video.clips + video.filtered_clips:
        if clip.uuid in seen:
            name = video._conveyor.relative_path if video._conveyor else video.input_path
            raise ValueError(
                f"stage {stage!r} gave video {name!r} two clips with uuid {clip.uuid}: each "
                "clip needs a uuid of its own (a clip cut in two with dataclasses.replace "
                "keeps its uuid; NeMo Curator's splitters give each clip uuid.uuid5 of its "
                "video and span), and is in clips or in filtered_clips, not both"
            )
        seen.add(clip.uuid)


def conveyor_clip(clip: Clip, video: _Video, filtered: bool, by: str = "") -> _Clip:
    out = clip._conveyor
    if out is None:
        fps = video.metadata.fps if video.metadata is not None else 0.0
        start, end = (float(t) for t in clip.span)
        out = _Clip(
            clip_id=str(clip.uuid),
            source_video=video.relative_path,
            span=(start, end),
            frame_span=(round(start * fps), round(end * fps)),
        )
    elif tuple(clip.span) != out.span:
        out.span = (float(clip.span[0]), float(clip.span[1]))
    out.encoded = clip.buffer
    for name, key in SCORES.items():
        value = getattr(clip, name)
        if value is None:
            out.scores.pop(key, None)
        else:
            out.scores[key] = float(value)
    out.embedding = clip.cosmos_embed1_embedding
    frames: dict[float, Any] = {}
    other: dict[str, Any] = {}
    for key, array in clip.extracted_frames.items():
        fps = frames_fps(key)
        if fps is None:
            other[key] = array
        else:
            frames[fps] = array
    out.frames = frames
    captions = _captions(clip.windows)
    if captions or clip.windows:
        out.captions = captions
    carried = {name: getattr(clip, name) for name in CLIP_CARRIED if _set(getattr(clip, name))}
    if other:
        carried["extracted_frames"] = other
    out.carried = carried
    for key, reason in clip.errors.items():
        if key not in out.errors:
            out.fail(key, reason)
    if filtered:
        out.reject(by)
    elif out.filtered_by is not None and not out.errors:
        out.filtered_by = None  # a stage put a filtered clip back in play
    return out


def _captions(windows: list[_Window]) -> dict[str, str]:
    """Conveyor's one caption per model: the windows' captions in order, and the enhanced
    ones under ``enhanced_<model>``."""
    joined: dict[str, list[str]] = {}
    for window in windows:
        for model, text in window.caption.items():
            joined.setdefault(model, []).append(text)
        for model, text in window.enhanced_caption.items():
            joined.setdefault(f"enhanced_{model}", []).append(text)
    return {model: " ".join(texts) for model, texts in joined.items()}


def _recaption(windows: list[_Window], captions: dict[str, str]) -> None:
    """The captions a Conveyor stage wrote since ``windows`` were made put on them (whole on
    the first window), so that they survive the way back (``_captions``)."""
    have = _captions(windows)
    for model, text in captions.items():
        if have.get(model) == text:
            continue
        enhanced = model.startswith("enhanced_")
        name = model.removeprefix("enhanced_")
        for index, window in enumerate(windows):
            target = window.enhanced_caption if enhanced else window.caption
            if index == 0:
                target[name] = text
            else:
                target.pop(name, None)


def _set(value: Any) -> bool:
    """Whether a field holds something (not ``None``, empty, zero or zero counts)."""
    if value is None:
        return False
    if isinstance(value, ClipStats):
        return value != ClipStats()
    if isinstance(value, (dict, list, tuple, bytes, int)):
        return bool(value)
    return True


def _new_video(video: Video) -> _Video:
    """A video a Curator-style stage made, as Conveyor's: named by its path (relative to
    the working directory where it lies under it), one chunk unless the stage said more."""
    path = video.input_path
    size, mtime = 0, 0.0
    if is_url(path):
        relative = path.split("://", 1)[1]
    else:
        absolute = os.path.abspath(path)
        here = os.getcwd()
        inside = os.path.commonpath([absolute, here]) == here
        relative = os.path.relpath(absolute, here) if inside else absolute.lstrip(os.sep)
        try:
            stat = os.stat(path)
            size, mtime = stat.st_size, stat.st_mtime
        except OSError:
            pass
    chunks = video.num_clip_chunks
    return _Video(
        path=path,
        relative_path=relative,
        metadata=_conveyor_metadata(video.metadata) if video.has_metadata() else None,
        chunk_index=video.clip_chunk_index,
        last_chunk=chunks <= 0 or video.clip_chunk_index >= chunks - 1,
        source_size=size or (video.metadata.size or 0),
        source_mtime=mtime,
    )


def _conveyor_metadata(meta: VideoMetadata) -> _VideoMetadata:
    return _VideoMetadata(
        duration_s=float(meta.duration or 0.0),
        fps=float(meta.framerate or 0.0),
        num_frames=int(meta.num_frames or 0),
        width=int(meta.width or 0),
        height=int(meta.height or 0),
        codec=str(meta.video_codec),
        pixel_format=meta.pixel_format,
        bit_rate=meta.bit_rate_k * 1000 if meta.bit_rate_k else None,
        audio_codec=meta.audio_codec,
        size_bytes=int(meta.size or 0),
    )
