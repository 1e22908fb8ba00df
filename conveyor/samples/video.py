"""Synthetic videos with known ground truth, made with PyAV (no third-party media).

A video is a list of ``Segment``s (a pattern rendered with NumPy for a number of seconds) joined
by hard cuts or crossfades. ``write_video`` encodes it and returns a ``SyntheticVideo`` that
says where the cuts, crossfades and static stretches are, so the demo, the tests and the
benchmarks can check what the pipeline found against what was made. ``write_bad_file`` makes
the broken inputs users have: empty, truncated, not a video, audio only, undecodable.

Every pattern is deterministic for its seed, and consecutive segments use different palettes,
so a cut is a real change of content (as in edited footage) and a static segment is truly
still: every frame is the same picture (an encoder still refines it for a few frames after
each key frame, so its motion vectors are not all zero).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

#: pattern name -> renderer(frame index, fps, width, height, rng seed) -> HxWx3 uint8
KINDS = ("pan", "shapes", "noise", "plasma", "rings", "bars", "checker")

#: file name suffix -> (container format, video codec, pixel format)
CONTAINERS: dict[str, tuple[str, str, str]] = {
    ".mp4": ("mp4", "libx264", "yuv420p"),
    ".mkv": ("matroska", "libx264", "yuv420p"),
    ".mov": ("mov", "libx264", "yuv420p"),
    ".webm": ("webm", "libvpx-vp9", "yuv420p"),
    ".avi": ("avi", "mpeg4", "yuv420p"),
}

BAD_KINDS = ("empty", "truncated", "not_video", "random_bytes", "audio_only", "undecodable")


@dataclass(frozen=True)
class Segment:
    """``duration_s`` of one pattern; ``static`` freezes its first frame for the whole span."""

    kind: str
    duration_s: float
    seed: int = 0
    static: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Segment.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.duration_s <= 0:
            raise ValueError(f"Segment.duration_s must be > 0, got {self.duration_s}")


@dataclass
class SyntheticVideo:
    """What was written: where, how, and the ground truth a detector should find."""

    path: Path
    segments: list[Segment]
    width: int
    height: int
    fps: float
    codec: str
    num_frames: int
    #: time (s) of each hard cut: the first frame of the new segment
    cuts_s: list[float] = field(default_factory=list)
    #: (start, end) seconds of each crossfade
    fades_s: list[tuple[float, float]] = field(default_factory=list)
    #: (start, end) seconds of each static segment
    static_s: list[tuple[float, float]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps

    @property
    def boundaries_s(self) -> list[float]:
        """Every segment boundary: hard cuts, and the middle of each crossfade."""
        return sorted([*self.cuts_s, *((a + b) / 2 for a, b in self.fades_s)])


# -- patterns ----------------------------------------------------------------------------
def _palette(seed: int) -> np.ndarray:
    """Three well-separated colours for a segment (hue rotates with the seed)."""
    hue = (seed * 0.381966) % 1.0
    colours = []
    for offset in (0.0, 0.33, 0.66):
        h = (hue + offset) % 1.0
        rgb = [0.5 + 0.5 * math.cos(2 * math.pi * (h + k / 3)) for k in range(3)]
        colours.append([int(40 + 200 * c) for c in rgb])
    return np.array(colours, dtype=np.float32)


class _Renderer:
    """Renders frames of one segment; state (textures, shapes) is built once per segment."""

    def __init__(self, segment: Segment, width: int, height: int, fps: float) -> None:
        self.segment = segment
        self.w, self.h, self.fps = width, height, fps
        self.rng = np.random.default_rng(segment.seed)
        self.palette = _palette(segment.seed)
        self.render: Callable[[int], np.ndarray] = getattr(self, f"_{segment.kind}")
        self._frozen: np.ndarray | None = None
        self._setup()

    def frame(self, index: int) -> np.ndarray:
        if self.segment.static:
            if self._frozen is None:
                self._frozen = self.render(0)
            return self._frozen
        return self.render(index)

    def _setup(self) -> None:
        w, h = self.w, self.h
        kind = self.segment.kind
        if kind in ("pan", "checker"):
            # a texture larger than the frame; each frame is a moving window onto it
            tw, th = w + w // 2 + 8, h + h // 2 + 8
            yy, xx = np.mgrid[0:th, 0:tw].astype(np.float32)
            if kind == "pan":
                a = np.sin(xx / (7 + self.rng.uniform(0, 9))) * np.cos(
                    yy / (5 + self.rng.uniform(0, 7))
                )
                b = np.sin((xx + yy) / (11 + self.rng.uniform(0, 13)))
                field_ = (a + b + 2) / 4
            else:
                cell = max(4, min(w, h) // 12)
                field_ = (((xx // cell) + (yy // cell)) % 2).astype(np.float32) * 0.8 + 0.1
            p = self.palette
            tex = p[0] * field_[..., None] + p[1] * (1 - field_[..., None])
            self.texture = np.clip(tex, 0, 255).astype(np.uint8)
            self.velocity = (self.rng.uniform(1.0, 3.0), self.rng.uniform(0.5, 2.0))
        elif kind == "shapes":
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            g = (xx / max(w - 1, 1) * 0.6 + yy / max(h - 1, 1) * 0.4)[..., None]
            self.background = (self.palette[0] * g + self.palette[2] * (1 - g) * 0.5).astype(
                np.uint8
            )
            n = 5
            size = max(4, min(w, h) // 6)
            self.shapes = [
                (
                    self.rng.uniform(0, w - size),
                    self.rng.uniform(0, h - size),
                    self.rng.uniform(-4, 4) * w / 640,
                    self.rng.uniform(-3, 3) * h / 360,
                    int(size * self.rng.uniform(0.6, 1.4)),
                    self.rng.integers(60, 255, 3).astype(np.uint8),
                )
                for _ in range(n)
            ]
        elif kind == "plasma":
            sw, sh = max(2, w // 4), max(2, h // 4)
            yy, xx = np.mgrid[0:sh, 0:sw].astype(np.float32)
            self.grid = (xx / sw * 8, yy / sh * 8)
            self.freq = self.rng.uniform(0.5, 1.5, 3)
        elif kind == "rings":
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            cx, cy = w * self.rng.uniform(0.3, 0.7), h * self.rng.uniform(0.3, 0.7)
            self.radius = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2) / max(w, h) * 40
        elif kind == "bars":
            bars = np.array(
                [[192, 192, 192], [192, 192, 0], [0, 192, 192], [0, 192, 0],
                 [192, 0, 192], [192, 0, 0], [0, 0, 192]],
                dtype=np.uint8,
            )  # fmt: skip
            shift = int(self.rng.integers(0, 7))
            bars = np.roll(bars, shift, axis=0)
            cols = np.minimum(np.arange(w) * 7 // max(w, 1), 6)
            top = bars[cols][None, :, :].repeat(h * 2 // 3, axis=0)
            bottom = np.zeros((h - top.shape[0], w, 3), dtype=np.uint8)
            ramp = (np.arange(w) * 255 // max(w - 1, 1)).astype(np.uint8)
            bottom[:] = ramp[None, :, None]
            self.still = np.concatenate([top, bottom], axis=0)
        # noise needs no state beyond the rng

    def _pan(self, i: int) -> np.ndarray:
        vx, vy = self.velocity
        mx, my = self.texture.shape[1] - self.w, self.texture.shape[0] - self.h
        x = int(_bounce(i * vx * self.w / 640, mx))
        y = int(_bounce(i * vy * self.h / 360, my))
        return self.texture[y : y + self.h, x : x + self.w]

    _checker = _pan

    def _shapes(self, i: int) -> np.ndarray:
        img = self.background.copy()
        for x0, y0, vx, vy, size, colour in self.shapes:
            x = int(_bounce(x0 + vx * i, self.w - size))
            y = int(_bounce(y0 + vy * i, self.h - size))
            img[y : y + size, x : x + size] = colour
        return img

    def _noise(self, i: int) -> np.ndarray:
        # coarse noise blocks over a palette tint: changes every frame, like TV static
        bh, bw = max(1, self.h // 4), max(1, self.w // 4)
        small = self.rng.integers(0, 256, (bh, bw, 1), dtype=np.uint8).astype(np.float32) / 255
        tint = self.palette[0] * small + self.palette[1] * (1 - small)
        big = tint.astype(np.uint8).repeat(4, axis=0).repeat(4, axis=1)
        return _fit(big, self.w, self.h)

    def _plasma(self, i: int) -> np.ndarray:
        t = i / self.fps
        xx, yy = self.grid
        f = self.freq
        v = np.sin(xx * f[0] + t * 2.1) + np.sin(yy * f[1] - t * 1.7) + np.sin((xx + yy) * f[2] + t)
        v = ((v + 3) / 6)[..., None]
        img = (self.palette[0] * v + self.palette[2] * (1 - v)).astype(np.uint8)
        return _fit(img.repeat(4, axis=0).repeat(4, axis=1), self.w, self.h)

    def _rings(self, i: int) -> np.ndarray:
        t = i / self.fps
        v = ((np.sin(self.radius - t * 6) + 1) / 2)[..., None]
        return (self.palette[1] * v + self.palette[0] * (1 - v)).astype(np.uint8)

    def _bars(self, i: int) -> np.ndarray:
        # colour bars with a small marker walking along the bottom (static when ``static``)
        img = self.still.copy()
        size = max(2, self.h // 20)
        x = int(_bounce(i * 3 * self.w / 640, self.w - size))
        img[-size:, x : x + size] = 255
        return img


def _bounce(position: float, limit: float) -> float:
    """Position moving back and forth in [0, limit]."""
    if limit <= 0:
        return 0.0
    period = 2 * limit
    p = position % period
    return p if p <= limit else period - p


def _fit(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """Crop or pad (edge) an image to exactly h x w."""
    img = img[:h, :w]
    if img.shape[0] < h or img.shape[1] < w:
        img = np.pad(img, ((0, h - img.shape[0]), (0, w - img.shape[1]), (0, 0)), mode="edge")
    return img


def render_frames(
    segments: Sequence[Segment],
    width: int,
    height: int,
    fps: float,
    crossfades: dict[int, float] | None = None,
) -> Iterator[np.ndarray]:
    """Frames of the whole timeline; ``crossfades[i]`` blends segment i into i + 1 over that
    many seconds at the end of segment i: the next segment starts inside the fade, so the
    timeline is shorter than the segments' durations by the fades' lengths."""
    crossfades = crossfades or {}
    renderers = [_Renderer(s, width, height, fps) for s in segments]
    lengths = [max(1, round(s.duration_s * fps)) for s in segments]
    for index, (renderer, length) in enumerate(zip(renderers, lengths, strict=True)):
        start = 0
        if index - 1 in crossfades:  # the first frames were already shown inside the fade
            start = round(crossfades[index - 1] * fps)
        fade = round(crossfades.get(index, 0) * fps) if index + 1 < len(segments) else 0
        for i in range(start, length):
            frame = renderer.frame(i)
            into = i - (length - fade)
            if fade and into >= 0:
                alpha = (into + 1) / (fade + 1)
                other = renderers[index + 1].frame(into).astype(np.float32)
                frame = (frame.astype(np.float32) * (1 - alpha) + other * alpha).astype(np.uint8)
            yield frame


def write_video(
    path: str | os.PathLike[str],
    segments: Sequence[Segment],
    *,
    width: int = 320,
    height: int = 240,
    fps: float = 24,
    crossfades: dict[int, float] | None = None,
    codec: str | None = None,
    pix_fmt: str | None = None,
    crf: int = 23,
    preset: str = "ultrafast",
    gop: int | None = None,
    audio: bool = False,
) -> SyntheticVideo:
    """Encode ``segments`` to ``path``; the container and default codec follow the suffix.

    ``crossfades`` maps a segment index to the length (s) of its fade into the next one;
    every other boundary is a hard cut. ``audio`` adds a quiet AAC track (mp4/mkv/mov).
    """
    import av

    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in CONTAINERS:
        raise ValueError(f"{target}: unknown suffix {suffix!r} (known: {', '.join(CONTAINERS)})")
    fmt, default_codec, default_pix = CONTAINERS[suffix]
    codec = codec or default_codec
    pix_fmt = pix_fmt or default_pix
    if not segments:
        raise ValueError("write_video needs at least one segment")
    crossfades = dict(crossfades or {})
    for index, seconds in crossfades.items():
        if not 0 <= index < len(segments) - 1:
            raise ValueError(f"crossfade index {index} has no next segment")
        if not 1 / fps <= seconds < min(segments[index].duration_s, segments[index + 1].duration_s):
            raise ValueError(
                f"crossfade {index}: {seconds}s must be at least one frame and shorter than "
                "both segments"
            )
    rate = Fraction(fps).limit_denominator(1001)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with av.open(str(target), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        options: dict[str, str] = {}
        if codec in ("libx264", "libx265"):
            options = {"preset": preset, "crf": str(crf)}
        elif codec == "libvpx-vp9":
            options = {"deadline": "realtime", "cpu-used": "8", "crf": str(crf + 10), "b": "0"}
        elif codec == "mpeg4":
            stream.codec_context.qscale = 4  # type: ignore[attr-defined]
        stream.codec_context.gop_size = gop or max(1, round(float(rate) * 2))
        stream.options = options
        audio_stream = container.add_stream("aac", rate=48000) if audio else None
        frames = render_frames(segments, width, height, float(rate), crossfades)
        for count, image in enumerate(frames, start=1):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = count - 1
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio_stream is not None:
            _write_tone(container, audio_stream, count / float(rate))
    return _truth(target, segments, width, height, float(rate), codec, count, crossfades)


def _write_tone(container, stream, seconds: float) -> None:  # type: ignore[no-untyped-def]
    import av

    rate = 48000
    samples = 1024
    total = int(seconds * rate)
    for start in range(0, total, samples):
        n = min(samples, total - start)
        t = (np.arange(start, start + n) / rate).astype(np.float32)
        tone = (0.05 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
        frame.sample_rate = rate
        frame.pts = start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def _truth(
    path: Path,
    segments: Sequence[Segment],
    width: int,
    height: int,
    fps: float,
    codec: str,
    frames: int,
    crossfades: dict[int, float],
) -> SyntheticVideo:
    video = SyntheticVideo(path, list(segments), width, height, fps, codec, frames)
    start = 0  # frame where the segment's own first frame is shown
    for index, segment in enumerate(segments):
        length = max(1, round(segment.duration_s * fps))
        end = start + length
        fade_in = round(crossfades[index - 1] * fps) if index - 1 in crossfades else 0
        fade_out = round(crossfades[index] * fps) if index in crossfades else 0
        if segment.static:
            video.static_s.append(
                (round((start + fade_in) / fps, 6), round((end - fade_out) / fps, 6))
            )
        if index + 1 < len(segments):
            if fade_out:
                video.fades_s.append((round((end - fade_out) / fps, 6), round(end / fps, 6)))
                end -= fade_out  # the next segment began inside the fade
            else:
                video.cuts_s.append(round(end / fps, 6))
        start = end
    if start != frames:  # pragma: no cover - a defect of render_frames, not of the input
        raise AssertionError(f"timeline has {start} frames, {frames} were written")
    return video


# -- broken inputs -----------------------------------------------------------------------
def write_bad_file(path: str | os.PathLike[str], kind: str, seed: int = 0) -> Path:
    """A file of one broken kind (``BAD_KINDS``) that a reader must reject with a reason.

    - ``empty``: zero bytes; ``truncated``: a real MP4 cut in the middle (its index is at the
      end, so nothing past the cut can be found); ``not_video``: text; ``random_bytes``: noise;
      ``audio_only``: an M4A-like MP4 with one AAC stream; ``undecodable``: a real container
      whose H.264 packets are garbage.
    """
    import av

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if kind == "empty":
        target.write_bytes(b"")
    elif kind == "not_video":
        target.write_text("This is a text file with a video's name.\n" * 50)
    elif kind == "random_bytes":
        target.write_bytes(rng.integers(0, 256, 64 * 1024, dtype=np.uint8).tobytes())
    elif kind == "truncated":
        whole = target.with_name(target.stem + ".whole" + target.suffix)
        write_video(whole, [Segment("pan", 4.0, seed), Segment("shapes", 4.0, seed + 1)])
        data = whole.read_bytes()
        whole.unlink()
        target.write_bytes(data[: len(data) // 2])
    elif kind == "audio_only":
        with av.open(str(target), "w", format="mp4") as container:
            stream = container.add_stream("aac", rate=48000)
            _write_tone(container, stream, 3.0)
    elif kind == "undecodable":
        rate = Fraction(24)
        with av.open(str(target), "w", format="matroska") as container:
            stream = container.add_stream("h264", rate=rate)
            stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
            for i in range(48):
                packet = av.Packet(rng.integers(0, 256, 2048, dtype=np.uint8).tobytes())
                packet.stream = stream
                packet.pts = packet.dts = i
                packet.time_base = 1 / rate
                packet.is_keyframe = i % 24 == 0
                container.mux(packet)
    else:
        raise ValueError(f"unknown bad-file kind {kind!r} (known: {', '.join(BAD_KINDS)})")
    return target
