"""A NeMo Curator-style pipeline (``examples/curator/text_pipeline.py``) on the executors
``conveyor.curator`` offers on this machine, side by side in one run: ``XennaExecutor`` in
streaming mode (Conveyor's streaming engine) and in batch mode (stage at a time), over the
same generated JSONL input. Printed per mode: wall time, documents per second, the first
output's time, and the ratio of the two.

    python benchmarks/curator.py --files 40 --rows 2000 --repeats 2

``--peer``: the same pipeline source on NeMo Curator itself (its ``XennaExecutor``:
Cosmos-Xenna on Ray, streaming) and on ``conveyor.curator``'s, each in a process of its own.
NeMo Curator is a peer installed apart (``make bench-curator``: ``pip install --no-deps
--target .venv/peers-curator``), put first on that process's ``PYTHONPATH`` only.

* The same source: ``examples/curator/text_pipeline.py`` is the template. Each side's copy is
  written out as a module whose ``from conveyor.curator.<module> import ...`` lines name the
  side's package, and nothing else changes (``PORTABLE``, ``RENAMED``: empty since the
  example is written to run on both). Both sides run that module's ``build(workdir)`` over
  the same input, on the module's own ``XennaExecutor`` in streaming mode.
* Resources: both declare 4 CPUs (the machine may have fewer) and 1 fake GPU. Cosmos-Xenna's
  streaming mode wants a worker for every stage at once (4 CPUs here) and refuses fewer;
  NeMo Curator gets ``cpu_allocation_percentage=1.0`` so that all 4 count (its 0.95 leaves
  ``int(3.8)`` = 3). Its cluster is a private Ray head started by its process as NeMo
  Curator's ``RayClient`` starts one (``ray start --head --block``, dashboard included), but
  on 127.0.0.2 with free ports, its own temp dir and token, ``--num-cpus 4 --num-gpus 1``,
  joined through ``RAY_ADDRESS`` by the executor's own ``ray.init``, and stopped as
  ``RayClient.stop`` does. Conveyor's is ``LocalBackend(num_cpus=4, num_gpus=1)``. The
  stages ask for the same ``Resources`` on both, but for the scorer's GPU share
  (``SIDE_EDITS``: Cosmos-Xenna finds GPUs with NVML, so Ray's fake ones are none to it, and
  the scorer asks NeMo Curator for ``gpus=0``).
* Measured the same way for both, by this process: wall from starting the process to its
  exit (interpreter, imports, and on NeMo Curator's side the Ray head's start and stop);
  CPU seconds of its whole tree, the larger of two lower bounds: ``RUSAGE_CHILDREN`` before
  and after (this process and the side's are subreapers, so orphans are waited for here, but
  Ray's raylet ignores SIGCHLD and its workers' time is lost to it) and the tree's processes
  sampled every 0.2 s with psutil (misses each process's last 0.2 s); peak RSS summed over
  the tree; and, reported by the process, the time of ``pipeline.run(executor)`` alone and
  the documents written (rows in the Parquet files) per second of that run.
* Repeats alternate which side goes first. Whatever of a side's tree outlives it is killed
  by pid and counted as ``lingering``.

    python benchmarks/curator.py --peer --files 80 --rows 8000 --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "examples" / "curator" / "text_pipeline.py"
PEER_PATH = ROOT / ".venv" / "peers-curator"
SIDES = ("curator", "conveyor")
#: the package each side's copy of the example imports from
PACKAGES = {"curator": "nemo_curator", "conveyor": "conveyor.curator"}
#: The example's source runs on NeMo Curator 1.4.0 as it is, its imports aside: keyword task
#: constructors (1.4.0 takes no ``task_id`` and orders ``dataset_name, data, _stage_perf,
#: _metadata``), a ``process`` next to ``process_batch`` (abstract there), ``super().__init__()``
#: in the composite (it makes what ``with_`` fills), GPUs read as ``allocation.gpus[i].index``
#: and ``stages.function_decorators`` (1.4.0's module name). ``conveyor.curator`` takes those
#: forms, and NeMo Curator 1.0's too.
PORTABLE: list[tuple[str, str]] = []
RENAMED: dict[str, dict[str, str]] = {}
#: Edits for one side only. Cosmos-Xenna 0.2.0 counts a node's GPUs with NVML (capped by
#: Ray's count), so a Ray head's declared GPUs are none to it where there is no GPU: on
#: NeMo Curator the scorer asks for no GPU (its other resources are the example's).
SIDE_EDITS = {"curator": [("Resources(cpus=1, gpus=0.25)", "Resources(cpus=1, gpus=0)")]}
MODULE = "curator_text_pipeline"
PR_SET_CHILD_SUBREAPER = 36
MIB = 1 << 20


# -- streaming and batch on conveyor.curator, in this process -----------------------------------
def run_once(mode: str, workdir: Path, text: Any) -> dict[str, float]:
    from conveyor.backends.local import LocalBackend
    from conveyor.curator.backends.xenna import XennaExecutor

    shutil.rmtree(workdir / "output", ignore_errors=True)
    executor = XennaExecutor({"execution_mode": mode}, backend=LocalBackend(num_gpus=1))
    begun = time.perf_counter()
    written = text.build(workdir).run(executor)
    wall = time.perf_counter() - begun
    docs = sum(len(__import__("pandas").read_parquet(p)) for task in written for p in task.data)
    return {"wall_s": wall, "docs": docs, "docs_per_s": docs / wall}


def modes(args: argparse.Namespace) -> dict[str, Any]:
    from tests.curator.examples import example

    text = example("text_pipeline")
    workdir = Path(tempfile.mkdtemp(prefix="curator-bench-"))
    try:
        text.write_inputs(workdir / "input", files=args.files, rows=args.rows)
        runs: dict[str, list[dict[str, float]]] = {"streaming": [], "batch": []}
        for repeat in range(args.repeats):
            order = ["streaming", "batch"] if repeat % 2 == 0 else ["batch", "streaming"]
            for mode in order:
                runs[mode].append(run_once(mode, workdir, text))
                r = runs[mode][-1]
                print(
                    f"{mode:9} repeat {repeat + 1}: {r['wall_s']:.2f} s, {r['docs']:.0f} docs, "
                    f"{r['docs_per_s']:.0f} docs/s",
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    best = {m: max(r["docs_per_s"] for r in rs) for m, rs in runs.items()}
    print(f"input: {args.files} JSONL files x {args.rows} rows")
    for mode, rate in best.items():
        print(f"  XennaExecutor({{'execution_mode': {mode!r}}}): best {rate:.0f} docs/s")
    print(f"  streaming / batch: {best['streaming'] / best['batch']:.2f}x")
    return {"files": args.files, "rows": args.rows, "runs": runs, "best_docs_per_s": best}


# -- the same source for both sides ------------------------------------------------------------
def pipeline_source(side: str) -> str:
    """The example's text with the side's imports and the edits above."""
    text = EXAMPLE.read_text()
    for old, new in [*PORTABLE, *SIDE_EDITS.get(side, [])]:
        if text.count(old) != 1:
            raise RuntimeError(f"{EXAMPLE.name} changed: expected {old!r} once")
        text = text.replace(old, new)
    renamed = RENAMED.get(side, {})

    def imports(match: re.Match[str]) -> str:
        module = renamed.get(match[1], match[1])
        return f"from {PACKAGES[side]}.{module} import"

    text, count = re.subn(r"^from conveyor\.curator\.(\S+) import", imports, text, flags=re.M)
    if count == 0:
        raise RuntimeError(f"{EXAMPLE.name} changed: no conveyor.curator imports")
    return text


# -- one side, in its own process --------------------------------------------------------------
@contextlib.contextmanager
def ray_head(temp: Path, log: Path, cpus: int, gpus: int, stop: dict[str, Any]) -> Any:
    """A private Ray head on 127.0.0.2 (free ports, own temp dir), started as NeMo Curator's
    ``RayClient`` starts one (``ray start --head --block``, dashboard included: Cosmos-Xenna
    lists actors through it); ``RAY_ADDRESS`` names it while it runs. Stopped by pid."""
    from tests.backends.ray_cluster import HEAD_IP, free_ports, free_range

    port, *ports = free_ports(HEAD_IP, 11)  # distinct: Ray checks
    base = free_range(HEAD_IP, 100)
    args = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
        f"--node-ip-address={HEAD_IP}", f"--port={port}",
        f"--num-cpus={cpus}", f"--num-gpus={gpus}",
        f"--temp-dir={temp}", f"--object-store-memory={512 * MIB}",
        "--include-dashboard=true", f"--dashboard-host={HEAD_IP}",
        f"--dashboard-port={ports[0]}",
        f"--ray-client-server-port={ports[1]}",
        f"--node-manager-port={ports[2]}",
        f"--object-manager-port={ports[3]}",
        f"--dashboard-agent-listen-port={ports[4]}",
        f"--dashboard-agent-grpc-port={ports[5]}",
        f"--metrics-export-port={ports[6]}",
        f"--runtime-env-agent-port={ports[7]}",
        f"--min-worker-port={base}", f"--max-worker-port={base + 99}",
        "--disable-usage-stats",
    ]  # fmt: skip
    # the dashboard's and autoscaler's metrics ports, as NeMo Curator's init_cluster sets them
    env = dict(
        os.environ,
        DASHBOARD_METRIC_PORT=str(ports[8]),
        AUTOSCALER_METRIC_PORT=str(ports[9]),
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=temp, start_new_session=True
        )
    address = f"{HEAD_IP}:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # as NeMo Curator's check_ray_responsive: `ray status` until it answers
            if proc.poll() is not None:
                raise RuntimeError(f"ray head exited early:\n{log.read_text()[-3000:]}")
            status = subprocess.run(
                [args[0], "status", f"--address={address}"],
                capture_output=True, text=True, env=env, check=False, timeout=60,
            )  # fmt: skip
            if status.returncode == 0 and "CPU" in status.stdout:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray head at {address} did not answer:\n{status.stdout}")
            time.sleep(0.5)
        os.environ["RAY_ADDRESS"] = address
        yield address
    finally:
        # as NeMo Curator's RayClient.stop: SIGTERM to the head's process group, 5 s, SIGKILL;
        # then whatever of it is left, by pid (this process is their subreaper). ``stop``:
        # whether SIGKILL was needed, and the names of what was left
        os.environ.pop("RAY_ADDRESS", None)
        group = os.getpgid(proc.pid)
        os.killpg(group, signal.SIGTERM)
        stop["sigkill"] = False
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            stop["sigkill"] = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            proc.wait()
        end_descendants(grace_s=1, names=stop.setdefault("leftovers", []))


def side_main(args: argparse.Namespace) -> None:
    """Run the pipeline once on ``args.side``'s executor; the figures to ``args.result``."""
    import psutil

    become_subreaper()  # what the Ray head leaves, when its parents exit, is ours to end
    workdir: Path = args.workdir
    figures: dict[str, Any] = {"side": args.side}
    sys.path.insert(0, str(workdir / "module"))
    # the side's package comes with the module's import lines; importing NeMo Curator also
    # sets what Cosmos-Xenna needs of the Ray head started next (RAY_MAX_LIMIT_FROM_API_SERVER
    # in the environment), as in a NeMo Curator script
    text = importlib.import_module(MODULE)
    figures["package"] = text.XennaExecutor.__module__
    figures["imports_s"] = time.time() - psutil.Process().create_time()
    with contextlib.ExitStack() as stack:
        if args.side == "curator":
            begun = time.perf_counter()
            # a short path: Ray's unix sockets live below it (107 characters at most)
            short = Path(tempfile.mkdtemp(prefix="cvy-ray-"))
            stack.callback(shutil.rmtree, short, ignore_errors=True)
            stop = figures.setdefault("head_stop", {})
            stack.enter_context(
                ray_head(short, workdir / "ray-head.log", args.cpus, args.gpus, stop)
            )
            figures["cluster_start_s"] = time.perf_counter() - begun
            # all the declared CPUs (its default, 0.95, leaves int(0.95 * 4) = 3)
            config = {"execution_mode": "streaming", "cpu_allocation_percentage": 1.0}
            executor = text.XennaExecutor(config)
        else:
            from conveyor.backends.local import LocalBackend

            backend = LocalBackend(num_cpus=args.cpus, num_gpus=args.gpus)
            executor = text.XennaExecutor({"execution_mode": "streaming"}, backend=backend)
        pipeline = text.build(workdir)
        begun = time.perf_counter()
        written = pipeline.run(executor)
        figures["run_s"] = time.perf_counter() - begun
        stopping = time.perf_counter()
    if args.side == "curator":
        figures["cluster_stop_s"] = time.perf_counter() - stopping
    import pyarrow.parquet as pq

    files = [p for task in written for p in task.data]
    figures["parquet_files"] = len(files)
    # the imports do not mix: which of these packages the process loaded
    tops = {name.partition(".")[0] for name in sys.modules}
    figures["loaded"] = sorted(tops & {"conveyor", "nemo_curator", "cosmos_xenna", "ray"})
    figures["docs"] = sum(pq.read_metadata(p).num_rows for p in files)
    args.result.write_text(json.dumps(figures))


# -- both sides, measured from here ------------------------------------------------------------
def end_descendants(grace_s: float, names: list[str] | None = None) -> int:
    """How many descendants of this process still run (their names appended to ``names``);
    they get ``grace_s`` to end, then are killed by pid, and all are waited for, zombies
    included (their CPU time then counts in ``RUSAGE_CHILDREN``)."""
    import psutil

    me = psutil.Process()
    left = me.children(recursive=True)
    running = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:  # a zombie has ended: waited for below
                running.append(proc.name())
    if names is not None:
        names.extend(running)
    _gone, alive = psutil.wait_procs(left, timeout=grace_s)
    deadline = time.monotonic() + 30
    while alive and time.monotonic() < deadline:
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        alive = me.children(recursive=True)
    return len(running)


def become_subreaper() -> None:
    """Descendants whose parent exits are handed to this process instead of init, so that
    they are waited for here and their CPU time counts (Ray's processes outlive theirs)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(side: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One process running ``side``; its figures and this process's measure of it."""
    side_dir = work / side
    shutil.rmtree(side_dir / "output", ignore_errors=True)
    (side_dir / "module").mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (side_dir / "input").unlink()
    (side_dir / "input").symlink_to(work / "input")
    (side_dir / "module" / f"{MODULE}.py").write_text(pipeline_source(side))
    result = side_dir / "result.json"
    result.unlink(missing_ok=True)
    # the side's module, and for NeMo Curator its packages, first on the path of the process
    # and of everything it starts (the Ray head and its workers inherit the environment)
    path = [str(side_dir / "module")]
    if side == "curator":
        path.insert(0, str(args.peer_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.update(args.ray_env)
    cmd = [
        sys.executable, __file__, "--side", side, "--workdir", str(side_dir),
        "--result", str(result), "--cpus", str(args.cpus), "--gpus", str(args.gpus),
    ]  # fmt: skip
    log = side_dir / "log.txt"
    import psutil
    from video_user import TreeWatch  # imported here: a side's process never loads it

    # this process's descendants (with ``become_subreaper``, one whose parent exits is
    # handed to this process and stays one)
    with open(log, "a") as sink, TreeWatch(psutil.Process(), include_root=False) as watch:
        cpu_before = children_cpu_s()
        begun = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
        proc.wait()
        wall = time.perf_counter() - begun
        watch.sample()
    lingering = end_descendants(grace_s=5)
    figures: dict[str, Any] = {
        "side": side,
        "wall_s": wall,
        "rusage_cpu_s": children_cpu_s() - cpu_before,
        "sampled_cpu_s": sum(watch.cpu.values()),
        "peak_rss": watch.peak_rss,
        "processes": len(watch.cpu),
        "lingering": lingering,
        "returncode": proc.returncode,
        "load_1min_after": os.getloadavg()[0],  # the machine is shared: how busy it was
    }
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{side}: exit {proc.returncode}, log {log}:\n{tail}")
    # each is a lower bound: the samples miss a process's last 0.2 s; RUSAGE_CHILDREN misses
    # the processes whose parent ignores SIGCHLD (Ray's raylet does: its workers' CPU time)
    figures["cpu_s"] = max(figures["rusage_cpu_s"], figures["sampled_cpu_s"])
    figures.update(json.loads(result.read_text()))
    figures["docs_per_s"] = figures["docs"] / figures["run_s"]
    return figures


def ray_env(work: Path) -> dict[str, str]:
    """Ray's settings for the NeMo Curator side: token authentication with a token of its
    own (``~/.ray`` is never read or written), no usage reports."""
    import secrets

    token = work / "ray-token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


COLUMNS = [
    ("wall_s", "process wall s", ".2f"),
    ("run_s", "pipeline.run s", ".2f"),
    ("docs_per_s", "docs/s (run)", ",.0f"),
    ("cpu_s", "CPU s (tree)", ".1f"),
    ("peak_rss", "peak RSS MB", ",.0f"),
]


def peer(args: argparse.Namespace) -> dict[str, Any]:
    from _common import table

    if not (args.peer_path / "nemo_curator").is_dir():
        raise SystemExit(f"NeMo Curator is not in {args.peer_path}: run `make bench-curator`")
    become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="cvy-curator-peer-"))
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    try:
        args.ray_env = ray_env(work)
        # the example's own input writer, as in the modes above
        sys.path.insert(0, str(EXAMPLE.parent))
        spec = importlib.util.spec_from_file_location("_text_inputs", EXAMPLE)
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        example.write_inputs(work / "input", files=args.files, rows=args.rows)
        for repeat in range(args.repeats):
            order = SIDES if repeat % 2 == 0 else SIDES[::-1]
            for position, side in enumerate(order):
                r = measure(side, work, args)
                r.update(repeat=repeat, position=position)
                runs[side].append(r)
                print(
                    f"  {side:8} repeat {repeat + 1}: process {r['wall_s']:.2f} s, run "
                    f"{r['run_s']:.2f} s, {r['docs']:,} docs, {r['docs_per_s']:,.0f} docs/s, "
                    f"CPU {r['cpu_s']:.1f} s (rusage {r['rusage_cpu_s']:.1f}, sampled "
                    f"{r['sampled_cpu_s']:.1f}), peak RSS "
                    f"{r['peak_rss'] / MIB:,.0f} MB, {r['processes']} processes, "
                    f"{r['lingering']} left",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    medians = {
        side: {key: statistics.median(r[key] for r in rs) for key, _, _ in COLUMNS}
        for side, rs in runs.items()
    }
    ratio = {
        key: medians["conveyor"][key] / medians["curator"][key] if medians["curator"][key] else None
        for key, _, _ in COLUMNS
    }
    docs = {side: sorted({r["docs"] for r in rs}) for side, rs in runs.items()}
    header = ["executor", *(label for _, label, _ in COLUMNS)]
    names = {
        "curator": "NeMo Curator XennaExecutor",
        "conveyor": "conveyor.curator XennaExecutor",
    }
    rows = [
        [names[side], *(_cell(k, medians[side][k], spec) for k, _, spec in COLUMNS)]
        for side in SIDES
    ]
    rows.append(["ours / Curator", *(f"{ratio[k]:.2f}x" for k, _, _ in COLUMNS)])
    title = (
        f"{args.files} JSONL files x {args.rows} rows = {args.files * args.rows:,} documents; "
        f"{args.cpus} CPUs, {args.gpus} GPU declared; medians of {args.repeats}"
    )
    print(table(title, header, rows))
    if docs["curator"] != docs["conveyor"]:
        print(f"  !! documents written differ: {docs}")
    return {
        "files": args.files,
        "rows": args.rows,
        "cpus": args.cpus,
        "gpus_declared": args.gpus,
        "versions": versions(args.peer_path),
        "runs": runs,
        "medians": medians,
        "ratio_ours_over_curator": ratio,
    }


def _cell(key: str, value: float, spec: str) -> str:
    return format(value / MIB if key == "peak_rss" else value, spec)


def versions(peer_path: Path) -> dict[str, str]:
    """The versions of the packages each side ran (read from the installed metadata)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions(path=[str(peer_path)]):
        found[dist.metadata["Name"]] = dist.version
    for name in ("ray", "conveyor", "pandas", "pyarrow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    found["python"] = sys.version.split()[0]
    return found


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--peer", action="store_true", help="NeMo Curator's XennaExecutor and ours")
    p.add_argument("--peer-path", type=Path, default=PEER_PATH, help="where NeMo Curator is")
    p.add_argument("--cpus", type=int, default=4, help="CPUs each side declares (--peer)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs each side declares (--peer)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (--peer)")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        side_main(args)
        return None
    figures = peer(args) if args.peer else modes(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
