"""The pipelines' configs refuse, by name, values their fields cannot take from a script: the
command line refuses them before they reach a config (``CheckedCommand``), a script did not."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from conveyor.dedup import semantic_dedup
from conveyor.pipelines.image_config import ImageConfig
from conveyor.pipelines.text_config import TextConfig
from conveyor.pipelines.video_config import VideoConfig

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("config", "changes", "message"),
    [
        # a bool where a number goes: limit=True meant one video
        (VideoConfig, {"limit": True}, "limit must be a whole number, got True"),
        # a switch given anything else: dedup="no" turned dedup on, gpus=-1 used the GPUs
        (VideoConfig, {"dedup": "no"}, "dedup must be True or False, got 'no'"),
        (VideoConfig, {"gpus": -1}, "gpus must be True or False, got -1"),
        # text where a number goes: "'<=' not supported between int and str"
        (VideoConfig, {"crf": "5"}, "crf must be a whole number, got '5'"),
        # not finite: NaN was recorded, and NaN != NaN refused every resume after
        (VideoConfig, {"aesthetic_threshold": NAN}, "aesthetic_threshold must be a finite"),
        (VideoConfig, {"clip_len_s": INF}, "clip_len_s must be a finite number, got inf"),
        (VideoConfig, {"clips_per_chunk": 1.5}, "clips_per_chunk must be a whole number"),
        (VideoConfig, {"limit": 10**20}, "limit must be at most 2**62"),
        (ImageConfig, {"limit": NAN}, "limit must be a whole number, got nan"),
        (ImageConfig, {"nsfw": "5"}, "nsfw must be True or False, got '5'"),
        (ImageConfig, {"max_aspect": INF}, "max_aspect must be a finite number, got inf"),
        (TextConfig, {"min_words": NAN}, "min_words must be a whole number, got nan"),
        (TextConfig, {"langid": "yes"}, "langid must be True or False, got 'yes'"),
        (TextConfig, {"dedup_partitions": 10**20}, "dedup_partitions must be in 1..4096"),
        # an empty path was the current folder, read or written into
        (VideoConfig, {"output": ""}, "output must not be empty"),
        (VideoConfig, {"input": ""}, "input must not be empty"),
        (VideoConfig, {"input": None}, "input must be a path or a list of paths, got None"),
        (VideoConfig, {"output": 0}, "output must be a path, got 0"),
        # an empty model path was the current folder's (Path("").exists())
        (VideoConfig, {"aesthetic_model": ""}, "aesthetic_model must not be empty"),
        (VideoConfig, {"embed_model": ""}, "embed_model must be a path or efficientnet-lite0"),
        (ImageConfig, {"embed_model": None}, "embed_model must be a path, got None"),
        (ImageConfig, {"aesthetic_model": ""}, "aesthetic_model must not be empty"),
    ],
)
def test_a_value_its_field_cannot_take_is_refused_by_name(
    tmp_path: Path, config: type, changes: dict, message: str
) -> None:
    given = {"input": str(tmp_path), "output": str(tmp_path / "out"), **changes}
    with pytest.raises(ValueError) as error:
        config(**given)
    assert message in str(error.value)


def test_good_values_of_other_types_stay_good(tmp_path: Path) -> None:
    config = VideoConfig(str(tmp_path), str(tmp_path / "o"), clip_len_s=3, limit=2, gpus=None)
    assert config.clip_len_s == 3 and config.limit == 2


def test_video_paths_are_absolute_and_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative ``~/out`` was made as a folder named ``~``, and a ``Path`` input failed
    the summary after the whole run."""
    monkeypatch.chdir(tmp_path)
    config = VideoConfig(Path("in"), "~/out")
    assert config.input == str(tmp_path / "in")
    assert config.output == os.path.expanduser("~/out")
    both = VideoConfig([Path("a"), "b"], "o")
    assert both.input == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert both.output == str(tmp_path / "o")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_clusters": 1.5}, "n_clusters must be a whole number"),
        ({"seed": -1}, "seed must be a whole number in 0..2**31-1, got -1"),
        ({"partition_rows": NAN}, "partition_rows must be a whole number"),
        ({"chunk_rows": True}, "chunk_rows must be a whole number"),
        ({"threshold": True}, "threshold must be a number, got True"),
        ({"output": ""}, "output must not be empty"),
        ({"inputs": []}, "inputs must name at least one"),
        ({"inputs": ""}, "inputs must name at least one"),
    ],
)
def test_semantic_dedup_refuses_by_name_before_any_pass(
    tmp_path: Path, changes: dict, message: str
) -> None:
    """They failed in a worker (``n_clusters=1.5``, ``seed=-1``) or ran as they were (NaN
    rows per chunk, recorded in dedup.json as NaN, which is not JSON)."""
    given = {"inputs": str(tmp_path), "output": str(tmp_path / "out"), **changes}
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace(".", r"\.")):
        semantic_dedup(**given)
    assert not (tmp_path / "out").exists()


def test_a_bad_option_only_a_stage_refuses_is_not_recorded_as_the_output_s(
    tmp_path: Path,
) -> None:
    """``encoder="bogus"`` was written into ``.conveyor/config.json`` before the build
    refused it: every later run into that output was refused for "other options"."""
    from conveyor.pipelines.video import run_video

    (tmp_path / "in").mkdir()
    config = VideoConfig(str(tmp_path / "in"), str(tmp_path / "out"), encoder="bogus")
    with pytest.raises(ValueError, match="encoder must be one of"):
        run_video(config)
    recorded = tmp_path / "out" / ".conveyor" / "config.json"
    assert not recorded.exists() or json.loads(recorded.read_text()).get("encoder") != "bogus"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("MotionFilter(global_threshold=INF)", "global_threshold must be a finite number"),
        ("MotionFilter(patch_threshold=-1)", "patch_threshold must be >= 0, got -1"),
        ("MotionFilter(patch=NAN)", "patch must be >= 16 pixels"),
        ("FixedStrideSplitter(clip_len_s=INF)", "clip_len_s must be a finite number"),
        ("FixedStrideSplitter(min_clip_s=INF)", "min_clip_s must be a finite number"),
        ("FixedStrideSplitter(clips_per_chunk=1.5)", "clips_per_chunk must be a whole number"),
        ("QualityFilter(frame_rate=INF)", "frame_rate must be a finite number, got inf"),
        ("QualityFilter(blank_std=INF)", "blank_std must be a finite number"),
        ("NSFWFilter(frame_rate=NAN)", "frame_rate must be a finite number, got nan"),
        ("OverlayTextFilter(short_side=INF)", "short_side must be a whole number"),
    ],
)
def test_video_stages_built_by_hand_refuse_numbers_that_are_not_finite(
    make: str, message: str
) -> None:
    """They failed every clip ("cannot convert float NaN to integer") or filtered nothing."""
    from conveyor.stages.video.motion import MotionFilter
    from conveyor.stages.video.nsfw import NSFWFilter
    from conveyor.stages.video.overlay_text import OverlayTextFilter
    from conveyor.stages.video.quality import QualityFilter
    from conveyor.stages.video.split import FixedStrideSplitter

    names = {
        "MotionFilter": MotionFilter, "NSFWFilter": NSFWFilter, "QualityFilter": QualityFilter,
        "OverlayTextFilter": OverlayTextFilter, "FixedStrideSplitter": FixedStrideSplitter,
        "INF": INF, "NAN": NAN,
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        eval(make, names)
