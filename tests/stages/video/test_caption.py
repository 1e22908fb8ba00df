"""Captioner on a tiny randomly initialised LLaVA built offline (tokenizer included).

LLaVA rather than Qwen2-VL: Qwen2-VL's processor insists on a video processor, which needs
torchvision, and that is not installed here; LLaVA's processor is a PIL image processor and
a tokenizer, both of which can be assembled locally.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.stages.video.caption import Captioner, sample_frames
from conveyor.tasks.video import Clip, Video, VideoTask

SPECIAL = ["<unk>", "<pad>", "</s>", "<image>"]
WORDS = "USER: ASSISTANT: a the video clip cat dog runs sits on grass Describe this in one "
WORDS += "sentence. Say what happens"
#: the LLaVA-1.5 prompt format, for a user message of images and text
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image> "
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
MAX_NEW_TOKENS = 6


def build_tiny_llava(directory: Path) -> None:
    """Save a LLaVA of a few thousand parameters with its processor: a word-level tokenizer
    over a tiny vocabulary, a CLIP image processor at 28 x 28 (4 patches of 14: 4 image
    tokens per frame) and a chat template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    vocab = {word: i for i, word in enumerate(SPECIAL + WORDS.split())}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()  # joins words with spaces
    backend.add_special_tokens(SPECIAL)  # "<image><image>" must split into two tokens
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="</s>",
        chat_template=CHAT_TEMPLATE,
    )
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, dropped by "default"
        chat_template=CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            image_size=28,
            patch_size=14,
        ),
        text_config=LlamaConfig(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=None,
            eos_token_id=vocab["</s>"],
            pad_token_id=vocab["<pad>"],
        ),
        image_token_id=vocab["<image>"],
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # special tokens never win: every caption is max_new_tokens words
        model.lm_head.weight[: len(SPECIAL)] = 0.0
    model.save_pretrained(directory)
    processor.save_pretrained(directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / "tiny-llava"
    build_tiny_llava(directory)
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
        assert set(caption.split()) <= set(WORDS.split())
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
