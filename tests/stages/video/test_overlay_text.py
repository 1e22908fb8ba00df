"""The overlay-text filter with PP-OCRv4's packaged text detector: burnt-in captions are
filtered, the same clips without them kept; the score is the covered fraction of a frame
(boxes counted once), its largest and mean over the clip; score-only records; a clip without
frames fails alone; the pipeline and ``conveyor video --overlay-text`` use it."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conveyor.cluster import WorkerInfo
from conveyor.pipelines.video import VideoConfig, build_video_pipeline, describe
from conveyor.resources import Resources
from conveyor.samples.video import Segment, render_frames
from conveyor.stages.video import overlay_text
from conveyor.stages.video.nsfw import choose_providers
from conveyor.stages.video.overlay_text import (
    DETECTION_MODEL,
    OverlayTextFilter,
    covered_fraction,
    packaged_model_path,
)
from conveyor.tasks.video import Clip, Video, VideoTask

from .conftest import Media

RATE = 1.0
#: the transcoder's model frames of a 16:9 source: 224 pixels on the short side
WIDTH, HEIGHT = 398, 224
KINDS = ("pan", "shapes", "plasma", "rings", "bars", "checker", "noise", "gradient")


def caption(frame: np.ndarray, text: str = "Burnt-in subtitles") -> np.ndarray:
    """``frame`` with a large white caption (black outline) near the bottom, as broadcasters
    and subtitlers burn them in."""
    import cv2

    out = frame.copy()
    height, width = out.shape[:2]
    scale = width / 400
    (tw, _), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 2)
    org = ((width - tw) // 2, height - height // 10)
    for colour, thickness in (((0, 0, 0), 5), ((255, 255, 255), 2)):
        cv2.putText(out, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, thickness, cv2.LINE_AA)
    return out


def pattern(kind: str, seconds: int = 2, seed: int = 3) -> np.ndarray:
    """One frame per second of a pattern at the models' size."""
    frames = list(render_frames([Segment(kind, float(seconds), seed)], WIDTH, HEIGHT, 4))
    return np.stack([frames[2 + 4 * k] for k in range(seconds)])


@pytest.fixture(scope="module")
def plain() -> dict[str, np.ndarray]:
    return {kind: pattern(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def captioned(plain: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {kind: np.stack([caption(f) for f in frames]) for kind, frames in plain.items()}


@pytest.fixture(scope="module")
def stage() -> OverlayTextFilter:
    """The default filter, its model loaded once for the module."""
    return Media.ready(OverlayTextFilter())


def run(stage: OverlayTextFilter, frame_sets: list[np.ndarray]) -> list[Clip]:
    clips = [
        Clip(f"c{i}", "v.mp4", (i * 2.0, i * 2.0 + 2.0), (i * 24, i * 24 + 24), frames={RATE: f})
        for i, f in enumerate(frame_sets)
    ]
    task = VideoTask(data=Video("v.mp4", "v.mp4", clips=clips))
    stage.process(task)
    return task.data.clips


def test_burnt_in_captions_are_filtered_and_the_same_clips_without_are_kept(
    stage: OverlayTextFilter, plain: dict[str, np.ndarray], captioned: dict[str, np.ndarray]
) -> None:
    clips = run(stage, [*plain.values(), *captioned.values()])
    for kind, clip in zip(KINDS, clips[: len(KINDS)], strict=True):
        assert clip.scores["overlay_text"] <= 0.005, kind
        assert clip.filtered_by is None and not clip.errors, kind
    for kind, clip in zip(KINDS, clips[len(KINDS) :], strict=True):
        # the caption's box is about 6 % of the frame
        assert 0.03 < clip.scores["overlay_text"] < 0.15, (kind, clip.scores)
        assert clip.filtered_by == "overlay_text" and clip.frames == {}, kind
    for clip in clips:
        assert 0.0 <= clip.scores["overlay_text_mean"] <= clip.scores["overlay_text"] <= 1.0


def test_the_clip_scores_are_the_largest_and_the_mean_frame_fraction(
    stage: OverlayTextFilter, plain: dict[str, np.ndarray], captioned: dict[str, np.ndarray]
) -> None:
    import cv2

    # a caption on one of the clip's two frames: the largest fraction filters it
    mixed = np.stack([plain["pan"][0], captioned["pan"][1]])
    fractions = stage.text_fractions(list(mixed))
    assert fractions[0] <= 0.005 < 0.03 < fractions[1]
    (clip,) = run(stage, [mixed])
    assert clip.scores["overlay_text"] == pytest.approx(fractions.max())
    assert clip.scores["overlay_text_mean"] == pytest.approx(fractions.mean())
    assert clip.filtered_by == "overlay_text"
    # a page of text (a title card, a slide) covers most of the frame
    page = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    for row in range(7):
        text = f"Words over words, line {row}"
        cv2.putText(page, text, (6, 26 + row * 31), cv2.FONT_HERSHEY_SIMPLEX, 0.95, (255,) * 3, 2)
    assert 0.4 < stage.text_fractions([page])[0] <= 1.0


def test_overlapping_boxes_are_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    probabilities = np.zeros((224, 384), np.float32)
    box = np.array([[40, 100], [200, 100], [200, 140], [40, 140]], np.float32)
    monkeypatch.setattr(overlay_text, "text_boxes", lambda _: [box])
    once = covered_fraction(probabilities)
    assert once == pytest.approx(161 * 41 / (224 * 384))
    monkeypatch.setattr(overlay_text, "text_boxes", lambda _: [box, box, box + np.float32([80, 0])])
    assert covered_fraction(probabilities) == pytest.approx(241 * 41 / (224 * 384))
    monkeypatch.undo()
    # a text region the network marks: its box, grown as DBNet's unclip grows it
    probabilities[100:120, 50:250] = 0.9
    (found,) = overlay_text.text_boxes(probabilities)
    width, height = np.ptp(found, axis=0)
    assert 200 < width < 240 and 20 < height < 60
    assert 0 < covered_fraction(probabilities) < 0.2


def test_score_only_keeps_captioned_clips_and_scores_them(
    captioned: dict[str, np.ndarray],
) -> None:
    lenient = Media.ready(OverlayTextFilter(score_only=True))
    clips = run(lenient, [captioned["noise"], captioned["plasma"]])
    assert all(clip.filtered_by is None and clip.scores["overlay_text"] > 0.03 for clip in clips)


def test_the_threshold_is_a_strict_upper_bound(
    plain: dict[str, np.ndarray], captioned: dict[str, np.ndarray]
) -> None:
    any_text = Media.ready(OverlayTextFilter(threshold=0.0))
    clean, text = run(any_text, [plain["rings"], captioned["rings"]])
    assert clean.filtered_by is None and text.filtered_by == "overlay_text"
    never = Media.ready(OverlayTextFilter(threshold=1.0))
    assert all(c.filtered_by is None for c in run(never, [captioned["bars"]]))


def test_a_clip_without_frames_fails_alone(
    stage: OverlayTextFilter, captioned: dict[str, np.ndarray]
) -> None:
    empty, texted = run(stage, [np.zeros((0, HEIGHT, WIDTH, 3), np.uint8), captioned["shapes"]])
    assert "no frames" in empty.errors["OverlayTextFilter"] and "overlay_text" not in empty.scores
    assert texted.filtered_by == "overlay_text" and not texted.errors


def test_the_packaged_detection_model_runs_on_the_cpu_with_the_stage_threads() -> None:
    path = Path(packaged_model_path())
    assert path.name == DETECTION_MODEL and path.parent.parent.name == "rapidocr_onnxruntime"
    stage = OverlayTextFilter().with_(resources=Resources(cpus=2))
    assert isinstance(stage, OverlayTextFilter)
    stage.setup(WorkerInfo("w", "s", "n"))
    assert stage.providers == ["CPUExecutionProvider"]
    assert stage._detector is not None
    session = stage._detector.session
    assert session.get_session_options().intra_op_num_threads == 2
    assert session.get_providers() == ["CPUExecutionProvider"]
    gpu = choose_providers(WorkerInfo("w", "s", "n", gpu_ids=(0,)))
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        assert gpu[0] == "CUDAExecutionProvider"
    else:
        assert gpu == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("threshold", 1.5), ("threshold", -0.1), ("frame_rate", 0.0), ("short_side", 16)],
)
def test_settings_are_validated(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=setting):
        OverlayTextFilter(**{setting: value})


def test_the_config_validates_and_the_pipeline_wires_the_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad in (1.5, -0.01):
        with pytest.raises(ValueError, match=r"overlay_text_threshold must be in \[0, 1\]"):
            VideoConfig("in", "out", overlay_text=True, overlay_text_threshold=bad)
    with pytest.raises(ValueError, match="overlay_text_threshold must be a finite number"):
        VideoConfig("in", "out", overlay_text=True, overlay_text_threshold=float("nan"))
    default = VideoConfig(str(tmp_path), "o")
    assert not default.overlay_text
    assert "OverlayTextFilter" not in [s.name for s in build_video_pipeline(default).build()]
    config = VideoConfig(
        str(tmp_path), "o", splitter="fixed", overlay_text=True, overlay_text_threshold=0.1
    )
    specs = {s.name: s for s in build_video_pipeline(config).build()}
    text = specs["OverlayTextFilter"].stage
    assert text.threshold == 0.1 and not text.score_only
    assert specs["OverlayTextFilter"].resources.cpus == 1
    assert text.frame_rate in specs["ClipTranscoder"].stage.frame_rates
    assert "overlay_text" in describe(config) and "overlay_text" not in describe(default)
    assert config.fingerprint()["overlay_text_threshold"] == 0.1
    scoring = VideoConfig(str(tmp_path), "o", overlay_text=True, score_only=True)
    assert next(
        s.stage for s in build_video_pipeline(scoring).build() if s.name == "OverlayTextFilter"
    ).score_only
    # without the package that holds the model: a clear error before anything runs
    monkeypatch.setattr(overlay_text, "PACKAGE", "no_such_package_here")
    with pytest.raises(ValueError, match="needs the rapidocr-onnxruntime package"):
        VideoConfig(str(tmp_path), "o", overlay_text=True)
    VideoConfig(str(tmp_path), "o")  # only asked for when the filter is on


def write_captioned(path: Path, kind: str, text: str | None, seconds: int = 4) -> None:
    """A small H.264 video of a pattern, with ``text`` burnt into every frame."""
    import av

    fps = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = WIDTH + 2, HEIGHT, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "20"}
        frames = render_frames([Segment(kind, float(seconds), 5)], WIDTH + 2, HEIGHT, fps)
        for index, image in enumerate(frames):
            image = caption(image, text) if text else image
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_the_command_filters_clips_with_burnt_in_captions(tmp_path: Path) -> None:
    from conveyor.cli import app

    inputs = tmp_path / "in"
    write_captioned(inputs / "subtitled.mp4", "pan", "Subtitles burnt into the picture")
    write_captioned(inputs / "clean.mp4", "pan", None)
    output = tmp_path / "out"
    base = ["video", str(inputs), str(output), "--splitter", "fixed", "--clip-len", "2"]
    fast = ["--no-embed", "--no-tags", "--no-quality", "--no-motion", "--no-live", "--no-report"]
    runner = CliRunner()
    result = runner.invoke(app, [*base, *fast, "--overlay-text", "--cpus", "2"])
    assert result.exit_code == 0, result.output
    assert "filtered by overlay_text" in result.output
    metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
    by_video: dict[str, list[dict[str, object]]] = {}
    for meta in metas:
        by_video.setdefault(str(meta["source_video"]), []).append(meta)
    subtitled, clean = by_video["subtitled.mp4"], by_video["clean.mp4"]
    assert len(subtitled) == len(clean) == 2
    for meta in subtitled:
        scores = meta["scores"]
        assert isinstance(scores, dict) and scores["overlay_text"] > 0.02
        assert meta["filtered_by"] == "overlay_text"
    for meta in clean:
        scores = meta["scores"]
        assert isinstance(scores, dict) and 0.0 <= scores["overlay_text"] <= 0.005
        assert meta["filtered_by"] is None
    summary = json.loads((output / "summary.json").read_text())
    assert summary["clips"]["filtered"] == {"overlay_text": 2}
    assert "filtered by overlay_text" in summary["pipeline"]
    # a threshold above the caption's share of the frame keeps every clip, scored
    lenient = [str(inputs), str(tmp_path / "lenient"), *base[3:], *fast]
    again = runner.invoke(
        app, ["video", *lenient, "--overlay-text", "--overlay-text-threshold", "0.5"]
    )
    assert again.exit_code == 0, again.output
    metas = [json.loads(p.read_text()) for p in (tmp_path / "lenient" / "metas").glob("*.json")]
    assert len(metas) == 4 and all(m["filtered_by"] is None for m in metas)
    assert sorted(m["scores"]["overlay_text"] > 0.02 for m in metas) == [False] * 2 + [True] * 2
    bad = runner.invoke(app, [*base, *fast, "--overlay-text-threshold", "1.5"])
    assert bad.exit_code == 2 and "overlay-text-threshold" in bad.output
