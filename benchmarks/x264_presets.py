"""What each libx264 preset costs the CPUs and gives in size and quality, one run.

On a GPU without NVENC (A100, H100, H200) the transcoder encodes on the CPUs, and libx264 is
most of the shots pipeline's CPU time there: ``veryfast`` (the default) took 1,956 of its
3,608 CPU seconds per video-hour on the H200 machine (docs/measurements/
2026-11-26-video-gpu-h200.md). ``conveyor video --preset`` trades that time for bytes and
quality; this measures the trade on this machine, on one thread as the transcoder encodes a
clip, over the first ``--frames`` frames of two 720p30 sources:

- ``generated``: the benchmarks' generated timeline (gradients and moving shapes, encoded
  with x264 ``medium``), which x264 finds easy;
- ``grain``: the same frames with Gaussian noise of ``--grain`` grey levels added to every
  pixel, as a camera's sensor adds it (what makes real footage expensive), encoded with
  x264 ``medium`` at CRF 23 as an upload is, and decoded again.

Every preset is run at one CRF (``--crf``, 23). CRF does not mean the same quality from
preset to preset (the faster presets leave out the analysis that decides where bits go), so
the presets faster than ``veryfast`` are also run at the highest CRF at which they still
reach ``veryfast``'s PSNR: the fewest bits for its quality.

Every preset encodes the same frames (decoded once, before timing), alternating, median of
``--repeats``. For each: CPU seconds per video-hour, the bitrate, PSNR of the luma against
the frames given to the encoder, and each against ``veryfast``. Prints; asserts nothing.

    .venv/bin/python benchmarks/x264_presets.py
    .venv/bin/python benchmarks/x264_presets.py --frames 150 --repeats 1 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import fmt, table
from nvdec_paths import one_thread_x264, source

from conveyor.stages.video.transcode import X264_PRESETS

#: libx264's presets from fastest, as far as anyone encodes clips for training
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
BASELINE = "veryfast"


def frames_of(path: Path | bytes, count: int) -> tuple[list[Any], Any]:
    """The first ``count`` frames of a video (a file, or its bytes) as yuv420p, and its
    frame rate."""
    import av

    with av.open(str(path) if isinstance(path, Path) else io.BytesIO(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or 30
        frames = [
            frame.reformat(format="yuv420p")
            for _, frame in zip(range(count), container.decode(stream), strict=False)
        ]
    return frames, rate


def with_grain(frames: list[Any], rate: Any, grain: float, seed: int = 0) -> bytes:
    """``frames`` with Gaussian noise of ``grain`` grey levels added to each plane, encoded
    as an upload is (x264 ``medium``, CRF 23, every core)."""
    rng = np.random.default_rng(seed)
    noisy = []
    for frame in frames:
        planes = frame.to_ndarray() + rng.normal(0, grain, (frame.height * 3 // 2, frame.width))
        noisy.append(
            type(frame).from_ndarray(np.clip(planes, 0, 255).astype(np.uint8), format="yuv420p")
        )
    return encode(noisy, rate, "medium", 23, threads=0)[1]


def encode(
    frames: list[Any], rate: Any, preset: str, crf: int, threads: int = 1
) -> tuple[float, bytes]:
    """CPU seconds libx264 took over ``frames`` (one thread: this one's), and the MP4."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        size = (frames[0].width, frames[0].height)
        encoder, step = one_thread_x264(out, rate, size, preset=preset, crf=crf)
        encoder.codec_context.thread_count = threads
        began = time.thread_time()
        for index, frame in enumerate(frames):
            frame.pts, frame.time_base = index, step
            frame.pict_type = 0  # the encoder's own frame types, as the transcoder asks
            out.mux(encoder.encode(frame))
        out.mux(encoder.encode(None))
        spent = time.thread_time() - began
    return spent, buffer.getvalue()


def luma_psnr(encoded: bytes, frames: list[Any]) -> float:
    """PSNR (dB) of the encoded luma against the frames given to the encoder, over all
    frames' pixels."""
    import av

    squared, pixels = 0.0, 0
    with av.open(io.BytesIO(encoded)) as container:
        decoded = container.decode(container.streams.video[0])
        for original, frame in zip(frames, decoded, strict=True):
            height = original.height
            a = original.to_ndarray()[:height].astype(np.int32)
            b = frame.reformat(format="yuv420p").to_ndarray()[:height].astype(np.int32)
            squared += float(np.square(a - b).sum())
            pixels += a.size
    mse = squared / pixels
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def measure(
    frames: list[Any], rate: Any, settings: list[tuple[str, int]], repeats: int
) -> dict[str, dict[str, Any]]:
    """Per setting (preset, CRF), by ``preset@crf``: the CPU seconds per video-hour of each
    run (the settings alternating), the bitrate and the luma PSNR."""
    seconds = len(frames) / float(rate)
    runs: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
    made: dict[tuple[str, int], bytes] = {}
    for _ in range(repeats):
        for setting in settings:
            spent, made[setting] = encode(frames, rate, *setting)
            runs[setting].append(spent * 3600 / seconds)
    return {
        f"{preset}@{crf}": {
            "preset": preset,
            "crf": crf,
            "cpu_s_per_video_hour": runs[preset, crf],
            "median_cpu_s_per_video_hour": statistics.median(runs[preset, crf]),
            "mbit_per_s": len(made[preset, crf]) * 8 / seconds / 1e6,
            "psnr_y_db": luma_psnr(made[preset, crf], frames),
        }
        for preset, crf in settings
    }


def same_quality_crf(frames: list[Any], rate: Any, preset: str, psnr: float) -> int:
    """The highest CRF at which ``preset`` still reaches ``psnr`` (the fewest bits for that
    quality; PSNR falls as CRF rises), 0 if none does."""
    low, high = 0, 51
    while low < high:
        middle = (low + high + 1) // 2
        if luma_psnr(encode(frames, rate, preset, middle)[1], frames) >= psnr:
            low = middle
        else:
            high = middle - 1
    return low


def print_table(title: str, found: dict[str, dict[str, Any]], base: dict[str, Any]) -> None:
    rows = [
        [
            key,
            fmt(f["median_cpu_s_per_video_hour"]),
            fmt(f["median_cpu_s_per_video_hour"] / base["median_cpu_s_per_video_hour"]),
            fmt(f["mbit_per_s"]),
            fmt(f["mbit_per_s"] / base["mbit_per_s"]),
            fmt(f["psnr_y_db"]),
            fmt(f["psnr_y_db"] - base["psnr_y_db"]),
        ]
        for key, f in found.items()
    ]
    header = [
        "preset@CRF", "CPU-s/video-h", "x baseline", "Mb/s", "x baseline", "PSNR-Y dB", "dB vs it"
    ]  # fmt: skip
    print(table(title, header, rows))
    print()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300, help="frames of each source")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--crf", type=int, default=23)
    parser.add_argument("--grain", type=float, default=4.0, help="noise, in grey levels")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    if BASELINE not in presets:
        parser.error(f"--presets must include {BASELINE}, the baseline")
    size = (args.width, args.height)
    path = source(args.cache, max(1.0, args.frames / 30), "medium", size)
    figures: dict[str, Any] = {"frames": args.frames, "crf": args.crf, "grain": args.grain}
    generated, rate = frames_of(path, args.frames)
    baseline = f"{BASELINE}@{args.crf}"
    for name in ("generated", "grain"):
        if name == "generated":
            frames = generated
        else:
            frames, rate = frames_of(with_grain(generated, rate, args.grain), args.frames)
        settings = [(preset, args.crf) for preset in presets]
        same_crf = measure(frames, rate, settings, args.repeats)
        title = f"{name}: {len(frames)} frames of {args.width}x{args.height}@30, one thread, "
        title += f"baseline {baseline}"
        print_table(f"{title}; every preset at CRF {args.crf}", same_crf, same_crf[baseline])
        # the faster presets at the CRF that gives the baseline's quality for fewer bits
        target = same_crf[baseline]["psnr_y_db"]
        faster = [p for p in presets if p in X264_PRESETS[: X264_PRESETS.index(BASELINE)]]
        matched = [(p, same_quality_crf(frames, rate, p, target)) for p in faster]
        same_quality = measure(frames, rate, [(BASELINE, args.crf), *matched], args.repeats)
        print_table(f"{title}; as good as it", same_quality, same_quality[baseline])
        figures[name] = {"same_crf": same_crf, "same_quality": same_quality}
        print()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
