"""The plain-script contender: fixed clips as a user writes them in an afternoon, no Conveyor.

For every video under INPUT (searched recursively, in name order), one after the other: decode
it once with PyAV, exporting the codec's motion vectors; cut it into clips at the frame nearest
every multiple of ``--clip-len`` seconds (halves up; the last clip ends with the video and is
dropped under ``--min-clip`` seconds: the boundaries of ``conveyor video --splitter fixed``);
encode each clip with libx264 (preset veryfast, CRF 23, yuv420p, MP4 with +faststart) into
OUTPUT/tmp/ and rename it into OUTPUT/clips/ when done, unless its motion score (each frame's
mean vector length, averaged over the frames, in frame widths per frame) is under
``--motion-threshold``. One JSON line per clip goes to OUTPUT/clips.jsonl, totals to
OUTPUT/summary.json. The baseline of ``benchmarks/video.py --user``; time it by hand with::

    python benchmarks/plain_video.py INPUT OUTPUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi")


def cuts(fps: float, clip_len_s: float) -> Iterator[int]:
    """Frames where clips start: the frame nearest each multiple of ``clip_len_s``."""
    k = 0
    while True:
        yield math.floor(k * clip_len_s * fps + 0.5 + 1e-9)
        k += 1


def spans(
    num_frames: int, fps: float, clip_len_s: float, min_clip_s: float
) -> list[tuple[int, int]]:
    """The clips ``[start, end)`` that ``cut_video`` makes of ``num_frames`` frames."""
    points = cuts(fps, clip_len_s)
    start, found = next(points), []
    while start < num_frames:
        end = min(next(points), num_frames)
        if end - start >= max(1, round(min_clip_s * fps)):
            found.append((start, end))
        start = end
    return found


class Clip:
    """One clip's MP4 being written, and its motion score."""

    def __init__(self, path: Path, fps: Fraction, width: int, height: int) -> None:
        self.path = path
        self.container = av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"})
        self.stream = self.container.add_stream("libx264", rate=fps)
        self.stream.width, self.stream.height = width // 2 * 2, height // 2 * 2
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"preset": "veryfast", "crf": "23"}
        self.time_base, self.width, self.frames, self.motion = 1 / fps, width, 0, []

    def add(self, frame: av.VideoFrame) -> None:
        data = frame.side_data.get("MOTION_VECTORS")
        if data is not None and len(vectors := data.to_ndarray()):
            length = np.hypot(vectors["motion_x"], vectors["motion_y"])
            self.motion.append(float(np.mean(length / np.maximum(vectors["motion_scale"], 1))))
        out = frame.reformat(self.stream.width, self.stream.height, "yuv420p")
        out.pts, out.time_base = self.frames, self.time_base  # frame n at n / fps
        out.pict_type = av.video.frame.PictureType.NONE  # the encoder picks key frames
        self.container.mux(self.stream.encode(out))
        self.frames += 1

    def close(self) -> float:
        self.container.mux(self.stream.encode())
        self.container.close()
        return float(np.mean(self.motion)) / self.width if self.motion else 0.0


def cut_video(source: Path, name: str, out: Path, args: argparse.Namespace) -> dict:
    """Decode ``source`` once and write its clips; what it made."""
    with av.open(str(source)) as container:
        stream = container.streams.video[0]
        stream.codec_context.flags2 |= av.codec.context.Flags2.export_mvs
        fps = stream.average_rate or stream.guessed_rate
        points, clips, clip, made = cuts(float(fps), args.clip_len), [], None, 0
        next(points)
        end = next(points)
        for i, frame in enumerate(container.decode(stream)):
            if i == end:
                clips.append(finish(clip, out, args, fps))
                clip, end = None, next(points)
            if clip is None:
                tmp = out / "tmp" / f"{name}.{len(clips):04d}.part"
                clip = Clip(tmp, fps, frame.width, frame.height)
            clip.add(frame)
            made = i + 1
        clips.append(finish(clip, out, args, fps))
    return {"video": name, "seconds": made / float(fps), "clips": [c for c in clips if c]}


def finish(clip: Clip | None, out: Path, args: argparse.Namespace, fps: Fraction) -> dict | None:
    """Close ``clip``; into clips/ if long enough and it moves, else deleted."""
    if clip is None:
        return None
    motion = clip.close()
    if clip.frames < max(1, round(args.min_clip * float(fps))):  # the video's short end
        clip.path.unlink()
        return None
    kept = motion >= args.motion_threshold
    if kept:
        os.replace(clip.path, out / "clips" / clip.path.name.replace(".part", ".mp4"))
    else:
        clip.path.unlink()
    return {"clip": clip.path.stem, "frames": clip.frames, "motion": motion, "kept": kept}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--clip-len", type=float, default=10.0)
    p.add_argument("--min-clip", type=float, default=2.0)
    p.add_argument("--motion-threshold", type=float, default=1e-5)
    args = p.parse_args(argv)
    begun = time.perf_counter()
    root = args.input if args.input.is_dir() else args.input.parent
    videos = (
        [args.input]
        if args.input.is_file()
        else sorted(f for f in root.rglob("*") if f.suffix.lower() in EXTENSIONS and f.is_file())
    )
    for folder in ("clips", "tmp"):
        (args.output / folder).mkdir(parents=True, exist_ok=True)
    done, failed = [], []
    with open(args.output / "clips.jsonl", "w") as lines:
        for source in videos:
            name = str(source.relative_to(root)).replace(os.sep, "__")
            try:
                done.append(cut_video(source, name, args.output, args))
            except (av.FFmpegError, OSError, ValueError) as exc:
                failed.append({"video": name, "error": str(exc)})
                continue
            lines.writelines(json.dumps(c) + "\n" for c in done[-1]["clips"])
    clips = [c for d in done for c in d["clips"]]
    summary = {
        "videos": len(videos),
        "failed": failed,
        "seconds": sum(d["seconds"] for d in done),
        "clips": len(clips),
        "kept": sum(c["kept"] for c in clips),
        "wall_s": time.perf_counter() - begun,
    }
    (args.output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"{summary['videos']} videos, {summary['seconds']:.0f} s of video, {summary['clips']} "
        f"clips ({summary['kept']} kept), {len(failed)} failed, {summary['wall_s']:.1f} s"
    )
    return summary


if __name__ == "__main__":
    main()
