"""LocalBackend specifics: devices, lifecycle hooks, payload store, validation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.backends import LocalBackend, shm_store
from conveyor.backends.shm_store import INLINE_LIMIT, ShmStore, sweep_stale
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.errors import BackendError
from conveyor.executors import StreamingExecutor
from tests.backends.ray_stages import (
    BatchSizes,
    Nice,
    Paced,
    SpinOnCoreZero,
    Threads,
    partial_batches,
)


class RecordEnv(ProcessingStage[int, tuple[str, str]]):
    """Each worker notes its CUDA_VISIBLE_DEVICES and placement in a file at setup."""

    def __init__(self, out: Path, resources: Resources, workers: int) -> None:
        self.out = out
        self.resources = resources
        self.num_workers = workers

    def setup(self, worker: WorkerInfo) -> None:
        line = f"{os.environ['CUDA_VISIBLE_DEVICES']}|{worker.gpu_fraction}|{worker.gpu_ids}"
        (self.out / worker.worker_id).write_text(line)

    def process(self, task: int) -> tuple[str, str]:
        time.sleep(0.01)
        return (os.environ["CUDA_VISIBLE_DEVICES"], str(task))


def _env_lines(out: Path) -> list[str]:
    return sorted(p.read_text() for p in out.iterdir())


def test_fractional_gpu_workers_share_a_device(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.1, gpus=0.5), workers=4)
    Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=2)), range(8))
    assert _env_lines(tmp_path) == ["0|0.5|(0,)", "0|0.5|(0,)", "1|0.5|(1,)", "1|0.5|(1,)"]


def test_whole_gpu_workers_get_distinct_devices(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.1, gpus=1), workers=2)
    Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=2)), range(4))
    assert _env_lines(tmp_path) == ["0|1.0|(0,)", "1|1.0|(1,)"]


def test_multi_gpu_worker_sees_all_its_devices(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.1, gpus=2), workers=1)
    Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=2)), range(2))
    assert _env_lines(tmp_path) == ["0,1|1.0|(0, 1)"]


def test_cpu_workers_see_no_gpu(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.5), workers=2)
    result = Pipeline("p", [stage]).run(
        StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=2)), range(4)
    )
    assert {env for env, _ in result.outputs} == {""}


class Decode(ProcessingStage[int, int]):
    """Holds one NVDEC unit and no GPU compute; notes the device it sees."""

    resources = Resources(cpus=0.1, nvdecs=1)

    def __init__(self, out: Path) -> None:
        self.out = out

    def setup(self, worker: WorkerInfo) -> None:
        devices = os.environ["CUDA_VISIBLE_DEVICES"]
        (self.out / worker.worker_id).write_text(f"{devices}|{worker.gpu_ids}")

    def process(self, task: int) -> int:
        time.sleep(0.05)
        return task


def test_declared_decoders_bound_the_workers_on_each_gpu(tmp_path: Path) -> None:
    """Two GPUs of 2 NVDEC units each: a busy decoding stage grows to 4 workers, two per
    device, however many CPUs it could use; each sees its device."""
    backend = LocalBackend(num_cpus=8, num_gpus=2, nvdecs_per_gpu=2, nvencs_per_gpu=0)
    assert backend.nodes()[0].nvdecs_per_gpu == 2
    result = Pipeline("p", [Decode(tmp_path)]).run(StreamingExecutor(backend), range(200))
    assert sorted(result.outputs) == list(range(200))
    assert result.stats["Decode"].peak_workers == 4
    assert {line.split("|")[0] for line in _env_lines(tmp_path)} <= {"0", "1"}  # a device each
    with pytest.raises(ValueError, match="nvdecs_per_gpu must be >= 0"):
        LocalBackend(nvdecs_per_gpu=-1)


def test_a_stage_asking_for_units_no_gpu_has_is_a_clear_error() -> None:
    class Encode(ProcessingStage[int, int]):
        resources = Resources(cpus=0.5, nvencs=1)

        def process(self, task: int) -> int:
            return task

    backend = LocalBackend(num_cpus=2, num_gpus=1, nvdecs_per_gpu=7, nvencs_per_gpu=0)
    with pytest.raises(BackendError, match=r"'Encode'.*needs 1 NVENC units of one GPU and no GP"):
        Pipeline("p", [Encode()]).run(StreamingExecutor(backend), range(3))


def test_gpu_memory_becomes_a_fraction_of_the_placed_gpu(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.1, gpu_memory_gb=20), workers=4)
    backend = LocalBackend(num_cpus=2, num_gpus=1, gpu_memory_gb=80)
    Pipeline("p", [stage]).run(StreamingExecutor(backend), range(8))
    assert _env_lines(tmp_path) == ["0|0.25|(0,)"] * 4


def test_gpu_memory_without_known_gpu_memory_is_a_clear_error(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=0.1, gpu_memory_gb=20), workers=1)
    with pytest.raises(BackendError, match=r"gpu_memory_gb=20\): .* no node says how much"):
        Pipeline("p", [stage]).run(
            StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=1)), range(2)
        )


def test_stage_that_fits_nowhere_is_a_clear_error(tmp_path: Path) -> None:
    stage = RecordEnv(tmp_path, Resources(cpus=1, gpus=1), workers=1)
    with pytest.raises(BackendError, match="needs a GPU and no node has one"):
        Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=0)), [1])


def test_stages_that_fit_alone_but_not_together_say_so() -> None:
    """Each stage fits the node; the two first workers do not fit it together."""
    half = Resources(cpus=0.5, gpus=0.6)
    stages = [RecordEnv(Path("/nonexistent"), half, workers=1).with_(name=n) for n in "ab"]
    backend = LocalBackend(num_cpus=2, num_gpus=1)
    with pytest.raises(BackendError, match=r"stage\(s\) b next to one worker of every other"):
        Pipeline("p", stages).run(StreamingExecutor(backend), [1])


class Lifecycle(ProcessingStage[int, int]):
    """Writes marker files so the test can check the order and count of hook calls."""

    resources = Resources(cpus=0.25)
    num_workers = 3

    def __init__(self, out: Path) -> None:
        self.out = out

    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        time.sleep(0.2)  # a slow download: setups must wait for it
        (self.out / f"node-{node.node_id}-{os.getpid()}").touch()

    def setup(self, worker: WorkerInfo) -> None:
        if not list(self.out.glob("node-*")):
            raise RuntimeError("setup ran before setup_on_node finished")
        (self.out / f"setup-{worker.worker_id}").touch()

    def teardown(self) -> None:
        (self.out / f"teardown-{os.getpid()}").touch()

    def process(self, task: int) -> int:
        time.sleep(0.01)
        return task


def test_lifecycle_hooks_run_once_in_order(tmp_path: Path) -> None:
    result = Pipeline("p", [Lifecycle(tmp_path)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), range(30)
    )
    assert len(result.outputs) == 30
    assert len(list(tmp_path.glob("node-*"))) == 1
    assert len(list(tmp_path.glob("setup-*"))) == 3
    assert len(list(tmp_path.glob("teardown-*"))) == 3


def test_shm_store_round_trips_large_payloads_without_copying_arrays(tmp_path: Path) -> None:
    store = ShmStore(tmp_path, "t")
    array = np.arange(1_000_000, dtype=np.float64)
    handle = store.put({"a": array, "meta": "x"}, "7")
    assert isinstance(handle.ref, str) and handle.nbytes > array.nbytes
    back = ShmStore.get(handle)
    assert back["meta"] == "x" and np.array_equal(back["a"], array)
    assert not back["a"].flags.owndata  # a view of the mapping, not a copy
    back["a"][0] = -1  # private mapping: writable, and the file is untouched
    assert ShmStore.get(handle)["a"][0] == 0
    ShmStore.delete([handle])
    assert not Path(handle.ref).exists()


def test_payloads_held_keep_no_file_open_and_are_unmapped_once_dropped(tmp_path: Path) -> None:
    """A caller holding a run's thousand array outputs held a thousand descriptors (mmap
    keeps one per mapping): past the common limit of 1,024 the process could open no file."""
    import gc

    store = ShmStore(tmp_path, "t")
    handle = store.put(np.arange(1 << 18, dtype=np.float64), "0")  # 2 MiB: mapped
    fds = len(os.listdir("/proc/self/fd"))
    held = [ShmStore.get(handle) for _ in range(50)]
    assert len(os.listdir("/proc/self/fd")) == fds
    assert all(np.array_equal(a, np.arange(1 << 18)) for a in held)
    mapped = Path("/proc/self/maps").read_text().count(handle.ref)
    assert mapped >= 50
    del held
    gc.collect()
    assert Path("/proc/self/maps").read_text().count(handle.ref) == mapped - 50
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with open(empty, "rb") as f:
        assert shm_store._mapped(f.fileno(), 0).nbytes == 0


def test_a_payload_past_the_mappings_a_process_may_have_is_read_as_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vm.max_map_count (65,530) bounds the mappings: a caller holding more outputs."""
    import errno

    store = ShmStore(tmp_path, "t")
    handle = store.put(np.arange(1 << 18, dtype=np.float64), "0")

    def refused(fd: int, size: int) -> memoryview:
        raise OSError(errno.ENOMEM, "cannot map")

    monkeypatch.setattr(shm_store, "_mapped", refused)
    back = ShmStore.get(handle)
    assert np.array_equal(back, np.arange(1 << 18)) and back.flags.writeable
    monkeypatch.setattr(
        shm_store, "_mapped", lambda fd, size: (_ for _ in ()).throw(OSError(errno.EIO, "io"))
    )
    with pytest.raises(OSError, match="io"):
        ShmStore.get(handle)


def test_payloads_under_a_mib_are_copied_not_mapped(tmp_path: Path) -> None:
    """A process may hold only so many mappings: the small ones spend none."""
    store = ShmStore(tmp_path, "t")
    handle = store.put(np.arange(10_000, dtype=np.float64), "0")  # 80 KB: a file, copied
    assert isinstance(handle.ref, str)
    held = [ShmStore.get(handle) for _ in range(20)]
    assert Path("/proc/self/maps").read_text().count(handle.ref) == 0
    assert all(np.array_equal(a, np.arange(10_000)) and a.flags.writeable for a in held)


def test_an_output_read_by_an_atexit_handler_is_still_mapped(tmp_path: Path) -> None:
    """Unmapping at exit ran before handlers registered earlier: a segfault (exit 139)."""
    script = (
        "import atexit, numpy as np\n"
        "from conveyor.backends.shm_store import ShmStore\n"
        "held = []\n"
        "atexit.register(lambda: print('sum', held[0].sum()))\n"
        f"store = ShmStore({str(tmp_path)!r}, 't')\n"
        "held.append(ShmStore.get(store.put(np.ones(1 << 18), 'x')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sum 262144.0"


def test_small_payloads_travel_inline(tmp_path: Path) -> None:
    store = ShmStore(tmp_path, "t")
    handle = store.put(list(range(10)), "0")
    assert isinstance(handle.ref, bytes) and handle.nbytes <= INLINE_LIMIT
    assert ShmStore.get(handle) == list(range(10))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        2**64 + 5,
        -(10**400),
        True,
        None,
        1.5,
        float("nan"),
        "é\ud800",
        b"\0" * 9,
        "x" * 40_000,
    ],
    ids=repr,
)
def test_plain_values_are_stored_as_cloudpickle_would_store_them(
    tmp_path: Path, value: Any
) -> None:
    """``ShmStore.put`` pickles plain values with ``pickle`` (its fast path): the same bytes,
    inline or in a file alike, as ``cloudpickle`` writes."""
    import cloudpickle

    store = ShmStore(tmp_path, "t")
    handle = store.put(value, "0")
    data = cloudpickle.dumps(value, protocol=5)
    if isinstance(handle.ref, bytes):
        assert handle.ref == data
    else:
        assert Path(handle.ref).read_bytes()[shm_store._HEADER.size :] == data
    assert handle.nbytes == len(data)
    back = ShmStore.get(handle)
    assert back == value or value != value  # NaN


def test_a_payload_a_full_store_cannot_hold_travels_in_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A small /dev/shm (a container's 64 MB) that filled failed every task that wrote a
    payload there, and every run again."""
    import builtins
    import errno

    store = ShmStore(tmp_path, "t")
    array = np.arange(100_000, dtype=np.float64)
    real_open = builtins.open

    def full(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(tmp_path)) and "w" in mode:
            stream = real_open(path, mode, *args, **kwargs)
            stream.close()  # (the file is made, then the write fails, as on a full disk)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    with caplog.at_level("WARNING"):
        handles = [store.put({"a": array}, str(i)) for i in range(2)]
    monkeypatch.setattr(builtins, "open", real_open)
    assert all(isinstance(h.ref, bytes) and h.nbytes > array.nbytes for h in handles)
    assert np.array_equal(ShmStore.get(handles[0])["a"], array)
    assert list(tmp_path.iterdir()) == []  # the partial file went
    said = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert len(said) == 1 and "--shm-size" in said[0]  # once per process


def test_scratch_files_go_to_dev_shm_only_where_it_has_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tempfile

    from conveyor import scratch

    if not (os.path.isdir(scratch.SHM) and os.access(scratch.SHM, os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    free = scratch.free_bytes(scratch.SHM)
    assert free is not None
    monkeypatch.setattr(scratch, "MIN_FREE_BYTES", free // 2)
    assert scratch.scratch_dir() == scratch.SHM
    monkeypatch.setattr(scratch, "MIN_FREE_BYTES", free * 2)  # as a 64 MB /dev/shm
    assert scratch.scratch_dir() == tempfile.gettempdir()
    assert scratch.scratch_dirs() == [scratch.SHM, tempfile.gettempdir()]


def test_a_run_sweeps_crashed_runs_payloads_from_every_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the folder chosen was swept: a crash's payloads left in a /dev/shm short of
    room kept every later run off it, and stayed."""
    from conveyor.backends import shm_store

    folders = [tmp_path / "shm", tmp_path / "tmp"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    for folder in folders:
        (folder / f"conveyor-{int(dead.stdout)}-abcd1234").mkdir(parents=True)
    monkeypatch.setattr(shm_store, "scratch_dirs", lambda: [str(f) for f in folders])
    monkeypatch.setattr(shm_store, "scratch_dir", lambda: str(folders[1]))
    store = ShmStore.create()
    try:
        assert [list(f.iterdir()) for f in folders] == [[], [store.root]]
    finally:
        store.destroy()


def test_corrupt_payload_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"garbage" * 100)
    from conveyor.engine.messages import Handle

    with pytest.raises(ValueError, match="corrupt"):
        ShmStore.get(Handle(str(bad), 700, "0"))


def test_stale_run_directories_are_swept(tmp_path: Path) -> None:
    dead = tmp_path / "conveyor-999999999-abc"
    alive = tmp_path / f"conveyor-{os.getpid()}-abc"
    dead.mkdir()
    alive.mkdir()
    sweep_stale(tmp_path)
    assert not dead.exists() and alive.exists()


def test_run_directory_is_removed_after_the_run() -> None:
    backend = LocalBackend(num_cpus=2)
    seen: list[Any] = []

    class Big(ProcessingStage[int, bytes]):
        resources = Resources(cpus=0.5)

        def process(self, task: int) -> bytes:
            return b"x" * (1 << 20)

    run = Pipeline("p", [Big()]).stream(StreamingExecutor(backend), range(3))
    seen.append(next(run))
    root = backend.store.root
    assert root.exists()
    seen.extend(run)
    assert len(seen) == 3 and not root.exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_cpus": 0}, "num_cpus must be > 0"),
        ({"num_gpus": -1}, "num_gpus must be a whole number >= 0"),
        ({"num_gpus": 1.5}, "whole number"),
        ({"memory_budget_bytes": 0}, "memory_budget_bytes must be > 0"),
        ({"memory_gb": 0}, "memory_gb must be > 0"),
        (
            {"memory_gb": 0.5, "memory_budget_bytes": 1 << 30},
            r"memory_gb=0.5 leaves nothing for workers once queued payloads have their 1.00 GB",
        ),
    ],
)
def test_invalid_backend_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LocalBackend(**kwargs)


def test_declared_resources_are_honoured_and_detection_works() -> None:
    backend = LocalBackend(num_cpus=64, num_gpus=8, memory_budget_bytes=1 << 20)
    node = backend.nodes()[0]
    assert (node.cpus, node.gpus) == (64, 8)
    assert backend.memory_budget_bytes == 1 << 20
    detected = LocalBackend()
    assert detected.nodes()[0].cpus == len(os.sched_getaffinity(0))


def test_memory_for_workers_is_the_limit_less_the_payload_budget() -> None:
    backend = LocalBackend(num_cpus=1, memory_gb=2, memory_budget_bytes=512 << 20)
    assert backend.nodes()[0].memory_bytes == (2 << 30) - (512 << 20)
    # by default: what the machine has available, which is more than nothing
    assert 0 < LocalBackend(num_cpus=1).nodes()[0].memory_bytes <= psutil.virtual_memory().total


def test_cuda_visible_devices_restricts_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.backends import devices

    monkeypatch.setattr(devices, "_nvml", lambda: (["0", "1", "2", "3"], 80.0, "NVIDIA L4"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    backend = LocalBackend(num_cpus=1)
    assert backend.gpu_ids == ["2", "3"] and backend.gpu_memory_gb == 80.0
    # an L4's video engines, known from its model; declared values win
    assert (backend.nvdecs_per_gpu, backend.nvencs_per_gpu) == (4, 2)
    declared = LocalBackend(num_cpus=1, nvdecs_per_gpu=1)
    assert (declared.nvdecs_per_gpu, declared.nvencs_per_gpu) == (1, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert LocalBackend(num_cpus=1).gpu_ids == []


class Burn(ProcessingStage[int, int]):
    """Spends ``cpu_s`` of CPU, or sleeps as long: busy either way, CPU only in the first."""

    def __init__(self, cpu_s: float, sleep: bool) -> None:
        self.cpu_s = cpu_s
        self.sleep = sleep
        self.name = "sleep" if sleep else "burn"

    def process(self, task: int) -> int:
        if self.sleep:
            time.sleep(self.cpu_s)
        else:
            end = time.process_time() + self.cpu_s
            while time.process_time() < end:
                pass
        return task


def test_stage_stats_count_cpu_time_apart_from_busy_time() -> None:
    stages = [Burn(0.1, sleep=False), Burn(0.1, sleep=True)]
    result = Pipeline("p", stages).run(StreamingExecutor(LocalBackend(num_cpus=2)), range(6))
    burn, sleep = result.stats["burn"], result.stats["sleep"]
    assert burn.cpu_s >= 0.55 and burn.busy_s >= burn.cpu_s * 0.9
    assert sleep.busy_s >= 0.55 and sleep.cpu_s < 0.1


class Heavy(ProcessingStage[int, int]):
    """Each worker holds ``mb`` of its own memory from setup on; tasks wait (no CPU)."""

    def __init__(self, mb: int) -> None:
        self.mb = mb
        self.resources = Resources(cpus=0.5)

    def setup(self, worker: WorkerInfo) -> None:
        self.ballast = np.ones(self.mb << 20, dtype=np.uint8)  # touched: resident, private

    def process(self, task: int) -> int:
        time.sleep(0.15)
        return task


@pytest.mark.parametrize("limit", [True, False])
def test_workers_measured_heavy_are_not_started_beyond_the_memory_limit(limit: bool) -> None:
    # 200 MB per worker and 0.55 GB for workers: the first two fit, a third would not;
    # without the limit the same stage grows with its backlog on 8 declared CPUs
    budget = 64 << 20
    memory_gb = ((550 << 20) + budget) / 2**30 if limit else None
    backend = LocalBackend(num_cpus=8, memory_budget_bytes=budget, memory_gb=memory_gb)
    result = Pipeline("p", [Heavy(200)]).run(StreamingExecutor(backend), range(60))
    stats = result.stats["Heavy"]
    assert sorted(result.outputs) == list(range(60))
    assert 200 << 20 <= stats.worker_memory_bytes < 400 << 20  # its own, not the libraries
    if limit:
        assert stats.peak_workers == 2
    else:
        assert stats.peak_workers >= 4


class Cyclic(ProcessingStage[int, int]):
    """Each task leaves 40 MB behind in a reference cycle (as a PyAV frame whose side data
    was read does): only the cycle collector frees it."""

    resources = Resources(cpus=1)

    def process(self, task: int) -> int:
        held: dict[str, Any] = {"data": np.ones(40 << 20, dtype=np.uint8)}
        held["self"] = held
        return task


def test_workers_free_the_cycles_their_tasks_leave_behind() -> None:
    backend = LocalBackend(num_cpus=1)
    result = Pipeline("p", [Cyclic()]).run(StreamingExecutor(backend), range(20))
    assert sorted(result.outputs) == list(range(20))
    # 20 tasks, 800 MB of garbage in all: a worker holds at most about one task's worth
    assert result.stats["Cyclic"].worker_memory_bytes < 160 << 20


class Preloaded(ProcessingStage[int, str]):
    """Names a module it never imports itself; the host must already have it at node setup."""

    preload_modules = ("wave",)

    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        import sys

        if "wave" not in sys.modules:
            raise RuntimeError("wave was not preloaded before setup_on_node")

    def process(self, task: int) -> str:
        import sys

        return "yes" if "wave" in sys.modules else "no"


def test_preload_modules_are_imported_before_the_host_starts() -> None:
    result = Pipeline("p", [Preloaded()]).run(StreamingExecutor(LocalBackend()), range(3))
    assert result.outputs == ["yes"] * 3


def test_a_preload_module_that_does_not_exist_stops_the_run() -> None:
    from conveyor.errors import StageSetupError

    stage = Preloaded()
    stage.preload_modules = ("no_such_module_anywhere",)
    with pytest.raises(StageSetupError, match="no_such_module_anywhere"):
        Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend()), range(3))


def test_preload_modules_must_be_a_tuple_of_names() -> None:
    from conveyor.errors import PipelineBuildError

    stage = Preloaded()
    stage.preload_modules = "torch"  # type: ignore[assignment]
    with pytest.raises(PipelineBuildError, match="preload_modules must be a tuple"):
        Pipeline("p", [stage]).build()


@pytest.mark.parametrize("priority", [True, False])
def test_upstream_workers_run_at_a_lower_priority(priority: bool) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    stages = [Nice().with_(name="first"), Nice().with_(name="last")]
    executor = StreamingExecutor(LocalBackend(num_cpus=2), stage_priority=priority)
    result = Pipeline("p", stages).run(executor, range(3))
    seen = {tuple(n - base for n in nice) for nice in result.outputs}
    # setup runs at the usual priority: at the start every stage's setup is on the way to
    # the first output, and the stages downstream would otherwise set up first
    assert seen == ({(0, 10, 0, 0)} if priority else {(0, 0, 0, 0)})


@pytest.mark.parametrize(("elastic", "expected"), [(True, [2]), (False, [1])])
def test_a_batch_sent_while_the_other_core_idles_gets_two_threads(
    elastic: bool, expected: list[int]
) -> None:
    executor = StreamingExecutor(LocalBackend(num_cpus=2), elastic_threads=elastic)
    result = Pipeline("p", [Threads()]).run(executor, range(1))
    assert result.outputs == expected


def test_a_batch_sent_to_a_dead_worker_is_reported_undelivered() -> None:
    """A worker killed while idle looks idle until its death is seen: what is sent to it
    then never arrives, and the backend says so (the controller charges no input for it)."""
    from conveyor.engine.messages import WorkerDied, WorkerPlacement, WorkerReady

    spec = Pipeline("p", [_Echo()]).build()[0]
    backend = LocalBackend(num_cpus=1)
    backend.open()
    try:
        backend.start_worker("w", spec, WorkerPlacement("local"))
        deadline = time.monotonic() + 30
        while not any(isinstance(e, WorkerReady) for e in backend.poll(0.1)):
            assert time.monotonic() < deadline, "the worker never got ready"
        pid = backend.worker_pids()["w"]
        os.kill(pid, signal.SIGKILL)
        while True:
            try:  # one that ends while it is looked at has ended
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except (psutil.Error, OSError):
                break
            time.sleep(0.01)
        backend.submit("w", [(7, [backend.put(1, "1")])])
        died: list[WorkerDied] = []
        while not died:
            assert time.monotonic() < deadline, "the death was never reported"
            died = [e for e in backend.poll(0.1) if isinstance(e, WorkerDied)]
        assert died[0].undelivered == (7,)
    finally:
        backend.shutdown()


class _Echo(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)

    def process(self, task: int) -> int:
        return task


def test_workers_run_the_drivers_conveyor_whatever_the_current_folder_holds(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys
    import textwrap

    # a folder holding another "conveyor" (an older checkout, say), the driver started in it
    shadow = tmp_path / "checkout"
    (shadow / "conveyor").mkdir(parents=True)
    (shadow / "conveyor" / "__init__.py").write_text("raise ImportError('the other one')\n")
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            """
            from conveyor import Pipeline, processing_stage
            from conveyor.backends import LocalBackend
            from conveyor.executors import StreamingExecutor

            @processing_stage
            def double(x):
                return 2 * x

            result = Pipeline("p", [double]).run(StreamingExecutor(LocalBackend()), [1, 2])
            print(sorted(result.outputs))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=shadow, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 4]"


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat")
def test_time_waiting_for_a_core_is_measured_apart_from_a_stage_s_work() -> None:
    check_core_wait_apart(LocalBackend(num_cpus=2))


def check_core_wait_apart(backend: Any) -> None:
    """Three workers on one core: a task's wall time is well over its work, and what sizes
    the stage (its measured task time) is the work (its CPU time), not the wait."""
    from tests.engine.test_controller import Snapshots

    monitor = Snapshots()
    result = Pipeline("p", [SpinOnCoreZero()]).run(
        StreamingExecutor(backend, monitors=[monitor]), range(60)
    )
    assert sorted(result.outputs) == list(range(60))
    stats = result.stats["SpinOnCoreZero"]
    work = SpinOnCoreZero.WORK_S
    assert stats.mean_service_s >= 1.5 * work  # the wall time: the workers share one core
    measured = [s.task_time_s for t in monitor.ticks for s in t.stages if s.task_time_s]
    # the work and what a call costs besides (Ray's round trip), without the wait
    assert measured and 0.8 * work <= measured[-1] < 0.7 * stats.mean_service_s


def test_a_batch_that_waited_batch_wait_s_goes_partial(tmp_path: Path) -> None:
    # an input every 50 ms into batches of 8: with a 0.1 s wait each holds two or three
    pipeline = Pipeline("p", [Paced(0.05), BatchSizes(0.1)])
    sizes = pipeline.run(StreamingExecutor(LocalBackend(num_cpus=2)), range(40)).outputs
    assert sum(sizes) == 40 and max(sizes) <= 8
    assert partial_batches(sizes) >= 3
    full = Pipeline("p", [Paced(0.01), BatchSizes(None)])
    sizes = full.run(StreamingExecutor(LocalBackend(num_cpus=2)), range(40)).outputs
    assert sorted(sizes) == [8] * 5  # without a wait: full batches only


class FailsTeardown(ProcessingStage[int, int]):
    def process(self, task: int) -> int:
        return task

    def teardown(self) -> None:
        raise OSError("flush of buffered rows failed")


def test_a_teardown_that_fails_is_said_not_lost(capfd: pytest.CaptureFixture[str]) -> None:
    """It was swallowed without a word: a teardown that flushes buffered rows lost them."""
    result = Pipeline("p", [FailsTeardown()]).run(
        StreamingExecutor(LocalBackend(num_cpus=1)), range(3)
    )
    assert sorted(result.outputs) == [0, 1, 2]  # every output was reported before
    err = capfd.readouterr().err
    assert "conveyor: stage 'FailsTeardown', worker FailsTeardown-0: teardown failed" in err
    assert "OSError: flush of buffered rows failed" in err


class _Array(ProcessingStage[int, Any]):
    def process(self, task: int) -> Any:
        return np.full(100_000, task)


def test_a_result_dropped_is_freed_at_once_not_by_the_garbage_collector() -> None:
    """The controller held its event handlers as bound methods: a cycle that kept the run's
    result and its outputs (their shared memory too) until the collector ran."""
    import gc
    import weakref

    gc.disable()
    try:
        result = Pipeline("p", [_Array()]).run(
            StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=range(3)
        )
        assert len(result.outputs) == 3
        freed = weakref.ref(result)
        del result
        assert freed() is None
    finally:
        gc.enable()


class _Stuck(ProcessingStage[int, int]):
    def process(self, task: int) -> int:
        time.sleep(60)
        return task


def test_a_second_interrupt_while_workers_finish_kills_them_and_still_cleans_up() -> None:
    """Ctrl-C stops the run and lets busy workers finish (up to 10 s); a second one used to
    land in that cleanup and leave the processes and the run's shared memory behind."""
    import signal as signals
    import threading

    from conveyor.backends.shm_store import default_root

    def interrupt_at(*seconds: float) -> None:
        for delay in seconds:
            threading.Timer(delay, os.kill, (os.getpid(), signals.SIGINT)).start()

    start = time.monotonic()
    # SIGINT as in a terminal (a shell's background job, ``make test &``, ignores it)
    saved = signals.signal(signals.SIGINT, signals.default_int_handler)
    try:
        interrupt_at(1.5, 3.0)
        with pytest.raises(KeyboardInterrupt):
            Pipeline("p", [_Stuck()]).run(
                StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=range(2)
            )
    finally:
        signals.signal(signals.SIGINT, saved)
    assert time.monotonic() - start < 8  # not the 10 s the workers were given
    time.sleep(0.5)
    assert [p for p in psutil.Process().children(recursive=True) if p.is_running()] == []
    assert not list(default_root().glob(f"conveyor-{os.getpid()}-*"))


_LOGGING_SCRIPT = """
import logging, sys
from conveyor import Pipeline, ProcessingStage
from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
log = logging.getLogger("mine.stage")
class Talk(ProcessingStage[int, int]):
    def setup(self, worker):
        log.info("set up")
    def process(self, task):
        log.debug("detail %s", task)
        log.info("task %s", task)
        return task
if __name__ == "__main__":
    exec(sys.argv[1])
    Pipeline("p", [Talk()]).run(
        StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=range(2))
"""


@pytest.mark.parametrize(
    ("setup", "lines", "absent"),
    [
        (
            "logging.basicConfig(level=logging.INFO, format='<%(levelname)s|%(name)s> "
            "%(message)s')",
            ["<INFO|mine.stage> set up", "<INFO|mine.stage> task 0", "<INFO|mine.stage> task 1"],
            "detail",
        ),
        (  # a "{" format: the root process died of it, and the run with it
            "logging.basicConfig(level=logging.INFO, format='{levelname}/{message}', style='{')",
            ["INFO/task 0"],
            "detail",
        ),
        (  # the handler's own level counts
            "logging.basicConfig(level=logging.DEBUG); "
            "logging.getLogger().handlers[0].setLevel(logging.WARNING)",
            [],
            "task 0",
        ),
        (  # a named logger's level too
            "logging.basicConfig(level=logging.WARNING); "
            "logging.getLogger('mine').setLevel(logging.DEBUG)",
            ["DEBUG:mine.stage:detail 0", "INFO:mine.stage:task 0"],
            None,
        ),
        (  # a file handler is not copied: workers do not write the file from many processes
            "logging.basicConfig(level=logging.INFO, filename='run.log')",
            [],
            "task 0",
        ),
    ],
)
def test_stages_log_as_the_driver_configured_its_logging(
    tmp_path: Path, setup: str, lines: list[str], absent: str | None
) -> None:
    """Workers are fresh processes: a ``logging.basicConfig`` in the user's script did not
    reach them (their INFO lines vanished, their warnings came unformatted)."""
    script = tmp_path / "logs.py"
    script.write_text(_LOGGING_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), setup],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert set(lines) <= set(done.stderr.splitlines()), done.stderr
    if absent is not None:
        assert absent not in done.stderr


def test_a_run_iterated_by_one_thread_is_stopped_by_another() -> None:
    """``close()`` from a watchdog thread raised "generator already executing" and the run
    went on."""
    import threading

    run = Pipeline("p", [Paced(0.05)]).stream(
        StreamingExecutor(LocalBackend(num_cpus=1)), range(10_000)
    )
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            run.close()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    start = time.monotonic()
    outputs = 0
    with run:
        for _ in run:
            outputs += 1
            if outputs == 3:
                threading.Timer(0.5, stop).start()
    assert errors == []
    assert outputs < 10_000 and time.monotonic() - start < 10
    assert not run.result.completed and not run.running


def test_a_run_closed_from_another_thread_while_the_loop_body_runs_ends_cleanly() -> None:
    """The close ran the shutdown in the closing thread, and the iterating thread's next
    ``next()`` raised "generator already executing"."""
    import threading

    run = Pipeline("p", [Paced(0.01)]).stream(
        StreamingExecutor(LocalBackend(num_cpus=1)), range(10_000)
    )
    outputs = 0
    with run:
        for _ in run:
            outputs += 1
            if outputs == 2:
                threading.Timer(0.1, run.close).start()
            time.sleep(0.3)  # the body runs when the close comes
    assert outputs < 50 and not run.result.completed and not run.running


def test_a_run_closed_before_it_started_runs_nothing() -> None:
    run = Pipeline("p", [Paced(0.01)]).stream(
        StreamingExecutor(LocalBackend(num_cpus=1)), range(20)
    )
    run.close()
    assert list(run) == []
    assert not run.result.completed
    assert [p for p in psutil.Process().children(recursive=True) if p.is_running()] == []
