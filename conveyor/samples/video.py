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

Besides the plain patterns, some kinds model what shot detectors get wrong, for the shots
benchmark: changes of content that are *not* transitions (``gradient``, ``slowpan``,
``zoom``, ``drift``, ``fast``, ``flash``: its flashes are in ``SyntheticVideo.flashes_s``)
and ``black``, the middle of a fade through black (``[A, black, B]`` with crossfades into
and out of the black segment; the whole dip is one span in ``SyntheticVideo.dips_s``, and
``SyntheticVideo.transitions()`` lists every transition with such dips merged).
Seeds ``s`` and ``s + 21`` (or 34, 55: Fibonacci numbers) give nearly the same palette but
different textures and motion: scenes alike in colour, for cuts between similar scenes.
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
KINDS = (
    "pan",
    "shapes",
    "noise",
    "plasma",
    "rings",
    "bars",
    "checker",
    "gradient",
    "slowpan",
    "zoom",
    "drift",
    "fast",
    "flash",
    "black",
)

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
    #: (start, end) seconds of each flash of a ``flash`` segment (1-3 bright frames: not a cut)
    flashes_s: list[tuple[float, float]] = field(default_factory=list)
    #: (start, end) seconds of each dip through a ``black`` segment between two others: from
    #: the start of the transition into the black (a crossfade, or a cut: start = its time) to
    #: the end of the one out of it. Those transitions are also in ``cuts_s`` / ``fades_s``.
    dips_s: list[tuple[float, float]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps

    @property
    def boundaries_s(self) -> list[float]:
        """Every segment boundary: hard cuts, and the middle of each crossfade."""
        return sorted([*self.cuts_s, *((a + b) / 2 for a, b in self.fades_s)])

    def transitions(self) -> list[Transition]:
        """Every transition between two shots, in time order, a dip through black counted
        once (``dip``, spanning its fade out, the black and its fade in) rather than as the
        cuts or crossfades on either side of the black segment; a ``cut`` has start == end."""
        inside = [(a - 1e-6, b + 1e-6) for a, b in self.dips_s]

        def in_dip(a: float, b: float) -> bool:
            return any(lo <= a and b <= hi for lo, hi in inside)

        found = [Transition("dip", a, b) for a, b in self.dips_s]
        found += [Transition("cut", c, c) for c in self.cuts_s if not in_dip(c, c)]
        found += [Transition("dissolve", a, b) for a, b in self.fades_s if not in_dip(a, b)]
        return sorted(found, key=lambda t: (t.start_s, t.end_s))


@dataclass(frozen=True)
class Transition:
    """One transition of the ground truth: ``cut``, ``dissolve`` or ``dip`` (through black)."""

    kind: str
    start_s: float
    end_s: float


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
        elif kind in ("slowpan", "fast", "flash"):
            self._setup_moving_texture(kind)
        elif kind == "gradient":
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            slant = self.rng.uniform(0.0, 0.6)
            self.period = self.rng.uniform(1.5, 3.0) * w  # pixels per turn of the hue wheel
            self.speed = self.rng.uniform(2.0, 4.0) * w / 640  # pixels per frame
            self.hue = self.rng.uniform(0.0, 1.0)
            steps = 4096  # the hue wheel in steps, a colour each
            turn = 2 * np.pi * np.arange(steps, dtype=np.float32)[:, None] / steps
            wheel = 0.5 + 0.5 * np.cos(turn + 2 * np.pi * np.arange(3) / 3)
            self.wheel = (40 + 200 * wheel).astype(np.uint8)
            # the colour depends on x + slant * y: each pixel's step on the wheel at frame 0
            self.steps = ((xx + slant * yy) / self.period * steps).astype(np.int64)
        elif kind == "zoom":
            # a detailed picture at twice the frame's size; each frame is a shrinking window
            # onto it (nearest pixel), zooming in then out again, never past 2.5x
            tw, th = 2 * w, 2 * h
            yy, xx = np.mgrid[0:th, 0:tw].astype(np.float32)
            f = self.rng.uniform(0.5, 1.5, 4)
            field_ = (
                np.sin(xx / (9 * f[0])) * np.cos(yy / (7 * f[1]))
                + 0.5 * np.sin((xx - yy) / (23 * f[2]))
                + 0.5 * np.cos(np.hypot(xx - tw / 2, yy - th / 2) / (13 * f[3]))
                + 2
            ) / 4
            p = self.palette
            tex = p[0] * field_[..., None] + p[2] * (1 - field_[..., None])
            self.texture = np.clip(tex, 0, 255).astype(np.uint8)
            self.rate = self.rng.uniform(0.04, 0.08)  # log-scale per second
            self.centre = (self.rng.uniform(0.35, 0.65), self.rng.uniform(0.35, 0.65))
        elif kind == "drift":
            # a still picture whose colours turn round the hue wheel (a full turn in 20-40 s)
            # while its brightness swells and ebbs by up to a third
            yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
            f = self.rng.uniform(0.6, 1.4, 2)
            v = (np.sin(xx / (w / 6 * f[0])) * np.cos(yy / (h / 4 * f[1])) + 1) / 2
            p = self.palette
            self.base = (p[0] * v[..., None] + p[1] * (1 - v[..., None])).astype(np.float32)
            self.turn_s = self.rng.uniform(20.0, 40.0)
            self.swell_s = self.rng.uniform(8.0, 16.0)
            self.swell = self.rng.uniform(0.15, 0.33)
        # noise and black need no state beyond the rng

    def _setup_moving_texture(self, kind: str) -> None:
        """``slowpan``: a smooth (sub-pixel) pan of 6-18 pixels a second at 640 wide;
        ``fast``: a wrapping texture moving 16-32 pixels a frame (a whip pan);
        ``flash``: the pan's moving picture with 1-3 frame flashes every 2-4 s."""
        w, h = self.w, self.h
        wrap = kind == "fast"
        tw, th = (2 * w, 2 * h) if wrap else (w + w // 2 + 8, h + h // 2 + 8)
        yy, xx = np.mgrid[0:th, 0:tw].astype(np.float32)
        if wrap:  # whole periods across the texture, so that it tiles
            k = self.rng.integers(3, 9, 3)
            a = np.sin(2 * np.pi * k[0] * xx / tw) * np.cos(2 * np.pi * k[1] * yy / th)
            b = np.sin(2 * np.pi * k[2] * (xx / tw + yy / th))
        else:
            a = np.sin(xx / (7 + self.rng.uniform(0, 9))) * np.cos(
                yy / (5 + self.rng.uniform(0, 7))
            )
            b = np.sin((xx + yy) / (11 + self.rng.uniform(0, 13)))
        field_ = (a + b + 2) / 4
        p = self.palette
        tex = p[0] * field_[..., None] + p[1] * (1 - field_[..., None])
        self.texture = np.clip(tex, 0, 255).astype(np.uint8)
        if wrap:
            self.texture = np.tile(self.texture, (2, 2, 1))  # any window is one slice
        if kind == "slowpan":
            speed = self.rng.uniform(0.2, 0.6) * w / 640  # pixels per frame at 30 fps
            angle = self.rng.uniform(-0.4, 0.4)
            self.velocity = (speed * math.cos(angle), speed * math.sin(angle))
        elif kind == "fast":
            speed = self.rng.uniform(16.0, 32.0) * w / 640
            angle = self.rng.uniform(-0.3, 0.3) + (math.pi if self.rng.random() < 0.5 else 0)
            self.velocity = (speed * math.cos(angle), speed * math.sin(angle))
        else:
            self.velocity = (self.rng.uniform(1.0, 3.0), self.rng.uniform(0.5, 2.0))
            self.flashes = flash_frames(self.segment, self.fps)
            self.flash_gain = 0.55 + 0.3 * self.rng.random(max(1, len(self.flashes)))

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

    def _slowpan(self, i: int) -> np.ndarray:
        vx, vy = self.velocity
        mx, my = self.texture.shape[1] - self.w - 1, self.texture.shape[0] - self.h - 1
        x, y = _bounce(i * abs(vx), mx), _bounce(i * abs(vy), my)
        if vx < 0:
            x = mx - x
        if vy < 0:
            y = my - y
        x0, y0 = int(x), int(y)
        fx, fy = round((x - x0) * 256), round((y - y0) * 256)  # sub-pixel, in 256ths
        t = self.texture[y0 : y0 + self.h + 1, x0 : x0 + self.w + 1].astype(np.uint16)
        across = (t[:, :-1] * (256 - fx) + t[:, 1:] * fx + 128) >> 8
        return ((across[:-1] * (256 - fy) + across[1:] * fy + 128) >> 8).astype(np.uint8)

    def _fast(self, i: int) -> np.ndarray:
        vx, vy = self.velocity
        th, tw = self.texture.shape[0] // 2, self.texture.shape[1] // 2  # tiled 2 x 2
        y, x = round(i * vy) % th, round(i * vx) % tw
        return self.texture[y : y + self.h, x : x + self.w]

    def _flash(self, i: int) -> np.ndarray:
        img = self._pan(i)
        for n, (first, count) in enumerate(self.flashes):
            if first <= i < first + count:
                gain = float(self.flash_gain[n])
                return (img.astype(np.float32) * (1 - gain) + 255 * gain).astype(np.uint8)
        return img

    def _gradient(self, i: int) -> np.ndarray:
        # the hue wheel laid along x + slant * y, scrolling steadily: every pixel's colour
        # changes a little each frame and the picture's colours change a lot over seconds
        steps = len(self.wheel)
        shift = int(((i * self.speed) / self.period + self.hue) * steps)
        return np.take(self.wheel, self.steps + shift, axis=0, mode="wrap")

    def _zoom(self, i: int) -> np.ndarray:
        t = i / self.fps
        zoom = math.exp(_bounce(t * self.rate, math.log(2.5)))  # 1x .. 2.5x of the frame
        th, tw = self.texture.shape[:2]
        span_w, span_h = tw / 2 / zoom, th / 2 / zoom  # the window, in texture pixels
        cx = self.centre[0] * tw
        cy = self.centre[1] * th
        x0 = min(max(cx - span_w / 2, 0.0), tw - span_w)
        y0 = min(max(cy - span_h / 2, 0.0), th - span_h)
        cols = np.minimum((x0 + (np.arange(self.w) + 0.5) * span_w / self.w).astype(int), tw - 1)
        rows = np.minimum((y0 + (np.arange(self.h) + 0.5) * span_h / self.h).astype(int), th - 1)
        return self.texture.take(rows, axis=0).take(cols, axis=1)

    def _drift(self, i: int) -> np.ndarray:
        t = i / self.fps
        angle = 2 * np.pi * t / self.turn_s
        gain = 1 + self.swell * math.sin(2 * math.pi * t / self.swell_s)
        return _colour_turn(self.base, angle, gain)

    def _black(self, i: int) -> np.ndarray:
        return np.zeros((self.h, self.w, 3), dtype=np.uint8)

    def _bars(self, i: int) -> np.ndarray:
        # colour bars with a small marker walking along the bottom (static when ``static``)
        img = self.still.copy()
        size = max(2, self.h // 20)
        x = int(_bounce(i * 3 * self.w / 640, self.w - size))
        img[-size:, x : x + size] = 255
        return img


def flash_frames(segment: Segment, fps: float) -> list[tuple[int, int]]:
    """(first frame, frames) of each flash of a ``flash`` segment, counted from its first
    frame: one every 2-4 s, 1-3 frames long, none in its first or last second."""
    rng = np.random.default_rng([segment.seed, 7919])  # apart from the picture's own rng
    length = max(1, round(segment.duration_s * fps))
    flashes: list[tuple[int, int]] = []
    at = fps * (1.0 + rng.uniform(0.0, 1.5))
    while at + 3 < length - fps:
        count = int(rng.integers(1, 4))
        flashes.append((int(at), count))
        at += fps * rng.uniform(2.0, 4.0)
    return flashes


def _colour_turn(image: np.ndarray, angle: float, gain: float) -> np.ndarray:
    """``image`` (float RGB) with its hue turned by ``angle`` (round the grey axis) and its
    brightness scaled by ``gain``."""
    c, s = math.cos(angle), math.sin(angle)
    k = (1 - c) / 3
    r = math.sqrt(1 / 3) * s
    turn = np.array(
        [[c + k, k - r, k + r], [k + r, c + k, k - r], [k - r, k + r, c + k]], dtype=np.float32
    )
    out = image @ (turn.T * gain)
    return np.clip(out, 0, 255).astype(np.uint8)


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
        if segment.kind == "flash" and not segment.static:
            for first, count in flash_frames(segment, fps):
                video.flashes_s.append(
                    (round((start + first) / fps, 6), round((start + first + count) / fps, 6))
                )
        if segment.kind == "black" and 0 < index < len(segments) - 1:
            # from where the previous segment starts to give way (this segment's frame 0 is
            # the first frame of a fade into it, or the first after a cut) to where the next
            # one is shown alone (after the fade out of this one)
            video.dips_s.append((round(start / fps, 6), round(end / fps, 6)))
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
