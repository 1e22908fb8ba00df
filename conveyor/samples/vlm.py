"""A LLaVA vision-language model with random weights, saved with its processor, built
offline: what the captioner loads where no checkpoint may be downloaded.

Two sizes: ``tiny`` (a few thousand parameters, for tests of the real loading and
generating path) and ``2b`` (a CLIP ViT-L/14 at 336 pixels and a 28-layer language model of
hidden size 1,536: about 2.1 billion parameters, the architecture of a small production
captioner, for measuring what captioning costs on a GPU; random weights cost the same
compute). The tokenizer knows a few words only (the model's vocabulary is larger: the ids
it never emits are simply unused), and the special tokens' output weights are zero, so
every caption runs to ``max_new_tokens``.

LLaVA rather than Qwen2-VL: Qwen2-VL's processor insists on a video processor, which needs
torchvision; LLaVA's is a PIL image processor and a tokenizer, both assembled here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL = ["<unk>", "<pad>", "</s>", "<image>"]
WORDS = [
    *("USER:", "ASSISTANT:", "a", "the", "video", "clip", "cat", "dog", "runs", "sits", "on"),
    *("grass", "Describe", "this", "in", "one", "sentence.", "Say", "what", "happens"),
]
#: the LLaVA-1.5 prompt format, for a user message of images and text
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image> "
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %} "
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass(frozen=True)
class LlavaSize:
    """The dimensions of a LLaVA: its CLIP vision tower and its Llama-style language model."""

    image_size: int
    vision_hidden: int
    vision_intermediate: int
    vision_layers: int
    vision_heads: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    #: the model's vocabulary (its embedding and output matrices); the tokenizer knows fewer
    vocab_size: int
    max_positions: int
    dtype: str


PATCH = 14
SIZES = {
    "tiny": LlavaSize(28, 32, 64, 1, 4, 32, 64, 1, 4, 2, len(SPECIAL) + len(WORDS), 256, "float32"),
    # CLIP ViT-L/14-336 and a Qwen2-1.5B-shaped language model: 576 image tokens a frame
    "2b": LlavaSize(336, 1024, 4096, 24, 16, 1536, 8960, 28, 12, 2, 151_936, 8192, "bfloat16"),
}


def write_random_llava(directory: str | Path, size: str = "tiny", seed: int = 0) -> int:
    """Save a LLaVA of ``size`` (``SIZES``) with random weights and its processor in
    ``directory`` (``save_pretrained``); returns its number of parameters."""
    import torch
    from transformers import LlavaForConditionalGeneration

    dims = SIZES[size]
    torch.manual_seed(seed)
    # on a GPU where there is one: initialising two billion weights takes the CPUs minutes
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlavaForConditionalGeneration(llava_config(size)).to(getattr(torch, dims.dtype))
    with torch.no_grad():  # special tokens never win: every caption is max_new_tokens words
        model.lm_head.weight[: len(SPECIAL)] = 0.0
    model.save_pretrained(directory)
    llava_processor(size).save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def llava_processor(size: str = "tiny") -> Any:
    """The processor of a ``size`` LLaVA: a word-level tokenizer over ``WORDS`` with the
    chat template, and a CLIP image processor at the vision tower's size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlavaProcessor, PreTrainedTokenizerFast
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    backend = Tokenizer(models.WordLevel(_vocab(), unk_token="<unk>"))
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
    side = SIZES[size].image_size
    return LlavaProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": side}, crop_size={"height": side, "width": side}
        ),
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, dropped by "default"
        chat_template=CHAT_TEMPLATE,
    )


def llava_config(size: str = "tiny") -> Any:
    """The ``LlavaConfig`` of ``size``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    dims, vocab = SIZES[size], _vocab()
    return LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=dims.vision_hidden,
            intermediate_size=dims.vision_intermediate,
            num_hidden_layers=dims.vision_layers,
            num_attention_heads=dims.vision_heads,
            image_size=dims.image_size,
            patch_size=PATCH,
        ),
        text_config=LlamaConfig(
            vocab_size=dims.vocab_size,
            hidden_size=dims.text_hidden,
            intermediate_size=dims.text_intermediate,
            num_hidden_layers=dims.text_layers,
            num_attention_heads=dims.text_heads,
            num_key_value_heads=dims.text_kv_heads,
            max_position_embeddings=dims.max_positions,
            bos_token_id=None,
            eos_token_id=vocab["</s>"],
            pad_token_id=vocab["<pad>"],
        ),
        image_token_id=vocab["<image>"],
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )


def _vocab() -> dict[str, int]:
    return {word: i for i, word in enumerate(SPECIAL + WORDS)}
