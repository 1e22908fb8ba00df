"""Nothing outlives a driver killed with ``kill -9``.

A driver runs in a subprocess until its workers are busy (each marks a file), is killed with
SIGKILL, and then every process it had started must be gone within seconds, on the local
backend with its shared-memory payloads too. Run directories a crashed run left behind are
swept when the next ``LocalBackend`` starts, never those of a live run. On Ray, the actors of
a dead driver die with it (Ray's rule for actors that are not detached).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.backends import LocalBackend
from conveyor.backends.shm_store import LOCK_NAME, ShmStore, default_root
from conveyor.executors import StreamingExecutor

REPO = Path(__file__).resolve().parents[2]
#: how long everything a dead driver started may take to go (it takes about 2-3 s)
GONE_WITHIN_S = 10.0

# The stages live in the driver's ``__main__`` (they travel by value). ``Hold`` keeps its
# workers busy for a minute: one in a CPU loop, one asleep; each first marks ``MARKS/<pid>``.
LOCAL_DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from conveyor import Pipeline, ProcessingStage, Resources
    from conveyor.backends import LocalBackend
    from conveyor.executors import StreamingExecutor

    MARKS, SCENARIO = Path(sys.argv[1]), sys.argv[2]
    sys.path.insert(0, str(MARKS.parent))  # slow_import_cvy, for the root to preload

    class Make(ProcessingStage[int, bytes]):
        resources = Resources(cpus=0.5)
        num_workers = 1

        def process(self, task: int) -> bytes:
            return b"x" * (1 << 20)  # a payload in the run's shared-memory directory

    class Hold(ProcessingStage[bytes, int]):
        resources = Resources(cpus=0.5)
        num_workers = 2
        preload_modules = ("slow_import_cvy",) if SCENARIO == "root_importing" else ()

        def setup_on_node(self, node, worker) -> None:
            if SCENARIO == "host_in_node_setup":
                (MARKS / str(os.getpid())).touch()
                time.sleep(60)

        def process(self, task: bytes) -> int:
            (MARKS / str(os.getpid())).touch()
            try:  # the first one spins, the other sleeps
                open(MARKS.parent / "spinner", "x").close()
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    pass
            except FileExistsError:
                time.sleep(60)
            return len(task)

    backend = LocalBackend(num_cpus=2)
    Pipeline("p", [Make(), Hold()]).run(StreamingExecutor(backend), range(40))
    """
)
#: how many processes mark the file when the driver is where the scenario wants it
MARKS_WANTED = {"busy_workers": 2, "root_importing": 1, "host_in_node_setup": 1}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


class Drivers:
    """Driver subprocesses of one test, and the pids they started (killed at the end: once
    a driver is dead its processes are no longer our children, so the test must know them)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.pids: set[int] = set()

    def start(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stderr=subprocess.PIPE)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            with contextlib.suppress(psutil.Error):
                self.pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        _kill(self.pids)


@pytest.fixture
def drivers() -> Iterator[Drivers]:
    started = Drivers()
    try:
        yield started
    finally:
        started.stop_all()


def _wait_marks(marks: Path, count: int, proc: subprocess.Popen[bytes]) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"the driver exited early ({proc.returncode}):\n{err[-3000:]}")
        return len(list(marks.iterdir())) >= count

    _wait_for(f"{count} marked processes", ready, 60)


# -- local backend ------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", list(MARKS_WANTED))
def test_local_processes_and_payloads_go_with_a_killed_driver(
    scenario: str, tmp_path: Path, drivers: Drivers
) -> None:
    """busy_workers: one worker in a CPU loop, one asleep (deaf to their sockets);
    root_importing: the root in a slow preload import; host_in_node_setup: a host in a
    long ``setup_on_node``. Each needs the parent-death signal, not only the socket's EOF."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "slow_import_cvy.py").write_text(
        f"import os, time\nopen({str(marks)!r} + '/' + str(os.getpid()), 'w').close()\n"
        "time.sleep(60)\n"
    )
    proc = drivers.start(["-c", LOCAL_DRIVER, str(marks), scenario])
    _wait_marks(marks, MARKS_WANTED[scenario], proc)
    tree = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    drivers.pids.update(tree)
    stores = list(default_root().glob(f"conveyor-{proc.pid}-*"))
    assert len(stores) == 1 and (stores[0] / LOCK_NAME).exists()
    marked = {int(p.name) for p in marks.iterdir()}
    assert marked <= tree  # the marked processes are among those the driver started
    if scenario == "busy_workers":
        # root, two hosts, the two held workers (Make's worker may have done its 40 inputs
        # and gone: they all fit in its output queue)
        assert len(tree) >= 5
        assert any(f.stat().st_size >= 1 << 20 for f in stores[0].iterdir())  # payloads

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = time.monotonic()
    _wait_for(
        "the processes of the killed driver to exit",
        lambda: not any(_alive(pid) for pid in tree),
        GONE_WITHIN_S,
    )
    _wait_for("its payload directory to go", lambda: not stores[0].exists(), 2.0)
    assert time.monotonic() - killed_at < GONE_WITHIN_S


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_leftovers_of_a_crashed_run_are_swept_at_the_next_start() -> None:
    """A run directory whose driver is gone goes when a backend starts; a live one stays.

    Who is alive is judged by the lock the driver holds (a recycled pid does not fool it),
    and by the pid in the name for a directory without a lock file.
    """
    base = default_root()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = subprocess.Popen(  # another live run, holding its directory's lock
        [
            sys.executable,
            "-c",
            "import sys; from conveyor.backends.shm_store import ShmStore;"
            "print(ShmStore.create().root, flush=True); sys.stdin.read()",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    live_pid = _sleeper()
    made: list[Path] = []
    backend = LocalBackend(num_cpus=1)
    try:
        assert owner.stdout is not None
        live_locked = Path(owner.stdout.readline().strip())
        assert live_locked.is_dir()

        def leftover(pid: int, locked: bool) -> Path:
            path = base / f"conveyor-{pid}-{os.urandom(4).hex()}"
            path.mkdir()
            (path / "d-0").write_bytes(b"x" * 4096)
            if locked:
                (path / LOCK_NAME).touch()  # nobody holds it: its driver is gone
            made.append(path)
            return path

        dead_locked = leftover(dead.pid, locked=True)
        recycled = leftover(live_pid.pid, locked=True)  # the pid now names another process
        dead_unlocked = leftover(dead.pid, locked=False)
        live_unlocked = leftover(live_pid.pid, locked=False)
        backend.open()
        assert not dead_locked.exists() and not recycled.exists() and not dead_unlocked.exists()
        assert live_locked.is_dir() and live_unlocked.is_dir()
        assert backend.store.root.is_dir()
    finally:
        backend.shutdown()
        owner.communicate(timeout=30)  # EOF on stdin: it exits
        live_pid.kill()
        live_pid.wait()
        for path in made:
            with contextlib.suppress(FileNotFoundError):
                for child in path.iterdir():
                    child.unlink()
                path.rmdir()
    ShmStore.create().destroy()  # the owner is gone now: its directory is swept
    assert not live_locked.exists()


class Slow(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)
    num_workers = 2

    def process(self, task: int) -> int:
        time.sleep(0.02)
        return task


def test_root_outlives_the_driver_thread_that_started_it() -> None:
    """The parent-death signal also fires when the *thread* that forked the root exits; the
    root must tell that from the driver's death and go on serving."""
    backend = LocalBackend(num_cpus=2)
    box: dict[str, Any] = {}

    def start() -> None:
        box["run"] = Pipeline("p", [Slow()]).stream(StreamingExecutor(backend), range(30))
        box["first"] = next(box["run"])

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    (root,) = [p for p in psutil.Process().children() if "local_host" in " ".join(p.cmdline())]
    time.sleep(0.3)  # the signal has come and gone by now
    assert root.is_running() and root.status() != psutil.STATUS_ZOMBIE
    outputs = [box["first"], *box["run"]]
    assert sorted(outputs) == list(range(30))
    assert box["run"].result.stats["Slow"].worker_deaths == 0


# -- Ray ----------------------------------------------------------------------------------
def test_private_ray_temp_dirs_of_killed_drivers_are_swept() -> None:
    """A private cluster's temp dir is locked by its driver; the next one sweeps those of
    drivers that are gone, and keeps a live driver's and those without a lock."""
    pytest.importorskip("ray")
    from conveyor.backends.ray import private_temp_dir

    stale = Path(tempfile.mkdtemp(prefix="conveyor-ray-"))
    (stale / LOCK_NAME).touch()  # nobody holds it: its driver was killed
    legacy = Path(tempfile.mkdtemp(prefix="conveyor-ray-"))  # no lock: not judged
    path, lock = private_temp_dir()
    try:
        assert not stale.exists() and legacy.is_dir() and Path(path).is_dir()
        other, other_lock = private_temp_dir()
        os.close(other_lock)
        shutil.rmtree(other)
        assert Path(path).is_dir()  # the second sweep kept the live one
    finally:
        os.close(lock)
        for left in (path, legacy, stale):
            shutil.rmtree(left, ignore_errors=True)


RAY_DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import ray
    from conveyor import Pipeline, ProcessingStage, Resources
    from conveyor.backends import RayBackend
    from conveyor.executors import StreamingExecutor

    MARKS = Path(sys.argv[1])

    class Hold(ProcessingStage[int, int]):
        resources = Resources(cpus=1)
        num_workers = 3

        def process(self, task: int) -> int:
            actor = ray.get_runtime_context().get_actor_id()
            (MARKS / str(os.getpid())).write_text(actor)
            time.sleep(120)
            return task

    Pipeline("p", [Hold()]).run(StreamingExecutor(RayBackend()), range(20))
    """
)


@pytest.mark.timeout(180)
def test_ray_actors_go_with_a_killed_driver(
    ray_cluster: Any, tmp_path: Path, drivers: Drivers
) -> None:
    """The backend's actors are not detached, so Ray kills them when their driver dies."""
    ray = pytest.importorskip("ray")
    from ray._private.state import actors

    from conveyor.backends.ray import RayConnection

    RayConnection(ray_cluster.address).connect()  # to read the actor table
    marks = tmp_path / "marks"
    marks.mkdir()
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.address)
    proc = drivers.start(["-c", RAY_DRIVER, str(marks)], env=env)
    _wait_marks(marks, 3, proc)
    workers = {int(p.name): p.read_text() for p in marks.iterdir()}
    drivers.pids.update(workers)
    assert all(actors(actor_id).get("State") == "ALIVE" for actor_id in workers.values())

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_for(
        "the killed driver's actors to be dead",
        lambda: all(actors(actor_id).get("State") == "DEAD" for actor_id in workers.values()),
        30,
    )
    _wait_for("their processes to exit", lambda: not any(_alive(pid) for pid in workers), 30)

    def cpus_free() -> bool:
        return ray.available_resources().get("CPU", 0.0) >= ray.cluster_resources()["CPU"]

    _wait_for("the cluster's CPUs to be free again", cpus_free, 15)
