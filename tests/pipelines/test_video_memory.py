"""Memory does not grow with a video's length: shot detection works on windows and clips
travel in chunks, so a video ten times longer leaves every worker's peak memory where it was.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.pipelines.video import VideoConfig, run_video
from conveyor.samples.video import Segment, write_video

pytestmark = pytest.mark.slow


class PeakRss:
    """Samples the resident memory of every process under this one while a run lasts."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        # processes already there are another test's (a Ray cluster the same test worker
        # started: its 1.4 GB process was taken for the run's peak), as are theirs; taken
        # here, not in the thread, which a loaded machine can start after the run's own
        self._before: set[int] = set()

    def _sample(self) -> None:
        me = psutil.Process()
        before = self._before
        while not self._stop.is_set():
            for proc in me.children(recursive=True):
                try:
                    if proc.pid in before or any(p.pid in before for p in proc.parents()):
                        continue
                    name = " ".join(proc.cmdline()[-1:]) or str(proc.pid)
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                key = f"{proc.pid}:{name}"
                self.peak[key] = max(self.peak.get(key, 0), rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def largest(self) -> int:
        assert self.peak, "no process of the run was sampled"
        return max(self.peak.values())

    @property
    def heaviest(self) -> str:
        """The process of the largest peak, as ``pid:command``, to say which one grew."""
        return max(self.peak, key=self.peak.__getitem__)


def long_video(path: Path, minutes: float) -> None:
    kinds = ["pan", "shapes", "rings", "checker", "plasma"]
    segments = [Segment(kinds[seed % len(kinds)], 20.0, seed) for seed in range(int(minutes * 3))]
    write_video(path, segments, width=64, height=48, fps=10)


def peak_for(tmp_path: Path, minutes: float) -> tuple[int, int, str]:
    source = tmp_path / f"in-{minutes}"
    long_video(source / "long.mp4", minutes)
    config = VideoConfig(
        str(source),
        str(tmp_path / f"out-{minutes}"),
        detector="histogram",
        quality=False,
        embed=False,
        tags=False,
    )
    with PeakRss() as rss:
        report = run_video(config, StreamingExecutor(LocalBackend(num_cpus=2)))
    assert report.result.completed
    return rss.largest, report.summary["clips"]["made"], rss.heaviest


def test_a_ten_times_longer_video_needs_no_more_memory_per_worker(tmp_path: Path) -> None:
    short, short_clips, _ = peak_for(tmp_path, 1.0)
    long, long_clips, heaviest = peak_for(tmp_path, 10.0)
    assert long_clips >= 9 * short_clips  # the long one really was processed in full
    # the same code, windows and chunks: the peak may move by noise, not by the length
    assert long < short * 1.25 + 16 * 2**20, (short / 2**20, long / 2**20, heaviest)
