"""Shot splitting against PySceneDetect 0.7 (issue 27), side by side in one run, on generated
videos whose every transition is known.

Contenders, each on the same corpus:

* ``PySceneDetect CLI``: ``scenedetect -i V -o D detect-adaptive list-scenes -s split-video``,
  one video at a time, as a user runs it (``list-scenes`` only adds the scene list this
  benchmark scores; ``split-video`` re-encodes every scene with ffmpeg, libx264 veryfast).
  ffmpeg is the static binary of the ``imageio-ffmpeg`` package (``make bench-shots`` installs
  it), linked as ``ffmpeg`` in a folder put first on the subprocess's PATH, else an ``ffmpeg``
  on PATH; with neither, ``split-video`` is left out (the row says so) and only the scene
  lists are made;
* ``PySceneDetect API``: ``scenedetect.detect(path, AdaptiveDetector())``, and the same with
  ``ContentDetector()`` and ``HistogramDetector()``, in this process: scene lists only (the
  scenes are scored as the clips ``split-video`` would make of them);
* ``ours``: ``conveyor video CORPUS OUT --splitter shots --detector D --max-clip 60 --crop 0
  --no-quality --no-embed --no-tags --no-motion --no-live`` for each ``D`` of ``--detectors``,
  one subprocess on the whole corpus folder; a detector the command rejects (exit 2) is
  skipped and the reason printed. Its transitions come from each video's record
  (``videos/<name>.json``, ``transitions``; from the clips' boundaries where a record has
  none), its clips from ``metas/<clip_id>.json`` (``frame_span``) of the kept clips.

The corpus (``--corpus DIR``, made once and cached; made again when its recipe or the
generator's code changes) is 35 videos of 20-30 s at 640x360, 30 fps by default
(``conveyor.samples.video``), in categories: hard cuts between different scenes; hard cuts
between similar scenes (one kind, and mostly seeds whose palettes are alike); dissolves of
0.3, 0.5, 1, 2 and 3 s; fades through black (a fade, or a cut, to black held 0.1-0.6 s, and
a fade out of it); negatives (long scrolling gradients, slow pans, zooms and colour drifts
of 10-20 s: no transition inside a segment); flashes (1-3 bright frames: not cuts); fast
motion (a whip-pan speed); mixed timelines of all of these. Every shot is at least 2 s.

Figures per contender (frames at the video's rate; the tolerance is 0.2 s):

* hard cuts found: a detected transition within 0.2 s of the cut;
* dissolves found, dips (fades through black) found: a detected transition that overlaps the
  span, give or take 0.2 s (one cut inside a dissolve finds it);
* spurious: detected transitions near no true one (a flash is a negative: ``at flashes``
  says how many of the spurious ones were at a flash);
* clips crossing a transition: clips (PySceneDetect's scenes: its split-video clips) that
  hold both sides of a hard cut or more than one frame of a dissolve or dip;
* seconds lost: for each true shot (its frames outside any transition), the seconds that
  are in no clip;
* shots without a clip: shots of 2 s or more that no clip has most of its frames in;
* wall and CPU seconds: CPU of a subprocess's whole tree from ``RUSAGE_CHILDREN`` before and
  after it is waited for; the API rows, this process's ``time.process_time``.

It prints the table, the same per category, the targets (ours against PySceneDetect adaptive:
hard cuts found at least and spurious at most its, more dissolves found than it; no shot
without a clip) and, per contender, what went wrong in each video (transitions missed,
spurious ones, shots without a clip); ``--json PATH`` writes every figure and every detection
(``--from-json PATH`` prints its tables again). ``--conveyor CMD`` runs another version's
``conveyor`` as ours. On 2 cores the corpus takes 1-2 minutes to make, a run with every
contender about 15 (TransNetV2 alone about 6).

``--speed``: the issue's timing case: 4 videos of 60 s at 1280x720, 30 fps, 16 hard cuts
(segments of moving rectangles, scrolling gradients, a sine texture and still colour bars),
``scenedetect -i V -o D detect-adaptive split-video`` one video at a time against our default
shots command (no ``--detector``) on the folder, order alternating over ``--repeats``: wall,
CPU and ours / theirs. Run it on an otherwise idle machine.

    make bench-shots                                      # installs imageio-ffmpeg, then:
    .venv/bin/python benchmarks/shots.py                  # accuracy, every contender
    .venv/bin/python benchmarks/shots.py --quick          # 5 tiny videos, under a minute
    .venv/bin/python benchmarks/shots.py --detectors histogram,transnetv2 --json shots.json
    .venv/bin/python benchmarks/shots.py --speed --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from _common import check, fmt, machine_line, table, usable_cores

import conveyor.samples.video as samples
from conveyor.samples.video import Segment, SyntheticVideo, write_video

#: a detection this close to a true transition (s) finds it
TOLERANCE_S = 0.2
#: shots at least this long (s) must have a clip of their own
SHOT_MIN_S = 2.0
THEIRS = ("cli", "adaptive", "content", "histogram")
DETECTORS = "auto,adaptive,content,histogram,transnetv2"
#: our shots command, but for --detector: split and x264 clips, nothing else
OURS_OPTIONS = [
    "--splitter",
    "shots",
    "--max-clip",
    "60",
    "--crop",
    "0",
    "--no-quality",
    "--no-embed",
    "--no-tags",
    "--no-motion",
    "--no-live",
]
CATEGORIES = ("cut", "similar", "dissolve", "dip", "negative", "flash", "fast", "mixed")
#: seed offsets whose palettes are alike (the palette's hue turns 0.381966 per seed: these are
#: Fibonacci numbers, whose multiples of it are nearly whole)
ALIKE = (0, 21, 55, 34, 89, 13, 144)


# -- the corpus -------------------------------------------------------------------------------
@dataclass
class Spec:
    """One video of the corpus: its name, category, segments and crossfades."""

    name: str
    category: str
    segments: list[tuple[str, float, int, bool]]
    crossfades: dict[int, float]


Shot = tuple  # (kind, seed, seconds shown alone[, static])


def timeline(shots: Sequence[Shot], joins: Sequence[tuple[Any, ...]]) -> tuple[list, dict]:
    """Segments and crossfades for ``shots`` (each shown alone for its seconds) joined by
    ``joins[i]`` between shot i and i + 1: ``("cut",)``, ``("dissolve", s)`` or ``("dip",
    fade out s (0: a cut to black), black held s, fade in s)``."""
    items: list[list[Any]] = []  # kind, seed, alone, static, fade out
    for i, shot in enumerate(shots):
        kind, seed, alone = shot[:3]
        items.append([kind, seed, alone, bool(shot[3]) if len(shot) > 3 else False, 0.0])
        if i < len(joins):
            join = joins[i]
            if join[0] == "dissolve":
                items[-1][4] = join[1]
            elif join[0] == "dip":
                _, fade_out, hold, fade_in = join
                items[-1][4] = fade_out
                items.append(["black", 0, hold, False, fade_in])
    segments, crossfades, fade_in = [], {}, 0.0
    for index, (kind, seed, alone, static, fade_out) in enumerate(items):
        segments.append((kind, round(alone + fade_in + fade_out, 4), seed, static))
        if fade_out:
            crossfades[index] = fade_out
        fade_in = fade_out
    return segments, crossfades


def _spec(
    specs: list[Spec], category: str, detail: str, shots: list[Shot], joins: list[Any]
) -> None:
    segments, crossfades = timeline(shots, joins[: len(shots) - 1])
    name = f"{len(specs):02d}-{category}-{detail}"
    specs.append(Spec(name, category, segments, crossfades))


def corpus_specs(quick: bool = False) -> list[Spec]:
    """The accuracy corpus (35 videos of 20-30 s; ``quick``: 5 of about 8 s)."""
    specs: list[Spec] = []
    cuts = [("cut",)] * 8
    if quick:
        _spec(specs, "cut", "3", [("pan", 1, 2.5), ("shapes", 2, 2.5), ("rings", 3, 2.5)], cuts)
        _spec(specs, "similar", "shapes", [("shapes", 40 + a, 2.5) for a in ALIKE[:3]], cuts)
        three = [("plasma", 4, 2.5), ("pan", 5, 2.5), ("checker", 6, 2.5)]
        _spec(specs, "dissolve", "1-0.3", three, [("dissolve", 1.0), ("dissolve", 0.3)])
        two = [("flash", 7, 4.0), ("shapes", 8, 2.5)]
        _spec(specs, "dip", "flash", two, [("dip", 0.3, 0.2, 0.3)])
        _spec(specs, "negative", "gradient", [("gradient", 9, 6.0)], [])
        return specs
    rng = random.Random(27)
    plain = ["pan", "shapes", "plasma", "rings", "checker", "bars", "zoom", "slowpan"]

    def seed() -> int:
        return rng.randrange(1, 1 << 20)

    def kinds(n: int, pool: Sequence[str]) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            kind = rng.choice(pool)
            if not out or kind != out[-1]:
                out.append(kind)
        return out

    def shots_of(pool: Sequence[str], n: int, low: float, high: float) -> list[Shot]:
        return [(k, seed(), rng.uniform(low, high), k == "bars") for k in kinds(n, pool)]

    for _ in range(4):  # hard cuts between different scenes
        _spec(specs, "cut", "7shots", shots_of(plain, 7, 3, 5), cuts)
    for kind, alike in (("pan", 1), ("shapes", 1), ("plasma", 1), ("zoom", 1), ("rings", 0)):
        base = seed()  # one kind; palettes alike, or seeds apart
        offsets = ALIKE if alike else [seed() for _ in ALIKE]
        shots = [(kind, base + offsets[i], rng.uniform(3, 4.5)) for i in range(6)]
        _spec(specs, "similar", f"{kind}-{'alike' if alike else 'reseeded'}", shots, cuts)
    lengths = [0.3, 0.5, 1.0, 2.0, 3.0]
    for v in range(5):  # dissolves of every length, in a different order each
        order = lengths[v:] + lengths[:v]
        joins = [("dissolve", s) for s in order]
        detail = "-".join(f"{s:g}" for s in order)
        _spec(specs, "dissolve", detail, shots_of(plain, 6, 2.5, 4), joins)
    base = seed()  # dissolves between alike scenes of one kind
    shots = [("plasma", base + ALIKE[i], rng.uniform(2.5, 4)) for i in range(5)]
    joins = [("dissolve", s) for s in (1.0, 2.0, 0.5, 3.0)]
    _spec(specs, "dissolve", "plasma-alike", shots, joins)
    for _ in range(4):  # fades (or a cut) to black, held, and a fade out of it
        joins = []
        for _ in range(4):
            fade_out, hold = rng.choice([0.0, 0.3, 0.5, 1.0]), rng.choice([0.1, 0.3, 0.6])
            joins.append(("dip", fade_out, hold, rng.choice([0.3, 0.5, 1.0])))
        _spec(specs, "dip", "4dips", shots_of(plain, 5, 2.5, 4), joins)
    for pair in (
        [("gradient", 20.0)],
        [("drift", 20.0)],
        [("gradient", 14.0), ("zoom", 12.0)],
        [("slowpan", 13.0), ("drift", 14.0)],
        [("zoom", 15.0), ("gradient", 11.0)],
        [("drift", 12.0), ("slowpan", 14.0)],
    ):  # long changes of content that are no transition
        shots = [(kind, seed(), seconds) for kind, seconds in pair]
        _spec(specs, "negative", "-".join(kind for kind, _ in pair), shots, cuts)
    for _ in range(3):  # flashes inside shots, cut to others
        shots = []
        for other in kinds(2, ["pan", "shapes", "rings", "plasma"]):
            shots += [("flash", seed(), rng.uniform(7, 9)), (other, seed(), rng.uniform(3, 4))]
        _spec(specs, "flash", "flash", shots, cuts)
    for _ in range(3):  # fast motion, cut to others and to another fast shot
        _spec(specs, "fast", "fast", shots_of(["fast", "fast", "pan", "shapes"], 6, 3, 5), cuts)
    everything = [*plain, "gradient", "drift", "fast", "flash", "noise"]
    slow = ("gradient", "drift", "flash")
    for _ in range(4):  # mixed timelines
        shots = [
            (k, seed(), rng.uniform(5, 8) if k in slow else rng.uniform(2.5, 5), k == "bars")
            for k in kinds(7, everything)
        ]
        joins = []
        for _ in range(len(shots) - 1):
            r = rng.random()
            if r < 0.5:
                joins.append(("cut",))
            elif r < 0.8:
                joins.append(("dissolve", rng.choice(lengths)))
            else:
                joins.append(("dip", rng.choice([0.0, 0.5, 1.0]), 0.2, rng.choice([0.3, 1.0])))
        _spec(specs, "mixed", "mixed", shots, joins)
    return specs


def speed_specs(segment_s: float = 12.0) -> list[Spec]:
    """The issue's timing case: 4 videos of 60 s, 5 segments of 12 s each, 16 hard cuts."""
    kinds = [("shapes", False), ("gradient", False), ("pan", False), ("bars", True)]
    specs = []
    for v in range(4):
        order = [kinds[(v + i) % 4] for i in range(5)]
        segments = [(k, segment_s, 1000 * v + i + 1, static) for i, (k, static) in enumerate(order)]
        specs.append(Spec(f"speed-{v}", "cut", segments, {}))
    return specs


@dataclass
class Truth:
    """What a video holds, in frames: hard cuts (the first frame after), dissolves and dips
    (kind, first mixed frame, end), flashes (first, end), shots (first, end: between
    transitions)."""

    name: str
    category: str
    fps: float
    num_frames: int
    cuts: list[int] = field(default_factory=list)
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    flashes: list[tuple[int, int]] = field(default_factory=list)
    shots: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, spec: Spec, video: SyntheticVideo) -> Truth:
        fps = video.fps
        truth = cls(spec.name, spec.category, fps, video.num_frames)
        previous = 0
        for t in video.transitions():
            a, b = round(t.start_s * fps), round(t.end_s * fps)
            if t.kind == "cut":
                truth.cuts.append(a)
            else:
                truth.spans.append((t.kind, a, b))
            truth.shots.append((previous, a))
            previous = b
        truth.shots.append((previous, video.num_frames))
        truth.flashes = [(round(a * fps), round(b * fps)) for a, b in video.flashes_s]
        return truth


def _write_one(job: tuple[str, dict[str, Any], int, int, int]) -> dict[str, Any]:
    path, spec, width, height, fps = job
    segments = [Segment(k, d, s, st) for k, d, s, st in spec["segments"]]
    crossfades = {int(i): f for i, f in spec["crossfades"].items()}
    video = write_video(path, segments, crossfades=crossfades, width=width, height=height, fps=fps)
    return asdict(Truth.of(Spec(**spec), video))


def make_corpus(
    root: Path, tag: str, specs: list[Spec], width: int, height: int, fps: int, jobs: int
) -> tuple[Path, list[Truth]]:
    """The videos of ``specs`` in ``root/<tag>-<recipe hash>/videos`` with their truth beside
    them (``truth.json``), made again whenever the recipe or the generator's code changes."""
    recipe = json.dumps(
        [[asdict(s) for s in specs], width, height, fps, Path(samples.__file__).read_text()],
        sort_keys=True,
    )
    folder = root / f"{tag}-{width}x{height}@{fps}-{hashlib.sha1(recipe.encode()).hexdigest()[:10]}"
    videos, truth_file = folder / "videos", folder / "truth.json"
    if truth_file.exists():
        truths = [Truth(**t) for t in json.loads(truth_file.read_text())]
        print(f"corpus: {folder} (cached)")
        return videos, truths
    shutil.rmtree(folder, ignore_errors=True)
    videos.mkdir(parents=True)
    begun = time.perf_counter()
    work = [(str(videos / f"{s.name}.mp4"), asdict(s), width, height, fps) for s in specs]
    with multiprocessing.get_context("fork").Pool(max(1, jobs)) as pool:
        made = pool.map(_write_one, work, chunksize=1)
    truths = [Truth(**t) for t in made]
    truth_file.write_text(json.dumps([asdict(t) for t in truths]))
    seconds = sum(t.num_frames / t.fps for t in truths)
    print(
        f"corpus: made {len(truths)} videos ({seconds:.0f} s of video) in "
        f"{time.perf_counter() - begun:.1f} s -> {folder}"
    )
    return videos, truths


# -- contenders ------------------------------------------------------------------------------
@dataclass
class Found:
    """What a contender found in one video: transitions as inclusive frame pairs (a hard cut
    before frame c is ``(c, c - 1)``) and clips as [start, end) frames."""

    transitions: list[tuple[int, int]] = field(default_factory=list)
    clips: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Run:
    label: str
    wall_s: float = 0.0
    cpu_s: float = 0.0
    skipped: str | None = None
    note: str = ""
    failed: str | None = None
    found: dict[str, Found] = field(default_factory=dict)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    cmd: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> tuple[int, float, float]:
    """Run ``cmd`` to its end: its exit code, wall seconds and its tree's CPU seconds."""
    with open(log, "w") as sink:
        before = _children_cpu_s()
        begun = time.perf_counter()
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, check=False)
        wall = time.perf_counter() - begun
        cpu = _children_cpu_s() - before
    return proc.returncode, wall, cpu


def _tool(name: str) -> list[str]:
    """The command of a console script of this interpreter's environment."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


def ffmpeg_env(bin_dir: Path) -> tuple[dict[str, str] | None, str]:
    """The environment for PySceneDetect's CLI with an ``ffmpeg`` for split-video: imageio-
    ffmpeg's static binary, linked as ``bin_dir/ffmpeg`` with ``bin_dir`` first on PATH, else
    an ``ffmpeg`` already on PATH; ``None`` when there is neither. And which, or why not."""
    env = dict(os.environ)
    with contextlib.suppress(ImportError, RuntimeError, OSError):
        import imageio_ffmpeg

        exe = Path(imageio_ffmpeg.get_ffmpeg_exe())
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "ffmpeg"
        link.unlink(missing_ok=True)
        link.symlink_to(exe)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env, f"ffmpeg: imageio-ffmpeg's {exe.name}"
    on_path = shutil.which("ffmpeg")
    if on_path:
        return env, f"ffmpeg: {on_path}"
    return None, "no ffmpeg (neither imageio-ffmpeg nor one on PATH; pip install imageio-ffmpeg)"


def _scenes_to_found(scenes: list[tuple[int, int]], num_frames: int) -> Found:
    """PySceneDetect's scenes ([start, end) frames; none: one scene, the whole video)."""
    if not scenes:
        scenes = [(0, num_frames)]
    return Found([(s, s - 1) for s, _ in scenes[1:]], list(scenes))


def _read_scene_csv(path: Path, fps: float) -> list[tuple[int, int]]:
    import csv

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        (round(float(r["Start Time (seconds)"]) * fps), round(float(r["End Time (seconds)"]) * fps))
        for r in rows
    ]


def run_cli(
    videos: Path,
    truths: list[Truth],
    work: Path,
    split: bool,
    env: dict[str, str] | None,
    label: str,
    scene_list: bool = True,
) -> Run:
    """``scenedetect -i V -o D detect-adaptive [list-scenes -s] [split-video]``, one video at
    a time."""
    run = Run(label)
    for truth in truths:
        out = work / truth.name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cmd = [*_tool("scenedetect"), "-i", str(videos / f"{truth.name}.mp4"), "-o", str(out)]
        cmd += ["detect-adaptive", *(["list-scenes", "-s"] if scene_list else [])]
        cmd += ["split-video"] if split else []
        rc, wall, cpu = measure(cmd, work / f"{truth.name}.log", env)
        run.wall_s += wall
        run.cpu_s += cpu
        if rc != 0:
            run.failed = f"exit {rc} on {truth.name} (log {work / truth.name}.log)"
            continue
        if scene_list:
            csv = next(out.glob("*-Scenes.csv"), None)
            scenes = _read_scene_csv(csv, truth.fps) if csv else []
            run.found[truth.name] = _scenes_to_found(scenes, truth.num_frames)
    return run


def run_api(videos: Path, truths: list[Truth], detector: str) -> Run:
    """``scenedetect.detect(path, <Detector>())`` over the corpus, in this process."""
    import scenedetect

    make = {
        "adaptive": scenedetect.AdaptiveDetector,
        "content": scenedetect.ContentDetector,
        "histogram": scenedetect.HistogramDetector,
    }[detector]
    run = Run(f"PySceneDetect API {detector}")
    for truth in truths:
        wall, cpu = time.perf_counter(), time.process_time()
        scenes = scenedetect.detect(str(videos / f"{truth.name}.mp4"), make())
        run.wall_s += time.perf_counter() - wall
        run.cpu_s += time.process_time() - cpu
        spans = [(a.frame_num, b.frame_num) for a, b in scenes]
        run.found[truth.name] = _scenes_to_found(spans, truth.num_frames)
    run.note = "scene lists only (no clips written)"
    return run


def _rejection(log: Path) -> str:
    """The reason in a usage error's box, on one line."""
    lines = [ln.strip(" │╭╮╰╯─") for ln in log.read_text(errors="replace").splitlines()]
    text = " ".join(ln for ln in lines if ln and not ln.startswith(("Usage:", "Try ")))
    return " ".join(text.split()).removeprefix("Error ").strip() or "rejected"


#: the ``conveyor`` command that runs ours (``--conveyor``: another version's)
CONVEYOR: list[str] = []


def ours_command(videos: Path, out: Path, detector: str | None) -> list[str]:
    cmd = [*(CONVEYOR or _tool("conveyor")), "video", str(videos), str(out), *OURS_OPTIONS]
    return cmd + (["--detector", detector] if detector else [])


def read_ours(out: Path, truths: list[Truth]) -> tuple[dict[str, Found], list[str]]:
    """Each video's transitions and kept clips from what our run wrote."""
    found: dict[str, Found] = {}
    problems = []
    for truth in truths:
        record_path = out / "videos" / f"{truth.name}.mp4.json"
        if not record_path.exists():
            problems.append(f"{truth.name}: no record")
            found[truth.name] = Found()
            continue
        record = json.loads(record_path.read_text())
        if record.get("errors"):
            problems.append(f"{truth.name}: {record['errors']}")
        clips = []
        for clip_id in record.get("kept", []):
            meta = json.loads((out / "metas" / f"{clip_id}.json").read_text())
            clips.append(tuple(meta["frame_span"]))
        clips.sort()
        if "transitions" in record:
            transitions = [tuple(t) for t in record["transitions"]]
        else:  # where one clip ends and the next starts (a gap: the frames between)
            transitions = [(end, start - 1) for (_, end), (start, _) in pairwise(clips)]
        found[truth.name] = Found(sorted(transitions), clips)
    return found, problems


def run_ours(videos: Path, truths: list[Truth], work: Path, detector: str) -> Run:
    run = Run(f"ours {detector}")
    out = work / f"ours-{detector}"
    shutil.rmtree(out, ignore_errors=True)
    log = work / f"ours-{detector}.log"
    rc, run.wall_s, run.cpu_s = measure(ours_command(videos, out, detector), log)
    if rc == 2 and not out.exists():
        run.skipped = _rejection(log)
        return run
    if rc != 0:
        run.failed = f"exit {rc} (log {log})"
    run.found, problems = read_ours(out, truths)
    if problems:
        run.note = "; ".join(problems[:3]) + (
            f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        )
    return run


# -- scoring ---------------------------------------------------------------------------------
@dataclass
class Score:
    cuts: int = 0
    cuts_found: int = 0
    dissolves: int = 0
    dissolves_found: int = 0
    dips: int = 0
    dips_found: int = 0
    detections: int = 0
    spurious: int = 0
    spurious_at_flashes: int = 0
    clips: int = 0
    clips_crossing: int = 0
    shot_s: float = 0.0
    lost_s: float = 0.0
    shots: int = 0
    shots_without_clip: int = 0
    #: what went wrong, each "video: what"
    missed: list[str] = field(default_factory=list)
    spurious_at: list[str] = field(default_factory=list)
    crossing: list[str] = field(default_factory=list)
    no_clip: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def score(truth: Truth, found: Found) -> Score:
    """How ``found`` fares against ``truth`` (the figures of the module's docstring)."""
    s = Score()
    fps, name = truth.fps, truth.name
    tol = round(TOLERANCE_S * fps)
    # a detection as the frame boundaries it covers: a cut before c is [c, c]
    bounds = [(first, last + 1) for first, last in found.transitions]
    s.detections = len(bounds)
    for c in truth.cuts:
        s.cuts += 1
        if any(lo - tol <= c <= hi + tol for lo, hi in bounds):
            s.cuts_found += 1
        else:
            s.missed.append(f"{name}: cut {c / fps:.2f} s")
    for kind, a, b in truth.spans:
        hit = any(lo <= b + tol and hi >= a - tol for lo, hi in bounds)
        what = f"{kind} {a / fps:.2f}-{b / fps:.2f} s ({(b - a) / fps:.1f} s)"
        if kind == "dissolve":
            s.dissolves += 1
            s.dissolves_found += hit
        else:
            s.dips += 1
            s.dips_found += hit
        if not hit:
            s.missed.append(f"{name}: {what}")
    true_spans = [(c, c) for c in truth.cuts] + [(a, b) for _, a, b in truth.spans]
    for lo, hi in bounds:
        if any(lo <= b + tol and hi >= a - tol for a, b in true_spans):
            continue
        s.spurious += 1
        at_flash = any(lo <= b + tol and hi >= a - tol for a, b in truth.flashes)
        s.spurious_at_flashes += at_flash
        where = f"{lo / fps:.2f} s" if hi - lo <= 1 else f"{lo / fps:.2f}-{hi / fps:.2f} s"
        s.spurious_at.append(f"{name}: {where}{' (a flash)' if at_flash else ''}")
    mixed = [(a, b) for _, a, b in truth.spans]
    for start, end in found.clips:
        s.clips += 1
        over_cut = any(start < c < end for c in truth.cuts)
        overlap = max((min(end, b) - max(start, a) for a, b in mixed), default=0)
        if over_cut or overlap > 1:
            s.clips_crossing += 1
            s.crossing.append(f"{name}: {start / fps:.2f}-{end / fps:.2f} s")
    for first, end in truth.shots:
        length = end - first
        s.shot_s += length / fps
        covered = sum(max(0, min(end, b) - max(first, a)) for a, b in _union(found.clips))
        s.lost_s += (length - covered) / fps
        if length >= SHOT_MIN_S * fps - 1e-9:
            s.shots += 1
            own = any(min(end, b) - max(first, a) > (b - a) / 2 for a, b in found.clips if b > a)
            if not own:
                s.shots_without_clip += 1
                s.no_clip.append(f"{name}: {first / fps:.2f}-{end / fps:.2f} s")
    return s


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def score_run(run: Run, truths: list[Truth]) -> dict[str, Score]:
    """Per category, and ``all``."""
    by: dict[str, Score] = {"all": Score()}
    for truth in truths:
        if truth.name not in run.found:
            continue
        s = score(truth, run.found[truth.name])
        by.setdefault(truth.category, Score()).add(s)
        by["all"].add(s)
    return by


# -- output ----------------------------------------------------------------------------------
HEADER = [
    "contender",
    "hard cuts",
    "dissolves",
    "dips",
    "spurious",
    "at flashes",
    "clips crossing",
    "lost s",
    "shots w/o clip",
    "wall s",
    "CPU s",
]


def row(run: Run, s: Score | None) -> list[str]:
    if s is None:
        return [run.label, *["-"] * (len(HEADER) - 1)]
    return [
        run.label,
        f"{s.cuts_found}/{s.cuts}",
        f"{s.dissolves_found}/{s.dissolves}",
        f"{s.dips_found}/{s.dips}",
        str(s.spurious),
        str(s.spurious_at_flashes),
        f"{s.clips_crossing}/{s.clips}",
        f"{s.lost_s:.1f}",
        f"{s.shots_without_clip}/{s.shots}",
        f"{run.wall_s:.1f}",
        f"{run.cpu_s:.1f}",
    ]


def report(
    runs: list[Run], scores: dict[str, dict[str, Score]], truths: list[Truth], misses: int
) -> None:
    seconds = sum(t.num_frames / t.fps for t in truths)
    scored = [r for r in runs if r.skipped is None]
    print(
        table(
            f"shot splitting on {len(truths)} generated videos ({seconds / 60:.1f} min; found: "
            f"within {TOLERANCE_S:g} s; lost s: seconds of shots in no clip)",
            HEADER,
            [row(r, scores[r.label]["all"]) for r in scored],
        )
    )
    categories = [c for c in CATEGORIES if any(t.category == c for t in truths)]
    cells = []
    for r in scored:
        line = [r.label]
        for c in categories:
            s = scores[r.label].get(c, Score())
            parts = [f"{s.cuts_found}/{s.cuts}"] if s.cuts else []
            spans = s.dissolves + s.dips
            parts += [f"~{s.dissolves_found + s.dips_found}/{spans}"] if spans else []
            line.append(" ".join([*parts, f"+{s.spurious}"]))
        cells.append(line)
    print(
        table(
            "per category: hard cuts found, ~dissolves and dips found, +spurious",
            ["contender", *categories],
            cells,
        )
    )
    for r in runs:
        if r.skipped:
            print(f"skipped {r.label}: {r.skipped}")
        if r.failed:
            print(f"!! {r.label}: {r.failed}")
        if r.note:
            print(f"note {r.label}: {r.note}")
    targets(scored, scores)
    for r in scored:
        lines = what_went_wrong(scores[r.label]["all"])
        if lines:
            shown = lines if misses < 0 else lines[:misses]
            print(f"{r.label}: what went wrong, in {len(lines)} videos")
            for line in shown:
                print(f"  {line}")
            if len(shown) < len(lines):
                print(f"  ... and {len(lines) - len(shown)} more videos (all in --json)")


def what_went_wrong(s: Score) -> list[str]:
    """One line per video: transitions missed, spurious ones, shots without a clip."""
    per: dict[str, dict[str, list[str]]] = {}
    for heading, entries in (
        ("missed", s.missed),
        ("spurious", s.spurious_at),
        ("no clip", s.no_clip),
    ):
        for entry in entries:
            name, what = entry.split(": ", 1)
            per.setdefault(name, {}).setdefault(heading, []).append(what)
    return [
        f"{name}: " + "; ".join(f"{h} {', '.join(w)}" for h, w in parts.items())
        for name, parts in sorted(per.items())
    ]


def targets(runs: list[Run], scores: dict[str, dict[str, Score]]) -> None:
    """Ours against PySceneDetect adaptive (the CLI's row, else the API's): hard cuts found at
    least and spurious at most its, more dissolves found than it, no shot without a clip."""
    theirs = next((r for r in runs if r.label.startswith("PySceneDetect CLI")), None)
    theirs = theirs or next((r for r in runs if r.label == "PySceneDetect API adaptive"), None)
    ours = [r for r in runs if r.label.startswith("ours")]
    if not ours:
        return
    base = scores[theirs.label]["all"] if theirs else None

    def versus(ok: bool | None, mine: str, their: str | None) -> str:
        return check(ok) + (f" ({mine})" if their is None else f" ({mine} vs {their})")

    rows = []
    for r in ours:
        s = scores[r.label]["all"]
        cuts = f"{s.cuts_found}/{s.cuts}"
        dissolves = f"{s.dissolves_found}/{s.dissolves}"
        if base is None:
            rows.append([r.label, cuts, str(s.spurious), dissolves])
        else:
            rows.append(
                [
                    r.label,
                    versus(s.cuts_found >= base.cuts_found, cuts, f"{base.cuts_found}/{base.cuts}"),
                    versus(s.spurious <= base.spurious, str(s.spurious), str(base.spurious)),
                    versus(
                        s.dissolves_found > base.dissolves_found if s.dissolves else None,
                        dissolves,
                        f"{base.dissolves_found}/{base.dissolves}",
                    ),
                ]
            )
        rows[-1].append(versus(s.shots_without_clip == 0, str(s.shots_without_clip), None))
    against = theirs.label if theirs else "nobody: PySceneDetect was not run"
    header = ["contender", "hard cuts found >= theirs", "spurious <= theirs"]
    header += ["dissolves found > theirs", "no shot >= 2 s w/o a clip"]
    print(table(f"targets (against {against})", header, rows))


def as_json(run: Run, by: dict[str, Score] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "wall_s": run.wall_s,  # exact: --from-json prints the same tables again
        "cpu_s": run.cpu_s,
        "skipped": run.skipped,
        "failed": run.failed,
        "note": run.note,
    }
    if by is not None:
        out["scores"] = {c: asdict(s) for c, s in by.items()}
        out["found"] = {name: asdict(f) for name, f in run.found.items()}
    return out


# -- the accuracy run ------------------------------------------------------------------------
def accuracy(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    specs = corpus_specs(args.quick)
    size = (160, 90, 30) if args.quick else (args.width, args.height, args.fps)
    begun = time.perf_counter()
    videos, truths = make_corpus(
        args.corpus, "quick" if args.quick else "shots", specs, *size, args.jobs
    )
    corpus_s = time.perf_counter() - begun
    print(
        f"  {len(truths)} videos: {sum(len(t.cuts) for t in truths)} hard cuts, "
        f"{sum(k == 'dissolve' for t in truths for k, _, _ in t.spans)} dissolves, "
        f"{sum(k == 'dip' for t in truths for k, _, _ in t.spans)} dips, "
        f"{sum(len(t.flashes) for t in truths)} flashes, {sum(len(t.shots) for t in truths)} shots"
    )
    runs: list[Run] = []
    if "cli" in args.theirs:
        env, how = ffmpeg_env(work / "bin")
        label = "PySceneDetect CLI adaptive" + (" split-video" if env else " (list only)")
        print(f"{label} ({how}) ...", flush=True)
        run = run_cli(videos, truths, work / "cli", env is not None, env, label)
        if env is None:
            run.note = f"split-video skipped: {how}"
        runs.append(run)
    for detector in (d for d in ("adaptive", "content", "histogram") if d in args.theirs):
        print(f"PySceneDetect API {detector} ...", flush=True)
        runs.append(run_api(videos, truths, detector))
    for detector in args.detectors:
        print(f"ours {detector} ...", flush=True)
        runs.append(run_ours(videos, truths, work, detector))
    scores = {r.label: score_run(r, truths) for r in runs if r.skipped is None}
    report(runs, scores, truths, args.misses)
    corpus = {"folder": str(videos.parent), "videos": len(truths), "seconds_to_get": corpus_s}
    return {
        "corpus": {**corpus, "truth": [asdict(t) for t in truths]},
        "contenders": {r.label: as_json(r, scores.get(r.label)) for r in runs},
    }


def reprint(path: Path, misses: int) -> dict[str, Any]:
    """The tables of an accuracy run saved with ``--json``, printed again."""
    figures = json.loads(path.read_text())
    truths = [Truth(**t) for t in figures["corpus"]["truth"]]
    runs, scores = [], {}
    for label, c in figures["contenders"].items():
        runs.append(Run(label, c["wall_s"], c["cpu_s"], c["skipped"], c["note"], c["failed"]))
        if "scores" in c:
            scores[label] = {category: Score(**v) for category, v in c["scores"].items()}
    print(f"from {path}: {figures.get('machine', '')}")
    report(runs, scores, truths, misses)
    return figures


# -- the speed case --------------------------------------------------------------------------
def speed(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if args.quick:  # the same timelines, tiny: to try the case out
        made = make_corpus(args.corpus, "speed-quick", speed_specs(2.0), 160, 90, 30, args.jobs)
    else:
        made = make_corpus(args.corpus, "speed", speed_specs(), 1280, 720, 30, args.jobs)
    videos, truths = made
    size = "10 s at 160x90" if args.quick else "60 s at 1280x720"
    env, how = ffmpeg_env(work / "bin")
    if env is None:
        print(f"!! {how}: PySceneDetect runs without split-video, which is not the issue's case")
    theirs_label = "PySceneDetect CLI detect-adaptive split-video"
    figures: dict[str, list[dict[str, Any]]] = {"theirs": [], "ours": []}
    for repeat in range(args.repeats):
        order = ["theirs", "ours"] if repeat % 2 == 0 else ["ours", "theirs"]
        for who in order:
            print(f"  [speed] {who}, repeat {repeat + 1} of {args.repeats} ...", flush=True)
            if who == "theirs":
                run = run_cli(
                    videos, truths, work / "speed-cli", env is not None, env, theirs_label, False
                )
            else:
                run = Run("ours (default shots)")
                out = work / "speed-ours"
                shutil.rmtree(out, ignore_errors=True)
                log = work / "speed-ours.log"
                rc, run.wall_s, run.cpu_s = measure(ours_command(videos, out, None), log)
                run.failed = None if rc == 0 else f"exit {rc} (log {log})"
                run.found, _ = read_ours(out, truths)
            if run.failed:
                print(f"  !! {run.label}: {run.failed}")
            cuts = score_run(run, truths)["all"] if run.found else Score()
            figures[who].append(
                {
                    "wall_s": run.wall_s,
                    "cpu_s": run.cpu_s,
                    "failed": run.failed,
                    "cuts_found": cuts.cuts_found,
                    "cuts": cuts.cuts,
                }
            )
    rows = []
    for who, label in (("theirs", theirs_label), ("ours", "ours: conveyor video (default shots)")):
        runs = figures[who]
        rows.append(
            [
                label,
                " ".join(f"{r['wall_s']:.1f}" for r in runs),
                " ".join(f"{r['cpu_s']:.1f}" for r in runs),
                fmt(statistics.median(r["wall_s"] for r in runs), ".1f"),
                fmt(statistics.median(r["cpu_s"] for r in runs), ".1f"),
                f"{runs[0]['cuts_found']}/{runs[0]['cuts']}" if runs[0]["cuts"] else "-",
            ]
        )
    print(
        table(
            f"speed: {len(truths)} videos of {size}, {sum(len(t.cuts) for t in truths)} "
            f"hard cuts, one after the other (theirs) or the folder (ours); {args.repeats} repeats",
            ["contender", "wall s", "CPU s", "median wall", "median CPU", "cuts found"],
            rows,
        )
    )
    print(f"  theirs: scenedetect -i V -o D detect-adaptive split-video, for V in {videos}")
    print(f"  ours:   {' '.join(ours_command(videos, Path('OUT'), None))}")
    wall = statistics.median(r["wall_s"] for r in figures["ours"]) / statistics.median(
        r["wall_s"] for r in figures["theirs"]
    )
    cpu = statistics.median(r["cpu_s"] for r in figures["ours"]) / statistics.median(
        r["cpu_s"] for r in figures["theirs"]
    )
    print(
        f"ours / theirs: wall {wall:.2f}x, CPU {cpu:.2f}x (target: wall at most 1x; the issue "
        f"measured 107.7 / 47.2 s wall, 204.6 / 77.5 CPU-s)"
    )
    return {"videos": str(videos), "runs": figures, "ours_over_theirs": {"wall": wall, "cpu": cpu}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        help="5 tiny videos of about 8 s, every contender (with --speed: 4 tiny ones of 10 s)",
    )
    p.add_argument("--speed", action="store_true", help="the issue's timing case instead")
    p.add_argument("--repeats", type=int, default=1, help="--speed: runs of each (default 1)")
    p.add_argument(
        "--detectors", default=DETECTORS, help=f"ours, comma-separated (default {DETECTORS})"
    )
    p.add_argument(
        "--theirs",
        default=",".join(THEIRS),
        help=f"PySceneDetect's, a subset of {','.join(THEIRS)} (default all; cli = the CLI's "
        "detect-adaptive, the others the API's detectors)",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        default=Path(tempfile.gettempdir()) / "conveyor-bench-shots",
        help="where the generated videos are kept (made when missing)",
    )
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=360)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument(
        "--jobs", type=int, default=int(usable_cores(os.cpu_count() or 1)), help="to make videos"
    )
    p.add_argument(
        "--conveyor",
        default=None,
        help="the conveyor command to run as ours (default: this environment's)",
    )
    p.add_argument("--outputs", type=Path, default=None, help="keep the runs' outputs here")
    p.add_argument(
        "--misses", type=int, default=12, help="videos whose misses are printed (-1: all)"
    )
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument(
        "--from-json", type=Path, default=None, help="print the tables of a saved run again"
    )
    args = p.parse_args(argv)
    CONVEYOR[:] = args.conveyor.split() if args.conveyor else []
    args.corpus = args.corpus.resolve()  # the commands get absolute paths
    args.detectors = [d.strip() for d in args.detectors.split(",") if d.strip()]
    args.theirs = [t.strip() for t in args.theirs.split(",") if t.strip()]
    unknown = set(args.theirs) - set(THEIRS)
    if unknown:
        p.error(f"--theirs: unknown {', '.join(sorted(unknown))} (known: {', '.join(THEIRS)})")
    if args.from_json is not None:
        return reprint(args.from_json, args.misses)
    machine = machine_line(os.cpu_count() or 1)
    print(machine)
    with contextlib.ExitStack() as stack:
        if args.outputs is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cvy-shots-")))
        else:
            work = args.outputs.resolve()
            work.mkdir(parents=True, exist_ok=True)
        figures = speed(args, work) if args.speed else accuracy(args, work)
    figures["machine"] = machine  # at the start; and the load at the end:
    figures["load_at_end"] = list(os.getloadavg())
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"figures: {args.json}")
    return figures


if __name__ == "__main__":
    main()
