"""Shared helpers for the video stage tests: synthetic media written once per session, clips
over frame spans, and stages set up in-process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.cluster import WorkerInfo
from conveyor.samples.video import Segment, SyntheticVideo, write_video
from conveyor.tasks.video import Clip, Video, VideoMetadata, VideoTask, clip_id

S = TypeVar("S")


class Media:
    """Synthetic videos written on first use and reused by every test of the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._videos: dict[tuple[Any, ...], SyntheticVideo] = {}
        self._metadata: dict[Path, VideoMetadata] = {}

    def video(self, name: str, segments: Sequence[Segment], **options: Any) -> SyntheticVideo:
        """``write_video(name, segments, **options)``, cached (each variant in its folder)."""
        key = (name, tuple(segments), tuple(sorted(options.items())))
        if key not in self._videos:
            folder = self.root / f"v{len(self._videos)}"
            self._videos[key] = write_video(folder / name, segments, **options)
        return self._videos[key]

    def metadata(self, path: str | Path) -> VideoMetadata:
        from conveyor.media.decode import probe

        path = Path(path)
        if path not in self._metadata:
            self._metadata[path] = probe(str(path))
        return self._metadata[path]

    @staticmethod
    def ready(stage: S) -> S:
        """``stage`` set up as one worker of its own (no GPU)."""
        stage.setup(WorkerInfo("w", stage.name, "n"))  # type: ignore[attr-defined]
        return stage

    @staticmethod
    def clips(relative: str, fps: float, spans: Sequence[tuple[int, int]]) -> list[Clip]:
        return [
            Clip(clip_id(relative, a, b), relative, (a / fps, b / fps), (a, b)) for a, b in spans
        ]

    @staticmethod
    def task(
        path: str | Path,
        metadata: VideoMetadata,
        spans: Sequence[tuple[int, int]] = (),
        relative: str | None = None,
        **fields: Any,
    ) -> VideoTask:
        """A task holding one chunk of ``path`` with clips over the frame ``spans``."""
        relative = relative or Path(path).name
        video = Video(
            str(path),
            relative,
            metadata=metadata,
            clips=Media.clips(relative, metadata.fps, spans),
            **fields,
        )
        return VideoTask(data=video, dataset_name="test")

    @staticmethod
    def run_frames(stage: Any, frame_sets: Sequence[Any], rate: float = 1.0) -> list[Clip]:
        """``stage`` run on one task whose clips (3 s each, one after another, at 12 fps) hold
        ``frame_sets`` as their frames at ``rate``; returns the clips."""
        clips = [
            Clip(f"c{i}", "v.mp4", (3.0 * i, 3.0 * i + 3), (36 * i, 36 * i + 36), frames={rate: f})
            for i, f in enumerate(frame_sets)
        ]
        task = VideoTask(data=Video("v.mp4", "v.mp4", clips=clips))
        stage.process(task)
        return task.data.clips

    def standard(self) -> SyntheticVideo:
        """The workhorse: 4 s at 160x120, 12 fps, a pan then moving shapes (48 frames)."""
        return self.video(
            "standard.mp4",
            [Segment("pan", 2.0, 1), Segment("shapes", 2.0, 2)],
            width=160,
            height=120,
            fps=12,
        )


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> Media:
    return Media(tmp_path_factory.mktemp("video-media"))


@pytest.fixture(scope="session")
def transcoded_standard(media: Media) -> tuple[SyntheticVideo, VideoTask]:
    """The standard video cut into four 1 s clips and encoded (the stages downstream of the
    transcoder read these; copy the clips before changing them)."""
    from conveyor.stages.video.transcode import ClipTranscoder

    source = media.standard()
    task = Media.task(
        source.path, media.metadata(source.path), [(0, 12), (12, 24), (24, 36), (36, 48)]
    )
    list(Media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast")).process(task))
    assert all(clip.encoded for clip in task.data.clips)
    return source, task


def pattern_frames() -> list[Any]:
    """Three clips' frames (1 per second, short side 224) of different patterns."""
    import numpy as np

    from conveyor.samples.video import render_frames

    out = []
    for kind, seed in (("pan", 1), ("shapes", 2), ("rings", 3)):
        rendered = list(render_frames([Segment(kind, 3.0, seed)], 298, 224, 12))
        out.append(np.stack([rendered[6 + 12 * k] for k in range(3)]))
    return out


def tiny_clip_config(projection_dim: int, patch_size: int = 8) -> Any:
    """A randomly initialised CLIP small enough to build in a test (32 x 32 images)."""
    from transformers import CLIPConfig

    return CLIPConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": 64,
            "max_position_embeddings": 16,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": patch_size,
        },
        projection_dim=projection_dim,
    )


def save_clip_processor(directory: Path) -> None:
    """The image processor of ``tiny_clip_config`` (the PIL one: no torchvision here)."""
    try:
        from transformers.models.clip.image_processing_pil_clip import (
            CLIPImageProcessorPil as Processor,
        )
    except ImportError:  # older transformers
        from transformers import CLIPImageProcessor as Processor

    Processor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        directory
    )


def save_letter_tokenizer(directory: Path) -> None:
    """A CLIP tokenizer over single letters (no merges: a word is its letters), within the
    tiny model's 64 tokens."""
    import json
    import shutil
    import string

    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in string.ascii_lowercase:
        vocab[letter] = len(vocab)
        vocab[letter + "</w>"] = len(vocab)
    source = directory / "letters"
    source.mkdir()
    (source / "vocab.json").write_text(json.dumps(vocab))
    (source / "merges.txt").write_text("#version: 0.2\n")
    CLIPTokenizer(str(source / "vocab.json"), str(source / "merges.txt")).save_pretrained(directory)
    shutil.rmtree(source)


def save_whole_clip(directory: Path, max_positions: int = 48) -> Path:
    """A whole random ``CLIPModel`` (both towers) in ``directory`` with its tokenizer and
    image processor, as ``save_pretrained`` leaves a real one; texts up to
    ``max_positions`` tokens (letters)."""
    import torch
    from transformers import CLIPModel

    config = tiny_clip_config(8)
    config.text_config.max_position_embeddings = max_positions
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(directory)
    save_clip_processor(directory)
    save_letter_tokenizer(directory)
    return directory


#: (file name, container, codec) of the interlaced sources users have: AVCHD camcorders
#: (H.264 fields in MPEG-TS), broadcast captures and DVDs (MPEG-2 in TS and PS)
INTERLACED_SOURCES = [
    ("camcorder.mts", "mpegts", "libx264"),
    ("tv.ts", "mpegts", "mpeg2video"),
    ("dvd.mpg", "mpeg", "mpeg2video"),
]


def write_interlaced(path: Path, fmt: str, codec: str, frames: int = 50) -> Path:
    """An interlaced recording at 25 fps, 160x120, as a camcorder or a broadcast stores it:
    each frame's two fields were taken 1/50 s apart, so a white bar moving right sits 4 px
    further on the bottom field's lines than on the top field's (comb teeth when shown as
    a frame). ``codec``: ``libx264`` (coded as fields) or ``mpeg2video``."""
    import av
    import numpy as np

    options = {"libx264": {"x264-params": "interlaced=1:tff=1", "preset": "ultrafast"}}
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.options = options.get(codec, {"flags": "+ildct+ilme", "b": "2M"})
        for i in range(frames):
            image = np.full((120, 160, 3), 40, np.uint8)
            for parity, half in ((0, 0.0), (1, 0.5)):
                x = int((i + half) * 8) % 120
                image[parity::2, x : x + 24] = 230
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def combing(gray: Any) -> float:
    """How much a frame's neighbouring lines differ beyond lines two apart (grey levels):
    about 0 for a whole frame, large where the two fields of a moving picture disagree."""
    import numpy as np

    rows = gray.astype(np.float32)
    return float(np.abs(rows[1:] - rows[:-1]).mean() - np.abs(rows[2:] - rows[:-2]).mean())
