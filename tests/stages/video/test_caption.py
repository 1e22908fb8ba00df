"""Captioner on a tiny randomly initialised LLaVA built offline, tokenizer included
(``conveyor.samples.vlm``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.samples.vlm import WORDS, write_random_llava
from conveyor.stages.video.caption import Captioner, sample_frames
from conveyor.tasks.video import Clip, Video, VideoTask

MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / "tiny-llava"
    write_random_llava(directory, "tiny")
    return directory


def make_clip(index: int, num_frames: int, height: int = 36, width: int = 48) -> Clip:
    rng = np.random.default_rng(index)
    clip = Clip(
        f"clip-{index}", "v.mp4", (float(index), index + 1.0), (index * 30, index * 30 + 30)
    )
    clip.frames[1.0] = rng.integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    return clip


def worker() -> WorkerInfo:
    return WorkerInfo("w", "Captioner", "n")


def test_captions_active_clips_in_one_batch(model_dir: Path) -> None:
    filtered = make_clip(2, 3)
    filtered.reject("motion")
    video = Video("/in/v.mp4", "v.mp4", clips=[make_clip(0, 6), make_clip(1, 2), filtered])
    stage = Captioner(str(model_dir), max_new_tokens=MAX_NEW_TOKENS)
    stage.setup(worker())
    assert stage.engine_in_use == "transformers"  # no vLLM, no GPU here
    calls = []
    generate = stage._model.generate
    stage._model.generate = lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw)

    out = stage.process(VideoTask(data=video))

    assert out.data is video
    assert calls == [2]  # both active clips went through generate together
    for clip in video.clips[:2]:
        caption = clip.captions["tiny-llava"]
        assert isinstance(caption, str) and caption
        assert set(caption.split()) <= set(WORDS)
        assert len(caption.split()) == MAX_NEW_TOKENS  # only new tokens, not the prompt
        assert not clip.errors
    assert filtered.captions == {}
    assert video.clips[0].frames  # kept for later stages unless release_frames is set
    stage.teardown()


def test_name_in_output_prompt_and_failed_clip(model_dir: Path) -> None:
    empty = make_clip(1, 0)
    video = Video("/in/v.mp4", "v.mp4", clips=[make_clip(0, 4), empty])
    stage = Captioner(
        str(model_dir), prompt="Say what happens", max_new_tokens=3, name_in_output="tiny"
    )
    stage.setup(worker())
    assert stage.prompt_for(2) == "USER: <image> <image> Say what happens ASSISTANT:"

    stage.process(VideoTask(data=video))

    assert list(video.clips[0].captions) == ["tiny"]
    assert len(video.clips[0].captions["tiny"].split()) == 3
    assert empty.captions == {}
    assert "no frames" in empty.errors["Captioner"]


def test_release_frames_clears_frames(model_dir: Path) -> None:
    filtered = make_clip(1, 2)
    filtered.filtered_by = "motion"  # frames left on it are released all the same
    video = Video("/in/v.mp4", "v.mp4", clips=[make_clip(0, 3), filtered])
    stage = Captioner(str(model_dir), frames_per_clip=2, max_new_tokens=2)
    stage.release_frames = True
    stage.setup(worker())

    stage.process(VideoTask(data=video))

    assert video.clips[0].captions["tiny-llava"]
    assert all(clip.frames == {} for clip in video.clips)


def test_missing_model_path_fails_at_construction(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        Captioner(str(missing))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_vllm_fails_in_setup(tmp_path: Path) -> None:
    stage = Captioner(str(tmp_path), engine="vllm")  # building needs only the path
    with pytest.raises(RuntimeError, match="vLLM is not installed"):
        stage.setup(worker())


def test_bad_settings_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine"):
        Captioner(str(tmp_path), engine="onnx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="frames_per_clip"):
        Captioner(str(tmp_path), frames_per_clip=0)


def test_sample_frames_spreads_over_the_clip() -> None:
    frames = np.arange(10)[:, None, None, None] * np.ones((1, 2, 2, 3), np.uint8)
    assert sample_frames(frames, 4)[:, 0, 0, 0].tolist() == [1, 3, 6, 8]
    assert sample_frames(frames[:3], 4)[:, 0, 0, 0].tolist() == [0, 1, 2]


def test_the_2b_sample_model_has_the_size_of_a_small_production_captioner() -> None:
    """What ``benchmarks/video_gpu.py`` captions with on a GPU: about two billion
    parameters and 576 image tokens a frame, counted without building its weights."""
    import torch
    from PIL import Image
    from transformers import LlavaForConditionalGeneration

    from conveyor.samples.vlm import llava_config, llava_processor

    with torch.device("meta"):
        model = LlavaForConditionalGeneration(llava_config("2b"))
    assert 1.9e9 < sum(p.numel() for p in model.parameters()) < 2.3e9
    processor = llava_processor("2b")
    inputs = processor(
        text=["USER: <image> Describe this ASSISTANT:"],
        images=[Image.new("RGB", (640, 360))],
        return_tensors="pt",
    )
    assert inputs["pixel_values"].shape[-2:] == (336, 336)
    assert (
        int((inputs["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<image>")).sum())
        == 576
    )
