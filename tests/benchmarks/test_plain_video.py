"""The plain-script contender of ``benchmarks/video.py --user``: its clips are cut where
``conveyor video --splitter fixed`` cuts them (it shares no code with Conveyor, so the rule
is checked here against ``fixed_stride_spans``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conveyor.stages.video.split import fixed_stride_spans

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "plain_video.py"


@pytest.fixture(scope="module")
def plain() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_plain_video", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fps", [12, 24, 24000 / 1001, 25, 30000 / 1001, 30, 50, 60])
@pytest.mark.parametrize("clip_len_s", [10.0, 2.5, 1 / 3])
def test_plain_script_cuts_where_the_fixed_splitter_does(
    plain: ModuleType, fps: float, clip_len_s: float
) -> None:
    min_clip_s = min(2.0, clip_len_s)
    for num_frames in [*range(0, 130), 299, 300, 301, 359, 360, 361, 1799, 1800, 1801, 17983]:
        ours = fixed_stride_spans(num_frames, fps, clip_len_s, clip_len_s, min_clip_s)
        assert plain.spans(num_frames, fps, clip_len_s, min_clip_s) == ours, num_frames


def test_plain_script_boundaries(plain: ModuleType) -> None:
    # 10 s at 30 fps; the last clip ends with the video, dropped under 2 s (60 frames)
    assert plain.spans(630, 30, 10, 2) == [(0, 300), (300, 600)]
    assert plain.spans(660, 30, 10, 2) == [(0, 300), (300, 600), (600, 660)]
    assert plain.spans(59, 30, 10, 2) == []
    # 29.97 fps: the frame nearest each multiple of 10 s (299.7 -> 300, 599.4 -> 599)
    assert plain.spans(900, 30000 / 1001, 10, 2) == [(0, 300), (300, 599), (599, 899)]
