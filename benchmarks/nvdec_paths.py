"""How a video's frames come out of a decoder and what each way costs the CPUs, one run.

The stages decode on NVDEC through FFmpeg's ``*_cuvid`` decoders, which copy every frame to
system memory (all that takes frames there runs on the CPUs: libx264, the models' frame
sampler, the shot detector's last shrink). PyAV 18 can also keep NVDEC's frames on the GPU
(``HWAccel("cuda", is_hw_owned=True)``, each plane a DLPack tensor), which would pay where
nothing needs them on the CPU. This measures every way on the same generated video (720p
unless ``--width``/``--height`` say otherwise), once as the benchmarks encode it (x264
``ultrafast``: no CABAC, no deblocking, cheap to decode) and once as cameras and uploads
are (x264 ``medium``):

- ``cpu``: FFmpeg's own decoder, a thread per core (the stages' CPU path at its fastest);
- ``cpu-1``: one thread (what a worker of one core gets);
- ``cpu-1-small``: one thread, each frame shrunk to TransNetV2's 48 x 27 RGB (the shot
  detector's decoder on the CPUs);
- ``cuvid``: ``h264_cuvid``, frames copied at full size (the transcoder's input);
- ``cuvid-small``: ``h264_cuvid`` with NVDEC's scaler shrinking each frame to 192 x 108
  before the copy, then the CPU to 48 x 27 RGB (the shot detector's decoder on NVDEC,
  ``nvdec_size``);
- ``hwaccel``: FFmpeg's ``h264`` decoder on NVDEC (``hwaccel="cuda"``), frames copied;
- ``hwaccel-gpu``: the same, frames kept on the GPU and shrunk there to TransNetV2's
  48 x 27 RGB by torch (through DLPack), as a GPU model would take them.

With ``--encode N``, also what NVDEC's NV12 frames cost libx264 (``veryfast``, CRF 23, one
thread, as the transcoder encodes) over the first ``N`` frames of the ``medium`` source,
alternating, median of ``--repeats``: taken as they are (``nv12``, the transcoder's way),
converted to yuv420p first (its way before), and the CPU decoder's yuv420p; and whether
the three streams are the same bit for bit.

For each way: frames, wall seconds, CPU seconds of this process (every thread), CPU seconds
per video-hour, frames per second and the first frame's pixel format (``nv12`` from NVDEC,
``yuv420p`` from the CPU, ``cuda`` kept on the GPU). A way that cannot run here (no GPU, no
driver) says why instead. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from _common import fmt, table
from video import _segments

from conveyor.samples.video import write_video

#: TransNetV2's frame size, and the one NVDEC's scaler gives it (``nvdec_size``)
SMALL = (48, 27)
NVDEC_SMALL = (192, 108)


def source(cache: Path, seconds: float, preset: str, size: tuple[int, int] = (1280, 720)) -> Path:
    """The generated 30 fps video of the benchmarks (seed 0) at ``size``, encoded with
    ``preset``."""
    path = cache / f"nvdec-paths-{seconds:g}s-{size[0]}x{size[1]}@30-{preset}.mp4"
    if not path.exists():
        segments, fades = _segments(0, seconds)
        part = path.with_suffix(".part.mp4")
        write_video(
            part, segments, width=size[0], height=size[1], fps=30, crossfades=fades, preset=preset
        )
        part.rename(path)
    return path


class Tally:
    """Frames decoded, and the pixel format the first came in (``cuda``: on the GPU; NVDEC
    gives ``nv12`` where the CPU's decoder gives ``yuv420p``)."""

    def __init__(self) -> None:
        self.frames = 0
        self.format: str | None = None

    def add(self, frame: Any) -> None:
        if self.format is None:
            self.format = frame.format.name
        self.frames += 1


def decode_cpu(path: Path, threads: int, small: bool = False) -> Tally:
    import av

    tally = Tally()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = threads  # 0: one per core
        for frame in container.decode(stream):
            if small:
                _shrink_cpu(frame)
            tally.add(frame)
    return tally


def decode_cuvid(path: Path, resize: tuple[int, int] | None) -> Tally:
    import av

    from conveyor.media.decode import nvdec_decoder

    tally = Tally()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        decoder = nvdec_decoder(stream, resize)
        for packet in container.demux(stream):  # its last, empty packet drains the decoder
            for frame in decoder.decode(packet):
                if resize is not None:
                    _shrink_cpu(frame)
                tally.add(frame)
    return tally


def _shrink_cpu(frame: Any) -> Any:
    """As the shot detector's decoder shrinks a frame (its ``ffmpeg`` scaler)."""
    return frame.to_ndarray(width=SMALL[0], height=SMALL[1], format="rgb24")


def decode_hwaccel(path: Path, on_gpu: bool) -> Tally:
    import av
    from av.codec.hwaccel import HWAccel

    accel = HWAccel("cuda", allow_software_fallback=False, is_hw_owned=on_gpu)
    shrink = _gpu_shrink() if on_gpu else None
    tally = Tally()
    kept: list[Any] = []
    with av.open(str(path), hwaccel=accel) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            tally.add(frame)
            if shrink is not None:
                if tally.format != "cuda":
                    raise RuntimeError(f"frames came in system memory ({tally.format})")
                kept.append(shrink(frame))
    if kept:
        import torch

        torch.cuda.synchronize()
        if kept[0].shape != (SMALL[1], SMALL[0], 3):
            raise RuntimeError(f"the GPU's frames came out {tuple(kept[0].shape)}")
    return tally


def _gpu_shrink() -> Callable[[Any], Any]:
    """NV12 on the GPU to a 48 x 27 RGB tensor there, without a copy to memory."""
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")

    def shrink(frame: Any) -> Any:
        width, height = frame.width, frame.height
        luma = torch.from_dlpack(frame.planes[0]).reshape(height, -1)[:, :width]
        chroma = torch.from_dlpack(frame.planes[1]).reshape(height // 2, -1)[:, :width]
        chroma = chroma.reshape(height // 2, width // 2, 2).permute(2, 0, 1)
        size = (SMALL[1], SMALL[0])
        y = F.interpolate(luma[None, None].float(), size=size, mode="area")[0, 0]
        u, v = F.interpolate(chroma[None].float(), size=size, mode="area")[0] - 128.0
        y = (y - 16.0) * (255.0 / 219.0)  # limited range, BT.709
        rgb = torch.stack((y + 1.793 * v, y - 0.213 * u - 0.533 * v, y + 2.112 * u), dim=-1)
        return rgb.clamp(0, 255).to(torch.uint8)

    return shrink


WAYS: dict[str, Callable[[Path], Tally]] = {
    "cpu": lambda path: decode_cpu(path, 0),
    "cpu-1": lambda path: decode_cpu(path, 1),
    "cpu-1-small": lambda path: decode_cpu(path, 1, small=True),
    "cuvid": lambda path: decode_cuvid(path, None),
    "cuvid-small": lambda path: decode_cuvid(path, NVDEC_SMALL),
    "hwaccel": lambda path: decode_hwaccel(path, False),
    "hwaccel-gpu": lambda path: decode_hwaccel(path, True),
}


def measure(way: str, path: Path, seconds: float) -> dict[str, Any]:
    """One way over one video: its figures, or why it cannot run here."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        tally = WAYS[way](path)
    except Exception as exc:  # noqa: BLE001 - any failure: this way is not available here
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"way": way, "unavailable": f"{type(exc).__name__}: {text}"}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "way": way,
        "frames": tally.frames,
        "format": tally.format,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_s_per_video_hour": cpu * 3600 / seconds,
        "frames_per_s": tally.frames / wall if wall > 0 else None,
    }


def one_thread_x264(
    out: Any,
    rate: Any,
    size: tuple[int, int],
    pix_fmt: str = "yuv420p",
    preset: str = "veryfast",
    crf: int = 23,
) -> tuple[Any, Fraction]:
    """A libx264 stream in ``out`` as the transcoder encodes a clip (one thread), and the
    time base its frames are stamped in (one step a frame)."""
    encoder = out.add_stream("libx264", rate=rate)
    encoder.width, encoder.height = size
    encoder.pix_fmt = pix_fmt
    encoder.options = {"preset": preset, "crf": str(crf)}
    encoder.codec_context.thread_count = 1
    encoder.codec_context.time_base = step = 1 / Fraction(rate)
    return encoder, step


ENCODINGS = ("nv12 as it is", "nv12 converted to yuv420p", "yuv420p from the CPU")


def encoding_costs(path: Path, frames: int, repeats: int) -> dict[str, Any]:
    """CPU seconds per video-hour libx264 takes over ``frames`` frames, each way."""
    import hashlib
    import io
    import statistics

    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or 30
        cpu = [f for _, f in zip(range(frames), container.decode(stream), strict=False)]
    nv12 = [f.reformat(format="nv12") for f in cpu]

    def encode(source: list[Any], pix_fmt: str, convert: bool) -> tuple[float, str]:
        out = av.open(io.BytesIO(), "w", format="mp4")
        encoder, step = one_thread_x264(out, rate, (source[0].width, source[0].height), pix_fmt)
        digest = hashlib.sha256()
        began = time.process_time()
        for index, frame in enumerate(source):
            if convert:
                frame = frame.reformat(format="yuv420p")
            frame.pts, frame.time_base = index, step
            frame.pict_type = 0  # the encoder's own frame types, as the transcoder asks
            for packet in encoder.encode(frame):
                digest.update(bytes(packet))
        for packet in encoder.encode(None):
            digest.update(bytes(packet))
        spent = time.process_time() - began
        out.close()
        return spent * 3600 * float(rate) / len(source), digest.hexdigest()

    ways = {
        ENCODINGS[0]: (nv12, "nv12", False),
        ENCODINGS[1]: (nv12, "yuv420p", True),
        ENCODINGS[2]: (cpu, "yuv420p", False),
    }
    costs: dict[str, list[float]] = {name: [] for name in ways}
    digests: set[str] = set()
    for _ in range(repeats):
        for name, (source, pix_fmt, convert) in ways.items():
            cost, digest = encode(source, pix_fmt, convert)
            costs[name].append(cost)
            digests.add(digest)
    return {
        "frames": len(cpu),
        "cpu_s_per_video_hour": costs,
        "median": {name: statistics.median(runs) for name, runs in costs.items()},
        "same_stream": len(digests) == 1,
    }


def _short(text: str, limit: int = 72) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=float, default=30.0, help="length of the video")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--ways", default=",".join(WAYS), help=f"subset of {','.join(WAYS)}")
    p.add_argument("--presets", default="ultrafast,medium", help="x264 presets of the sources")
    p.add_argument("--cache", type=Path, default=Path("/tmp/conveyor-bench-videos"))
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    p.add_argument(
        "--encode", type=int, default=0, help="frames of libx264 per way (0: no encoding)"
    )
    p.add_argument("--repeats", type=int, default=5, help="runs of each encoding, alternating")
    args = p.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    if set(ways) - set(WAYS):
        p.error(f"unknown --ways: {', '.join(sorted(set(ways) - set(WAYS)))}")
    args.cache.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {
        "seconds": args.seconds,
        "size": [args.width, args.height],
        "sources": {},
    }
    for preset in [p for p in args.presets.split(",") if p]:
        path = source(args.cache, args.seconds, preset, (args.width, args.height))
        results = [measure(way, path, args.seconds) for way in ways]
        figures["sources"][preset] = results
        rows = [
            [r["way"], "-", "-", "-", "-", "-", _short(r["unavailable"])]
            if "unavailable" in r
            else [
                r["way"],
                r["frames"],
                fmt(r["wall_s"]),
                fmt(r["cpu_s"]),
                fmt(r["cpu_s_per_video_hour"], ".0f"),
                fmt(r["frames_per_s"], ".0f"),
                r["format"] or "",
            ]
            for r in results
        ]
        header = ["way", "frames", "wall s", "CPU s", "CPU-s per video-h", "frames/s", "format"]
        title = (
            f"decoding {args.seconds:g} s of {args.width}x{args.height} at 30 fps "
            f"(x264 {preset}) on this machine"
        )
        print(table(title, header, rows))
        print()
        if args.json is not None:  # after each source: a run cut short keeps its figures
            args.json.write_text(json.dumps(figures, indent=1) + "\n")
    if args.encode:
        medium = source(args.cache, args.seconds, "medium", (args.width, args.height))
        encoding = figures["encoding"] = encoding_costs(medium, args.encode, args.repeats)
        rows = [
            [name, fmt(encoding["median"][name], ".0f"), " ".join(f"{c:.0f}" for c in runs)]
            for name, runs in encoding["cpu_s_per_video_hour"].items()
        ]
        title = (
            f"libx264 veryfast, one thread, {encoding['frames']} frames of the medium source: "
            f"the same stream each way: {'yes' if encoding['same_stream'] else 'NO'}"
        )
        print(table(title, ["frames given", "CPU-s per video-h (median)", "runs"], rows))
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
