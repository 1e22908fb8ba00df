"""The Ray backend and the Ray Data executor on a real two-node Ray cluster on loopback.

The session's cluster (``tests/backends/conftest.py``): a head on 127.0.0.2 and a second node
on 127.0.0.3, 2 CPUs and 2 fake GPUs each. After every test all of its CPUs and GPUs must be
free again: a worker actor left alive would hold them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar
from unittest import mock

import pytest

ray = pytest.importorskip("ray")

from conveyor import AutoscaleConfig, Pipeline, Resources, StageSetupError  # noqa: E402
from conveyor.backends import LocalBackend, RayBackend  # noqa: E402
from conveyor.backends import ray as ray_backend  # noqa: E402
from conveyor.backends.ray import RayConnection, RayPayload, encode  # noqa: E402
from conveyor.engine.messages import (  # noqa: E402
    BatchesDone,
    WorkerDied,
    WorkerPlacement,
    WorkerReady,
)
from conveyor.errors import BackendError  # noqa: E402
from conveyor.executors import BatchExecutor, RayDataExecutor, StreamingExecutor  # noqa: E402
from conveyor.stage import ProcessingStage  # noqa: E402
from tests.backends import ray_stages as st  # noqa: E402
from tests.backends.ray_cluster import (  # noqa: E402
    RANGE_FLOOR,
    LocalRayCluster,
    NodeExited,
    free_range,
)

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def address(ray_cluster: LocalRayCluster) -> Iterator[str]:
    """The cluster's address, with this process connected (as a joining RayBackend does)."""
    RayConnection(ray_cluster.address).connect()
    yield ray_cluster.address
    # every actor a test started is gone: the cluster's CPUs and GPUs are all free again
    deadline = time.monotonic() + 15
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        busy = {k: total[k] - free.get(k, 0.0) for k in ("CPU", "GPU") if k in total}
        if all(v < 1e-6 for v in busy.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(v < 1e-6 for v in busy.values()), f"resources still held after the test: {busy}"


def node_ids() -> dict[str, str]:
    return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


def run(stages: list[ProcessingStage[Any, Any]], tasks: Any, backend: Any, batch: bool = False):
    executor = (BatchExecutor if batch else StreamingExecutor)(backend)
    return Pipeline("p", stages).run(executor, initial_tasks=tasks)


# -- connecting and input validation ------------------------------------------------------
def test_import_conveyor_does_not_import_ray() -> None:
    code = (
        "import sys, conveyor, conveyor.backends, conveyor.executors\n"
        "from conveyor.backends import LocalBackend\n"
        "from conveyor.executors import StreamingExecutor, BatchExecutor\n"
        "from conveyor import Pipeline\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
        "from conveyor.backends import RayBackend\n"
        "assert 'ray' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_worker_port_ranges_stay_clear_of_rays_fixed_ports() -> None:
    """A worker node refuses to start when its worker ports cover the client server's 10001
    (CI once drew 10000-10099); the kernel hands single ports out from 32768 up."""
    for draw in (0, 218):  # the lowest and the highest range free_range can hand out
        with mock.patch.object(secrets, "randbelow", return_value=draw):
            base = free_range("127.0.0.1", 100)
        assert base >= RANGE_FLOOR and base + 99 < 32768
        assert not base <= 10001 <= base + 99


class _ReusingSocket:
    """A socket whose kernel hands out the lowest port no open socket holds, as Linux may
    hand out again a port it has just seen closed."""

    open_ports: ClassVar[set[int]] = set()

    def __init__(self) -> None:
        self.port: int | None = None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = min(set(range(50000, 50100)) - self.open_ports)
        self.open_ports.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.2", self.port)

    def close(self) -> None:
        self.open_ports.discard(self.port)

    def __enter__(self) -> _ReusingSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.mark.parametrize("head", [True, False])
def test_a_test_nodes_ports_are_distinct_even_where_the_kernel_reuses_a_closed_one(
    head: bool, tmp_path: Path
) -> None:
    """Ray refuses to start a node that names one port for two of its components (a whole
    group of Ray tests once failed at setup so: the object manager's port and the dashboard
    agent's were one)."""
    started: list[list[str]] = []
    cluster = LocalRayCluster(tmp_path, port=1)
    with (
        mock.patch("tests.backends.ray_cluster.socket.socket", _ReusingSocket),
        mock.patch(
            "tests.backends.ray_cluster.subprocess.Popen",
            side_effect=lambda args, **_: started.append(args) or mock.Mock(pid=1),
        ),
    ):
        cluster._start("127.0.0.2", head=head)
    names = [a.split("=")[0] for a in started[0]]
    ports = [
        a.split("=")[1]
        for a, name in zip(started[0], names, strict=True)
        if name.endswith("-port") and not name.endswith("worker-port")
    ]
    assert len(ports) == (8 if head else 6) and len(set(ports)) == len(ports)


@pytest.mark.parametrize(
    ("logs", "starts", "fails"),
    [
        (["ValueError: Ray component gcs is trying to use a port number 6"], 2, False),
        (["OSError: [Errno 98] Address already in use"], 2, False),
        (["Address already in use", "Address already in use"], 2, True),  # once more only
        (["ModuleNotFoundError: No module named 'ray.scripts'"], 1, True),  # not worth one
    ],
)
def test_a_test_cluster_whose_port_was_taken_starts_once_more_on_other_ports(
    logs: list[str], starts: int, fails: bool, tmp_path: Path
) -> None:
    """Two clusters of one test run share the loopback addresses: one may take a port the
    other chose before that one's node bound it."""
    cluster = LocalRayCluster(tmp_path)
    exits = iter(logs)

    def wait(count: int) -> None:
        log = next(exits, None)
        if log is not None:
            raise NodeExited("127.0.0.2", log)

    with (
        mock.patch.object(cluster, "_start") as start_node,
        mock.patch.object(cluster, "_wait_nodes", side_effect=wait),
        mock.patch.object(cluster, "stop") as stop,
    ):
        if fails:
            with pytest.raises(NodeExited, match="exited early"):
                cluster.start(workers=1)
        else:
            assert cluster.start(workers=1) is cluster
    assert start_node.call_count == 2 * starts  # a head and a worker node each time
    assert stop.call_count == len(logs)  # each exited start is cleared away


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"address": ""}, "address must be None, 'auto' or 'host:port'"),
        ({"num_cpus": 0}, "num_cpus must be > 0"),
        ({"num_gpus": 1.5}, "num_gpus must be a whole number"),
        ({"num_gpus": -1}, "num_gpus must be a whole number"),
        ({"memory_budget_bytes": 0}, "memory_budget_bytes must be > 0"),
        ({"gpu_memory_gb": -1}, "gpu_memory_gb must be > 0"),
        ({"schedule_timeout_s": 0}, "schedule_timeout_s must be > 0"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayBackend(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
        ({"max_workers_per_stage": 0}, "max_workers_per_stage must be None or >= 1"),
        ({"max_blocks": 0}, "max_blocks must be >= 1"),
        ({"rows_per_block": 0}, "rows_per_block must be None or >= 1"),
        ({"gpu_memory_gb": 0}, "gpu_memory_gb must be > 0"),
        ({"num_cpus": -2}, "num_cpus must be > 0"),
    ],
)
def test_ray_data_bad_arguments_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayDataExecutor(**kwargs)


def test_ray_data_blocks_cut_before_a_stage_that_asks_no_cpu_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``rows_per_block``, the block size took the name of the source rows, and a
    later stage asking no CPU (sized by those rows) failed the plan: ``len()`` of an int."""
    from conveyor.executors.ray_data import RayDataRun

    class Dataset:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, Any]]] = []

        def map_batches(self, *_: Any, **kwargs: Any) -> Dataset:
            self.calls.append(("map", kwargs))
            return self

        def repartition(self, **kwargs: Any) -> Dataset:
            self.calls.append(("repartition", kwargs))
            return self

    made = Dataset()
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray.data, "from_items", lambda *_, **__: made)
    monkeypatch.setattr(ray.data, "TaskPoolStrategy", lambda **_: None)

    class Same(ProcessingStage[int, int]):
        def process(self, task: int) -> int:
            return task

    specs = Pipeline("p", [Same(), Same().with_(name="free", resources=Resources(cpus=0))]).build()
    run = RayDataRun(RayDataExecutor(rows_per_block=64), specs, [1, 2, 3], "p")
    assert run._plan([{"i": 1}, {"i": 2}, {"i": 3}]) is made
    assert [c for c, _ in made.calls] == ["map", "repartition", "map"]
    assert made.calls[1][1] == {"target_num_rows_per_block": 64}


@pytest.mark.parametrize("kind", ["streaming", "ray_data"])
def test_a_run_with_nothing_to_do_starts_no_ray(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume of a finished output started a private cluster (9 s) to find nothing to do."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started for a run with nothing to do")

    monkeypatch.setattr(ray, "init", refuse)
    executor = (
        StreamingExecutor(RayBackend(num_cpus=2)) if kind == "streaming" else RayDataExecutor()
    )
    result = Pipeline("p", [st.Slow("s", 0.0)]).run(executor, initial_tasks=[])
    assert result.completed and result.outputs == [] and result.counts["inputs"] == 0


@pytest.mark.parametrize(
    ("executor", "resources", "message"),
    [
        ("streaming", Resources(cpus=0.5, gpus=64), "needs 64 GPUs on one node and no node"),
        ("ray_data", Resources(cpus=0.5, gpus=64), "needs 64 GPUs on one node and no node"),
        # Ray reserves CPUs for its actors: without this check Ray Data waited for ever
        ("ray_data", Resources(cpus=1000), "needs 1000 CPUs on one node and no node has more"),
    ],
)
def test_a_stage_no_node_can_host_is_refused_before_the_run(
    address: str, executor: str, resources: Resources, message: str
) -> None:
    stage = st.Slow("huge", 0.0).with_(resources=resources)
    chosen = StreamingExecutor(RayBackend(address)) if executor == "streaming" else None
    with pytest.raises(BackendError, match=rf"stage 'huge' \(.*\): it {message}"):
        Pipeline("p", [stage]).run(chosen or RayDataExecutor(address), initial_tasks=range(3))


def test_ray_data_actor_pools_the_cluster_cannot_hold_together_are_refused(
    address: str, tmp_path: Path
) -> None:
    """Each fits a node, all three do not fit the cluster's 4 CPUs: one actor never started
    and Ray Data waited for it for ever."""
    stages = [st.WhereAmI(name, Resources(cpus=1.5), None, 0.0, None) for name in ("a", "b", "c")]
    with pytest.raises(BackendError, match=r"actor pools hold 4.5 CPUs .*\(a 1.5, b 1.5, c 1.5\)"):
        Pipeline("p", stages).run(RayDataExecutor(address), initial_tasks=range(3))
    gpus = [st.WhereAmI(name, Resources(cpus=0.25, gpus=2), None) for name in ("d", "e", "f")]
    with pytest.raises(BackendError, match=r"actor pools hold 6 GPUs .*\(d 2, e 2, f 2\)"):
        Pipeline("p", gpus).run(RayDataExecutor(address), initial_tasks=range(3))
    # a share of a GPU's memory counted as no GPU at all
    shared = [st.WhereAmI("g", Resources(cpus=0.25, gpu_memory_gb=8), 8)]
    with pytest.raises(BackendError, match=r"actor pools hold 6.4 GPUs .*\(g 6.4\)"):
        Pipeline("p", shared).run(
            RayDataExecutor(address, gpu_memory_gb=10), initial_tasks=range(3)
        )


def test_an_address_nothing_answers_at_is_said_at_once() -> None:
    """ray.init retried it for minutes, printing only its own retries."""
    import socket

    from conveyor.backends.ray import check_answers

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_answers(f"127.0.0.1:{listening.getsockname()[1]}")  # something answers
        closed = listening.getsockname()[1]
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at 127.0.0.1:{closed}"):
        check_answers(f"127.0.0.1:{closed}")
    with pytest.raises(ValueError, match="is not host:port"):
        check_answers("127.0.0.1")
    check_answers("auto")  # Ray finds the cluster of this machine itself
    check_answers("ray://127.0.0.1:1")  # a Ray Client URL is Ray's to connect


def test_a_cluster_refusing_the_driver_s_token_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray said "Failed to connect to Ray cluster at ..." after 20 lines of its retries, the
    token refusal only in its exception's chain (a ray start cluster asks for tokens)."""
    import conveyor.backends.ray as ray_backend

    def refused(**kwargs: object) -> None:
        try:
            raise RuntimeError("Unauthenticated: RPC error: InvalidAuthToken")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390") from cause

    monkeypatch.setattr(ray_backend, "check_answers", lambda address: None)
    monkeypatch.setattr(ray_backend.RayConnection, "_init", staticmethod(refused))
    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    with pytest.raises(ConnectionError, match=r"refused this driver's token.*RAY_AUTH_MODE=token"):
        ray_backend.RayConnection("127.0.0.2:6390").connect()

    def other(**kwargs: object) -> None:
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.2:6390")

    monkeypatch.setattr(ray_backend.RayConnection, "_init", staticmethod(other))
    with pytest.raises(ConnectionError, match=r"^Failed to connect"):  # other causes as Ray said
        ray_backend.RayConnection("127.0.0.2:6390").connect()


def test_the_cluster_is_asked_whether_it_has_gpus(address: str) -> None:
    from conveyor.cli_common import cluster_has_gpus

    assert cluster_has_gpus(address)  # its nodes' declared GPUs; this machine has none


def test_joining_a_cluster_rejects_declared_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    connection = RayConnection("127.0.0.2:1", num_cpus=2)
    with pytest.raises(ValueError, match="num_cpus/num_gpus declare the resources of a private"):
        connection.connect()


def test_a_held_private_cluster_outlives_the_runs_within_the_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Semantic dedup's four passes each started and stopped a cluster (26.8 s where the
    local backend took 2.4 s), and printed its dashboard's URL each time."""
    up: list[bool] = []
    calls = {"init": 0, "shutdown": 0}

    def init(**kwargs: Any) -> None:
        calls["init"] += 1
        up.append(True)

    def shutdown() -> None:
        calls["shutdown"] += 1
        up.clear()

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(up))
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(RayConnection, "_init", staticmethod(init))
    executor = StreamingExecutor(RayBackend(num_cpus=2))
    connection = executor.backend.connection
    with executor.held():
        for _ in range(3):  # what each run does with it
            connection.connect()
            connection.disconnect()
        assert calls == {"init": 1, "shutdown": 0} and up
    assert calls == {"init": 1, "shutdown": 1} and not up
    assert connection.temp_dir is None  # its private folder went with it
    connection.connect()
    connection.disconnect()  # outside a block: each run its own, as before
    assert calls == {"init": 2, "shutdown": 2}


def test_what_a_connection_asks_ray_init_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The private cluster's settings and the caller's own reach ``ray.init``; joining a
    cluster takes only the node address and the caller's (the knob audit found none of
    these named by a test)."""
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(RayConnection, "_init", staticmethod(lambda **kw: asked.append(kw)))
    monkeypatch.setattr(ray_backend, "check_answers", lambda address: None)  # no cluster here
    private = RayConnection(
        None, num_cpus=3, num_gpus=1, object_store_memory=2**28, node_ip_address="127.0.0.3",
        init_kwargs={"namespace": "mine"},
    )  # fmt: skip
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    private.connect()
    try:
        wanted = {"num_cpus": 3, "num_gpus": 1, "object_store_memory": 2**28}
        assert asked[0].items() >= {**wanted, "_node_ip_address": "127.0.0.3"}.items()
        assert asked[0]["address"] == "local" and asked[0]["namespace"] == "mine"
    finally:
        private.disconnect()  # its private temporary folder
    RayConnection("127.0.0.2:6390", init_kwargs={"namespace": "theirs"}).connect()
    assert asked[1]["address"] == "127.0.0.2:6390" and asked[1]["namespace"] == "theirs"
    assert "num_cpus" not in asked[1] and "object_store_memory" not in asked[1]


def test_backend_used_before_open_is_a_clear_error() -> None:
    with pytest.raises(BackendError, match="RayBackend used before open"):
        RayBackend().nodes()


def test_payload_encoding_measures_without_copying() -> None:
    import numpy as np

    small = encode({"a": 1})
    assert small.inline is not None and small.nbytes == len(small.inline)
    array = np.zeros(1 << 20, dtype=np.uint8)
    big = encode(array)
    assert big.inline is None and big.store is array and not big.pickled  # stored as itself
    assert (1 << 20) <= big.nbytes < (1 << 20) + 1024
    text = encode("x" * 100_000)  # no out-of-band buffers: shipped as its pickle bytes
    assert text.pickled and isinstance(text.store, bytes) and text.nbytes == len(text.store)


@pytest.mark.slow
def test_private_cluster_and_joining_in_fresh_processes(ray_cluster: LocalRayCluster) -> None:
    """``RayBackend(num_cpus, num_gpus)`` starts a private cluster and stops it (no process
    left); ``RAY_ADDRESS`` joins a cluster, which is still running after the run."""
    private = textwrap.dedent(
        """
        import json, psutil, ray
        from conveyor import Pipeline, Resources
        from conveyor.backends import RayBackend
        from conveyor.executors import StreamingExecutor
        from tests.backends.ray_stages import WhereAmI

        backend = RayBackend(num_cpus=2, num_gpus=1)
        stage = WhereAmI("gpu", Resources(cpus=0.5, gpus=0.5), workers=1)
        result = Pipeline("p", [stage]).run(StreamingExecutor(backend), range(3))
        left = [p.name() for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
        print(json.dumps({"outputs": len(result.outputs), "cuda": result.outputs[0]["cuda"],
                          "initialized": ray.is_initialized(), "left": left}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", private],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"outputs": 3, "cuda": "0", "initialized": False, "left": []}

    joining = textwrap.dedent(
        """
        import ray
        from conveyor import Pipeline
        from conveyor.backends import RayBackend
        from conveyor.executors import StreamingExecutor
        from tests.backends.ray_stages import Slow

        result = Pipeline("p", [Slow("s", 0.0)]).run(StreamingExecutor(RayBackend()), range(5))
        assert sorted(result.outputs) == list(range(5)), result.outputs
        print(len([n for n in ray.nodes() if n["Alive"]]))
        """
    )
    env = dict(os.environ, RAY_ADDRESS=ray_cluster.address)
    out = subprocess.run(
        [sys.executable, "-c", joining],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "2"
    assert ray_cluster.alive_nodes() == 2  # the run did not shut the cluster down


# -- placement and resources --------------------------------------------------------------
def test_upstream_actors_run_at_a_lower_priority_once_set_up(address: str) -> None:
    stages = [st.Nice().with_(name="first"), st.Nice().with_(name="last")]
    result = run(stages, range(3), RayBackend(address))
    steps = {(fs, fw - fs, lw - ls) for fs, fw, ls, lw in result.outputs}
    # set up at Ray's usual worker priority (nice 15), then the first stage as nice as can be
    assert steps in ({(15, 4, 0)}, {(0, 10, 0)})


def test_a_batch_sent_while_its_node_idles_gets_the_idle_cores(address: str) -> None:
    result = run([st.Threads()], range(1), RayBackend(address))
    assert result.outputs == [2]  # the worker's node has two CPUs, both idle


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="Linux schedstat")
def test_time_waiting_for_a_core_is_measured_apart_on_ray(address: str) -> None:
    from tests.backends.test_local import check_core_wait_apart

    check_core_wait_apart(RayBackend(address))


def test_workers_land_on_both_nodes(address: str, tmp_path: Path) -> None:
    # work for a second or more per worker: a worker whose readiness the driver hears late
    # on a busy machine still finds some
    stage = st.WhereAmI("spread", Resources(cpus=1), 4, 0.1, barrier=tmp_path)
    result = run([stage], range(48), RayBackend(address))
    assert result.counts == {"inputs": 48, "outputs": 48, "filtered": 0, "failed": 0, "skipped": 0}
    nodes = {o["node"] for o in result.outputs}
    assert nodes == set(node_ids().values())
    assert all(o["node"] == o["info_node"] for o in result.outputs)  # WorkerInfo is true
    assert len({o["worker"] for o in result.outputs}) == 4
    assert {o["assigned_cpu"] for o in result.outputs} == {1.0}  # Ray accounts the real CPUs


def test_gpu_workers_share_or_own_devices_as_asked(address: str, tmp_path: Path) -> None:
    """Fractional workers share one device, whole-GPU workers get distinct devices, and a
    ``gpu_memory_gb`` request becomes the matching fraction of the node's GPU in Ray's books."""
    stages = [
        # work enough that a driver short of CPU sees both workers ready before one has
        # taken every input (with 16 inputs of 0.1 s it failed so twice in three full runs
        # on a slow afternoon)
        st.WhereAmI("half", Resources(cpus=0.25, gpus=0.5), 2, 0.1, tmp_path),
        st.WhereAmI("whole", Resources(cpus=0.25, gpus=1), 2, 0.1, tmp_path),
        st.WhereAmI("mem", Resources(cpus=0.25, gpu_memory_gb=20), 2, 0.1, tmp_path),
    ]
    result = run(stages, range(40), RayBackend(address, gpu_memory_gb=80))
    assert result.counts["outputs"] == 40 and not result.failures
    # each output went through all three stages: the last one's record wraps the others
    seen: dict[str, dict[str, set[Any]]] = {}

    def note(record: dict) -> None:
        by_worker = seen.setdefault(record["worker"].rsplit("-", 1)[0], {})
        by_worker.setdefault(record["worker"], set()).add(
            (record["node"], record["cuda"], record["assigned_gpu"], record["gpu_fraction"])
        )
        if isinstance(record["task"], dict):
            note(record["task"])

    for out in result.outputs:
        note(out)
    half = [next(iter(v)) for v in seen["half"].values()]
    whole = [next(iter(v)) for v in seen["whole"].values()]
    mem = [next(iter(v)) for v in seen["mem"].values()]
    assert len(half) == 2 and len(set(half)) == 1, half  # same node, same device, 0.5 each
    assert half[0][2:] == (0.5, 0.5)
    assert len(whole) == 2 and len({(n, c) for n, c, _, _ in whole}) == 2, whole
    assert all(len(c.split(",")) == 1 and g == 1.0 for _, c, g, _ in whole)
    assert len(mem) == 2 and len(set(mem)) == 1 and mem[0][2:] == (0.25, 0.25), mem


def test_worker_that_ray_cannot_schedule_stops_the_run_clearly(address: str) -> None:
    """Other Ray work holds every GPU: the worker never starts, and the run says why."""
    blocker = ray.remote(num_gpus=2, num_cpus=0)(type("Blocker", (), {"ping": lambda self: 1}))
    blockers = [
        blocker.options(
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node, soft=False
            )
        ).remote()
        for node in node_ids().values()
    ]
    try:
        ray.get([b.ping.remote() for b in blockers])
        stage = st.WhereAmI("gpu", Resources(cpus=0.25, gpus=1), workers=1)
        with pytest.raises(StageSetupError, match="Ray did not schedule worker gpu-0"):
            run([stage], range(2), RayBackend(address, schedule_timeout_s=2))
    finally:
        for b in blockers:
            ray.kill(b)


# -- lifecycle ----------------------------------------------------------------------------
def test_setup_on_node_once_per_node_before_setup_and_teardown_everywhere(
    address: str, tmp_path: Path
) -> None:
    result = run([st.NodeHooks(tmp_path, workers=4)], range(40), RayBackend(address))
    assert sorted(result.outputs) == list(range(40))
    nodes = set(node_ids().values())
    marks = {p.name.removeprefix("node-"): p.read_text() for p in tmp_path.glob("node-*")}
    assert marks == {node: "x" for node in nodes}  # once per node, on that node
    setups = {p.name: p.read_text() for p in tmp_path.glob("setup-*")}
    assert len(setups) == 4 and set(setups.values()) == nodes
    teardowns = {p.name.removeprefix("teardown-") for p in tmp_path.glob("teardown-*")}
    assert teardowns == {name.removeprefix("setup-") for name in setups}


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (st.FailingSetup(), "RuntimeError: no model here"),
        (st.FailingNodeSetup(), "OSError: disk full on this node"),
    ],
)
def test_setup_failure_stops_the_run(address: str, stage: Any, message: str) -> None:
    with pytest.raises(StageSetupError, match=message) as info:
        run([stage], range(4), RayBackend(address))
    assert info.value.stage == stage.name
    assert "Traceback" in info.value.remote_traceback


# -- faults -------------------------------------------------------------------------------
def test_exceptions_are_retried_and_poison_is_recorded(address: str, tmp_path: Path) -> None:
    stages = [st.FlakyOnce(tmp_path), st.Poison(13, batch_size=4), st.Poison(17, "permanent")]
    result = run(stages, range(30), RayBackend(address))
    assert sorted(result.outputs) == [i for i in range(30) if i not in (13, 17)]
    assert result.stats["FlakyOnce"].retried == 6
    failures = {f.task: (f.stage, f.error_type, f.attempts) for f in result.failures}
    assert failures == {"13": ("Poison", "ValueError", 3), "17": ("Poison_2", "PermanentError", 1)}
    assert result.counts == {"inputs": 30, "outputs": 28, "filtered": 0, "failed": 2, "skipped": 0}


def test_an_output_that_cannot_be_pickled_fails_its_input_at_once(address: str) -> None:
    result = run([st.Poison(5, how="unpicklable", batch_size=2)], range(10), RayBackend(address))
    assert sorted(result.outputs) == [i for i in range(10) if i != 5]
    [record] = result.failures
    assert (record.task, record.error_type, record.attempts) == ("5", "UnpicklablePayload", 1)
    assert "_thread.lock cannot be pickled" in record.message


def test_sys_exit_in_a_stage_fails_its_input_and_the_actor_goes_on(address: str) -> None:
    """Ray takes ``sys.exit`` in an actor for the actor's wish to end: it died, every input
    of its batch failing as a dead worker's, its exit code lost."""
    result = run([st.Poison(5, how="exit", batch_size=2)], range(10), RayBackend(address))
    assert sorted(result.outputs) == [i for i in range(10) if i != 5]
    [record] = result.failures
    assert (record.task, record.error_type, record.attempts) == ("5", "RuntimeError", 3)
    assert "stage 'Poison' called sys.exit(2) while processing" in record.message
    assert result.stats["Poison"].worker_deaths == 0


def test_a_worker_killing_input_is_isolated(address: str) -> None:
    result = run([st.Poison(11, how="kill", batch_size=2)], range(30), RayBackend(address))
    assert sorted(result.outputs) == [i for i in range(30) if i != 11]
    assert [(f.task, f.error_type) for f in result.failures] == [("11", "WorkerDied")]
    assert "Ray actor died" in result.failures[0].message
    # once in its batch of two (which costs no attempt: it might have been the other
    # input's fault), then three times alone
    assert result.stats["Poison"].worker_deaths == 4


def test_a_hung_input_times_out_and_the_others_go_on(address: str) -> None:
    stage = st.Poison(7, how="hang", batch_size=2).with_(timeout_s=3)
    executor = StreamingExecutor(RayBackend(address), max_attempts=2)
    result = Pipeline("p", [stage]).run(executor, range(12))
    assert sorted(result.outputs) == [i for i in range(12) if i != 7]
    [failure] = result.failures
    assert (failure.task, failure.error_type, failure.attempts) == ("7", "TaskTimeout", 2)
    assert result.stats["Poison"].timeouts == 3


def test_an_actor_is_replaced_after_max_batches_per_worker(address: str, tmp_path: Path) -> None:
    from tests.executors.test_faults_local import check_fresh_workers

    result = Pipeline("p", [st.Leaky(tmp_path, limit=5)]).run(
        StreamingExecutor(RayBackend(address)), range(40)
    )
    check_fresh_workers(result, tmp_path, 5, 1)


def test_a_journal_resumes_on_ray(address: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    stages = [st.Slow("a", 0.01), st.Slow("b", 0.01)]
    pipeline = Pipeline("p", stages)
    first = pipeline.stream(StreamingExecutor(RayBackend(address)), range(40), journal=journal)
    with first:
        taken = [next(first) for _ in range(15)]  # the 15th is never acknowledged
    rest = pipeline.run(StreamingExecutor(RayBackend(address)), range(40), journal=journal)
    assert (rest.counts["skipped"], rest.counts["inputs"]) == (14, 26)
    assert sorted(taken[:14] + rest.outputs) == list(range(40))


def test_a_batch_that_waited_batch_wait_s_goes_partial_on_ray(address: str) -> None:
    sizes = run([st.Paced(0.05), st.BatchSizes(0.1)], range(40), RayBackend(address)).outputs
    assert sum(sizes) == 40 and max(sizes) <= 8
    # a loaded machine bunches the arrivals, and batches fill: at least two went partial
    # (one full test run under load had [1, 8, 8, 8, 6, 8, ...])
    assert st.partial_batches(sizes) >= 2, sizes


# -- generator stages ---------------------------------------------------------------------
def test_a_generators_outputs_leave_as_they_are_made_on_ray(address: str, tmp_path: Path) -> None:
    # 4 s of outputs: the first must arrive well before the last is made, even when a busy
    # machine delays each arrival by a second or two
    stages = [st.Trickle(tmp_path, 5, gap_s=1.0, size=64 * 1024), st.Arrivals(tmp_path)]
    result = run(stages, [3], RayBackend(address))
    assert sorted(result.outputs) == [(3, j) for j in range(5)]
    first = st.Arrivals.seen(tmp_path)[0][1]
    assert first < st.Trickle.ended(tmp_path, 3) - 0.5


def test_a_generator_failing_part_way_sends_nothing_twice_on_ray(
    address: str, tmp_path: Path
) -> None:
    stages = [st.Trickle(tmp_path, 4, size=40_000, fail_once=(0, 2), fail_after=2)]
    result = run([*stages, st.Arrivals(tmp_path)], range(3), RayBackend(address))
    assert result.failures == []
    assert sorted(result.outputs) == [(i, j) for i in range(3) for j in range(4)]
    assert sorted(key for key, _ in st.Arrivals.seen(tmp_path)) == sorted(result.outputs)


def test_a_paused_generator_on_ray_holds_a_few_outputs_not_all(
    address: str, tmp_path: Path
) -> None:
    # 400 outputs of 100 KB behind a stage that takes 5 ms each
    stages = [st.Trickle(tmp_path, 400, size=100_000), st.Arrivals(tmp_path, cost_s=0.005)]
    executor = StreamingExecutor(RayBackend(address), edge_max_tasks=16)
    result = Pipeline("p", stages).run(executor, [0])
    assert len(result.outputs) == 400
    assert result.stats["arrivals"].queue_hwm_tasks <= 24
    # Ray paused the actor's generator too: it ended as the last outputs were taken, not
    # seconds before (unpaused it makes the 400 in a fraction of the 2 s they take to use)
    arrivals = st.Arrivals.seen(tmp_path)
    assert st.Trickle.ended(tmp_path, 0) >= arrivals[-60][1]


def test_a_generators_timeout_and_journal_on_ray(address: str, tmp_path: Path) -> None:
    # 8 outputs 0.4 s apart: longer than timeout_s in all, never a 1 s gap
    fine = run([st.Stalls(0.4)], [8], RayBackend(address))
    assert sorted(fine.outputs) == list(range(8)) and not fine.failures
    executor = StreamingExecutor(RayBackend(address), max_attempts=1)
    late = Pipeline("p", [st.Stalls(3.0)]).run(executor, [2])
    assert [f.error_type for f in late.failures] == ["TaskTimeout"]
    journal = tmp_path / "journal"
    stages = [st.Trickle(tmp_path, 3, fail_once=(1,), fail_after=1)]
    first = Pipeline("p", stages).run(
        StreamingExecutor(RayBackend(address)), range(3), journal=journal
    )
    assert sorted(first.outputs) == [(i, j) for i in range(3) for j in range(3)]
    again = Pipeline("p", stages).run(
        StreamingExecutor(RayBackend(address)), range(3), journal=journal
    )
    assert again.counts["skipped"] == 3


def test_worker_killed_from_outside_is_replaced_and_nothing_is_lost(address: str) -> None:
    backend = RayBackend(address)
    stage = st.Slow("slow", 0.05)
    stage.num_workers = 2
    stream = Pipeline("p", [stage]).stream(StreamingExecutor(backend), range(60))
    outputs = []
    with stream:
        for out in stream:
            outputs.append(out)
            if len(outputs) == 10:
                pid = next(iter(backend.worker_pids().values()))
                os.kill(pid, signal.SIGKILL)
    assert sorted(outputs) == list(range(60))
    assert stream.result.failures == []
    assert stream.result.stats["slow"].worker_deaths == 1


def _events_until(backend: RayBackend, kind: type, timeout: float = 60.0) -> list[Any]:
    seen: list[Any] = []
    deadline = time.monotonic() + timeout
    while not any(isinstance(e, kind) for e in seen):
        assert time.monotonic() < deadline, f"no {kind.__name__} within {timeout}s: {seen}"
        seen.extend(backend.poll(0.2))
    return seen


def test_outputs_outlive_the_worker_that_made_them(address: str) -> None:
    """Outputs are owned by the driver, not by the actor: kill the actor, read them anyway."""
    backend = RayBackend(address)
    backend.open()
    try:
        spec = Pipeline("p", [st.MakeItem(nbytes=2 << 20)]).build()[0]
        worker_node = node_ids()["127.0.0.3"]
        backend.start_worker("make-0", spec, WorkerPlacement(worker_node))
        assert any(isinstance(e, WorkerReady) for e in _events_until(backend, WorkerReady))
        backend.submit("make-0", [(0, [backend.put(1, "1"), backend.put(3, "3")])])
        done = next(e for e in _events_until(backend, BatchesDone) if isinstance(e, BatchesDone))
        handles = done.outcomes[0].outputs
        assert [h.label for h in handles] == ["1", "3"]
        assert all((2 << 20) <= h.nbytes < (2 << 20) + 4096 for h in handles)
        assert all(isinstance(h.ref, RayPayload) and h.ref.ref is not None for h in handles)
        assert {h.node for h in handles} == {worker_node}  # the controller knows where
        where = ray.experimental.get_object_locations([h.ref.ref for h in handles])
        assert all(loc["node_ids"] == [worker_node] for loc in where.values())  # stayed there
        backend.kill_worker("make-0")
        assert any(isinstance(e, WorkerDied) for e in _events_until(backend, WorkerDied))
        items = [backend.get(h) for h in handles]
        assert [(i.metadata["n"], len(i.data), int(i.data[0])) for i in items] == [
            (1, 2 << 20, 1),
            (3, 2 << 20, 3),
        ]
    finally:
        backend.shutdown()


def _queued_on(controller: Any, stage: int, node: str) -> bool:
    """Whether an input waiting in ``stage``'s queue is stored on ``node``. Queued, not sent:
    no worker has fetched it, and the controller (which runs in the iterating thread) sends
    nothing until the iteration goes on, so a node killed now takes its only copy."""
    return any(e.handle.node == node for e in list(controller.stages[stage].queue.fresh))


@pytest.mark.slow
def test_pipeline_survives_losing_a_node_mid_run(
    address: str, ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """A third node (CPUs only, so placement prefers it for CPU stages) joins, takes workers,
    and is killed mid-run: the run finishes with every input's output, once. Inputs whose
    payload died with the node are made again from their sources (``recovered``)."""
    node = ray_cluster.add_node("127.0.0.4", gpus=0)
    third = node_ids()["127.0.0.4"]
    backend = RayBackend(address)
    # the second stage holds its inputs until the node is gone, so that first's outputs
    # wait in its queue: those the third node made die with it (a run left to itself sent
    # them on, and they were fetched, before a node killed from the loop went)
    gate = tmp_path / "gate"
    gate.touch()
    seen: dict[str, Any] = {}

    def kill_once_queued(controller: Any) -> None:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "queued" not in seen:
                with contextlib.suppress(RuntimeError):  # a queue changing as it is read
                    if _queued_on(controller, 1, third):
                        seen["queued"] = True
                time.sleep(0.005)
            seen["joined"] = third in {n.node_id for n in backend.nodes()}
            seen["used"] = third in backend.worker_nodes().values()
            ray_cluster.remove_node(node)
        finally:
            gate.unlink()

    try:
        # first's outputs (512 KiB: beyond what Ray returns inline to the driver) stay in the
        # object store of the node that made them
        stages = [st.Slow("first", 0.02, pad=512 << 10), st.Gated("second", 0.02, str(gate))]
        stream = Pipeline("p", stages).stream(StreamingExecutor(backend), range(120))
        killer = threading.Thread(target=kill_once_queued, args=(stream._controller,))
        with stream:
            killer.start()
            outputs = list(stream)
        killer.join()
        result = stream.result
    finally:
        if node in ray_cluster.nodes:
            ray_cluster.remove_node(node)
    counts = result.counts
    assert seen.get("queued"), "no payload of the third node waited when it was killed"
    assert seen["joined"] and seen["used"]  # the join was seen, and the node used
    assert counts["inputs"] == 120
    assert result.failures == []
    assert sorted(outputs) == list(range(120))  # every input once, nothing twice
    assert counts["outputs"] == 120
    assert sum(s.worker_deaths for s in result.stats.values()) >= 1
    assert result.stats["second"].recovered >= 1  # payloads did die with the node


# -- same results as the local backend ----------------------------------------------------
def _local_reference() -> Any:
    return run(st.item_pipeline_stages(), range(40), LocalBackend(num_cpus=2))


def _comparable(result: Any) -> tuple[Any, ...]:
    return (sorted(result.outputs), result.counts, sorted(f.task for f in result.failures))


def test_results_equal_the_local_backend(address: str) -> None:
    local = _local_reference()
    assert local.counts["outputs"] > 40  # fan-out happened
    streaming = run(st.item_pipeline_stages(), range(40), RayBackend(address))
    assert _comparable(streaming) == _comparable(local)
    assert streaming.first_output_s is not None and streaming.startup_s > 0
    batch = Pipeline("p", st.item_pipeline_stages()).run(
        BatchExecutor(RayBackend(address), autoscale=AutoscaleConfig(max_workers_per_stage=2)),
        initial_tasks=range(40),
    )
    assert _comparable(batch) == _comparable(local)
    for name in ("MakeItem", "Split", "Summarize"):
        assert streaming.stats[name].tasks_in == local.stats[name].tasks_in
        assert streaming.stats[name].filtered == local.stats[name].filtered


@pytest.mark.slow
@pytest.mark.timeout(300)  # 19-25 s alone; Ray Data's tasks start slowly on a loaded machine
def test_ray_data_executor_returns_the_same_result(address: str, tmp_path: Path) -> None:
    local = _local_reference()
    result = Pipeline("p", st.item_pipeline_stages()).run(
        RayDataExecutor(address, rows_per_block=1), initial_tasks=range(40)
    )
    assert _comparable(result) == _comparable(local)
    for name in ("MakeItem", "Split", "Summarize"):
        assert result.stats[name].tasks_in == local.stats[name].tasks_in
        assert result.stats[name].tasks_out == local.stats[name].tasks_out
        assert result.stats[name].filtered == local.stats[name].filtered
    assert result.completed and result.first_output_s is not None

    # failures, retries and setup hooks, as on the other executors
    stages = [st.FlakyOnce(tmp_path), st.Poison(13, batch_size=4), st.NodeHooks(tmp_path, 2)]
    result = Pipeline("p", stages).run(RayDataExecutor(address), initial_tasks=range(30))
    assert sorted(result.outputs) == [i for i in range(30) if i != 13]
    assert [(f.task, f.error_type, f.attempts) for f in result.failures] == [
        ("13", "ValueError", 3)
    ]
    assert result.stats["FlakyOnce"].retried == 6
    assert result.counts == {"inputs": 30, "outputs": 29, "filtered": 0, "failed": 1, "skipped": 0}
    assert sorted(p.read_text() for p in tmp_path.glob("node-*")) == ["x", "x"]
    # an output that cannot be pickled fails its input, not the Ray Data task of its batch
    stages = [st.Poison(5, how="unpicklable")]
    result = Pipeline("p", stages).run(RayDataExecutor(address), initial_tasks=range(8))
    assert sorted(result.outputs) == [i for i in range(8) if i != 5]
    assert [(f.task, f.error_type, f.attempts) for f in result.failures] == [
        ("5", "UnpicklablePayload", 1)
    ]
    # a stage's own max_attempts wins over the executor's
    result = Pipeline("p", [st.Poison(3).with_(max_attempts=1)]).run(
        RayDataExecutor(address), initial_tasks=range(6)
    )
    assert [(f.task, f.attempts) for f in result.failures] == [("3", 1)]
    # settings with no Ray Data equivalent are said, not silently dropped
    stage = st.Poison(99).with_(timeout_s=30, max_batches_per_worker=2)
    with pytest.warns(UserWarning, match="stage 'Poison' sets timeout_s .*max_batches_per_worker"):
        result = Pipeline("p", [stage]).run(RayDataExecutor(address), initial_tasks=range(4))
    assert sorted(result.outputs) == list(range(4))
    # progress_bars: Ray Data's bars are on for the run (its source is read during it), and
    # its context is as it was afterwards
    context = ray.data.DataContext.get_current()
    seen: list[bool] = []

    def tasks() -> Iterator[int]:
        seen.append(context.enable_progress_bars)
        yield from range(4)

    before = context.enable_progress_bars
    for bars in (True, False):
        result = Pipeline("p", [st.Poison(-1)]).run(
            RayDataExecutor(address, progress_bars=bars), initial_tasks=tasks()
        )
        assert sorted(result.outputs) == [0, 1, 2, 3]
        assert context.enable_progress_bars == before
    assert seen == [True, False]

    with pytest.raises(StageSetupError, match="no model here"):
        Pipeline("p", [st.FailingSetup()]).run(RayDataExecutor(address), initial_tasks=range(3))
    with pytest.raises(StageSetupError, match="disk full on this node"):
        Pipeline("p", [st.FailingNodeSetup()]).run(RayDataExecutor(address), range(3))


# -- the benchmarks' Ray engines ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)  # 30-45 s alone, four benchmarks one after another
def test_benchmarks_run_the_ray_engines(
    address: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.benchmarks.test_benchmarks_smoke import load

    join = ["--ray-address", address]
    bench = load("unbalanced3", monkeypatch)
    quick = ["--quick", "--tasks", "6", "--costs-ms", "5,20,10", "--only", "streaming"]
    results = bench.main([*quick, "--engines", "ray,ray-data", *join])  # local: its own test
    assert [(m.label, m.outputs, m.failures) for m in results] == [
        ("ray streaming", 6, 0),
        ("ray-data", 6, 0),
    ]
    out = capsys.readouterr().out
    assert "ray streaming tasks/s / ideal" in out and "Ray cluster joined" in out

    tiny = load("tiny3", monkeypatch).main(
        ["--quick", "--tasks", "60", "--only", "streaming", "--engines", "ray", *join]
    )
    assert [(m.label, m.outputs) for m in tiny] == [("ray streaming", 60)]
    assert "!!" not in capsys.readouterr().out  # outputs summed right

    memory = load("memory", monkeypatch).main(
        ["--sizes", "4,8", "--last-ms", "1", "--engines", "ray", *join]
    )
    assert [(m.label, m.outputs) for m in memory] == [
        ("ray streaming 4", 4),
        ("ray streaming 8", 8),
    ]

    peers = load("peers", monkeypatch).main(
        [
            "--quick",
            "--tasks",
            "6",
            "--workloads",
            "unbalanced3",
            *join,
            "--engines",
            "conveyor-local,conveyor-ray,ray-data-hand",
        ]
    )
    assert [(m.label, m.outputs) for m in peers["unbalanced3"]] == [
        ("conveyor-local", 6),
        ("conveyor-ray", 6),
        ("ray-data-hand", 6),
    ]
    out = capsys.readouterr().out
    assert "unbalanced3: engines side by side" in out and "unbalanced3: targets" in out
    assert ray.is_initialized()  # the benchmarks left this process's connection alone


# -- watching a run -----------------------------------------------------------------------
def test_metrics_and_event_log_on_ray(address: str, tmp_path: Path) -> None:
    from conveyor.monitor import EventLog, PrometheusMonitor
    from tests.monitor.scrape import scrape_during, value

    log = EventLog(tmp_path)
    with PrometheusMonitor(port=0) as metrics:
        executor = StreamingExecutor(RayBackend(address), monitors=[metrics, log])
        pipeline = Pipeline("watched", [st.Slow("a", 0.02), st.Slow("b", 0.05)])
        result, scrapes = scrape_during(metrics.url, lambda: pipeline.run(executor, range(80)))
    assert len(result.outputs) == 80
    final = scrapes[-1]
    labels = {"pipeline": "watched", "stage": "b"}
    assert value(final, "conveyor_stage_tasks_total", outcome="in", **labels) == 80
    assert value(final, "conveyor_cluster_cpus", pipeline="watched") == 4  # both nodes
    info = {"pipeline": "watched", "executor": "streaming", "backend": "RayBackend"}
    assert value(final, "conveyor_run_info", **info) == 1
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0]["type"] == "run_start" and len(events[0]["cluster"]["nodes"]) == 2
    nodes = {e["node"] for e in events if e["type"] == "worker" and e["event"] == "start"}
    assert nodes <= {n["node_id"] for n in events[0]["cluster"]["nodes"]}
    assert events[-1]["type"] == "run_end" and events[-1]["counts"]["outputs"] == 80


# -- what Ray shows: actor names, the dashboard, no death messages ------------------------
def test_actor_names_are_readable_bounded_and_never_fail_a_run() -> None:
    assert ray_backend.actor_name("embed clips-3") == "embed_clips-3"
    long = ray_backend.actor_name("x" * 200 + "-12")
    assert len(long) == ray_backend.NAME_MAX and long.endswith("~-12")
    assert ray_backend.actor_class_name("clip.embed v2") == "clip_embed_v2Worker"
    assert len(ray_backend.actor_class_name("é" * 200)) == ray_backend.NAME_MAX
    assert ray_backend.stage_actor_class("a b").__name__ == "a_bWorker"

    tried: list[str | None] = []

    class Refusing:  # a cluster where every name is taken
        def options(self, name: str | None = None, **options: Any) -> Any:
            tried.append(name)
            return SimpleNamespace(remote=lambda *args: self.create(name))

        def create(self, name: str | None) -> str:
            if name is not None:
                raise ray.exceptions.ActorAlreadyExistsError(f"{name} is taken")
            return "actor"

    backend = RayBackend()
    backend._token = "abc123"
    assert backend._new_actor(Refusing(), "s-0", {"num_cpus": 1}, ()) == "actor"
    assert tried == ["s-0", "s-0@abc123", None]

    class Broken(Refusing):  # a failure that is not about the name is not hidden
        def create(self, name: str | None) -> str:
            raise ValueError("bad resources")

    with pytest.raises(ValueError, match="bad resources"):
        backend._new_actor(Broken(), "s-0", {}, ())


def test_actors_carry_their_stage_and_worker_and_sidestep_a_taken_name(address: str) -> None:
    """What ``ray list actors`` and the dashboard show (Ray's actor table, read from the GCS:
    this cluster runs no dashboard): ``<stage>Worker`` actors named ``<stage>-<n>``."""
    holder = ray.remote(num_cpus=0)(type("Holder", (), {"ping": lambda self: 1}))
    taken = holder.options(name="first_stage-0").remote()  # the first worker's name
    ray.get(taken.ping.remote())
    backend = RayBackend(address)
    seen: dict[str, str] = {}  # actor name -> class, as the GCS's actor table has them

    def look(name: str) -> None:
        # each actor's own record: the whole table is long after the suite's other tests
        with contextlib.suppress(ValueError):
            actor = ray.get_actor(name)
            record = ray._private.state.actors(actor_id=actor._actor_id.hex())
            seen[record["Name"]] = record["ActorClassName"]

    done = threading.Event()

    def watch() -> None:
        # looked up all along (it was at each output: under load the first stage had done
        # all its inputs, and retired its worker, before the first output came)
        while not done.is_set():
            for name in ray.util.list_named_actors():
                if name not in seen:
                    look(name)
            done.wait(0.05)

    watcher = threading.Thread(target=watch)
    try:
        stages = [st.Slow("first stage", 0.05).with_(num_workers=1), st.Slow("b.2", 0.01)]
        stream = Pipeline("p", stages).stream(StreamingExecutor(backend), range(12))
        watcher.start()
        with stream:
            outputs = list(stream)
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join()
        ray.kill(taken)
    assert sorted(outputs) == list(range(12))
    assert seen["first_stage-0"] == "Holder"  # the taken name stayed the holder's
    assert re.fullmatch(r"\w{6}", backend._token)
    assert seen[f"first_stage-0@{backend._token}"] == "first_stageWorker"
    b2 = {name: cls for name, cls in seen.items() if name.startswith("b.2")}
    assert b2 and all(re.fullmatch(r"b\.2-\d+", n) and c == "b_2Worker" for n, c in b2.items())


class _Subscriber:
    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.closed = False

    def poll(self, timeout: float | None = None) -> tuple[Any, Any]:
        return ("id", self.messages.pop(0)) if self.messages else (None, None)

    def close(self) -> None:
        self.closed = True


def test_the_driver_hears_no_death_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener ``ray.init`` starts gets a subscriber without Ray's death messages;
    other errors pass; a Ray without that listener connects as it is."""
    died = {"type": "worker_died", "error_message": "A worker died or was killed ..."}
    other = {"type": "version_mismatch", "error_message": "versions differ"}
    quiet = ray_backend._QuietErrors(_Subscriber(died, other))
    assert quiet.poll() == (None, None)  # "nothing yet": the listener polls again
    assert quiet.poll() == ("id", other)
    quiet.close()
    assert quiet._inner.closed

    module = ray._private.worker
    heard: list[Any] = []
    monkeypatch.setattr(
        module, "listen_error_messages", lambda w, stop: heard.append(w.gcs_error_subscriber)
    )
    listen = module.listen_error_messages
    with ray_backend._death_messages_off():
        module.listen_error_messages(SimpleNamespace(gcs_error_subscriber=_Subscriber()), None)
    assert isinstance(heard[0], ray_backend._QuietErrors)
    assert module.listen_error_messages is listen  # only while ray.init runs

    monkeypatch.delattr(module, "listen_error_messages")
    with ray_backend._death_messages_off():
        pass  # nothing to wrap: Ray's messages show, nothing fails


@pytest.mark.parametrize(
    ("available", "logs"), [(True, ""), (False, ""), (True, "1")], ids=["quiet", "bare", "logs"]
)
def test_a_private_cluster_starts_its_dashboard_where_it_can_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], available: bool, logs: str
) -> None:
    """Without ``ray[default]`` the cluster starts as before, without a dashboard or a word;
    with it, on 127.0.0.1, its URL printed once. ``ray.init`` is a stand-in here."""
    seen: dict[str, Any] = {}

    def init(**kwargs: Any) -> Any:
        seen.update(kwargs, listener=ray._private.worker.listen_error_messages)
        return SimpleNamespace(dashboard_url="127.0.0.1:8265" if available else None)

    listen = ray._private.worker.listen_error_messages
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv(ray_backend.RAY_LOGS_ENV, logs)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray_backend, "dashboard_available", lambda: available)
    connection = RayConnection(num_cpus=1)
    connection.connect()
    try:
        err = capsys.readouterr().err
        if available:
            assert (seen["include_dashboard"], seen["dashboard_host"]) == (None, "127.0.0.1")
            assert err == "Ray dashboard: http://127.0.0.1:8265\n"
            assert connection.dashboard_url == "http://127.0.0.1:8265"
        else:
            assert seen["include_dashboard"] is False and "dashboard_host" not in seen
            assert err == "" and connection.dashboard_url is None
        assert (seen["listener"] is listen) == (logs == "1")
    finally:
        connection.disconnect()
    assert connection.dashboard_url is None and ray._private.worker.listen_error_messages is listen


def test_dashboard_needs_ray_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.dashboard.optional_deps", None)  # import fails
    assert not ray_backend.dashboard_available()


def _wait_for(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.2)


def test_ray_death_messages_stay_off_the_console_unless_asked(
    address: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker killed mid-batch: Ray's "(raylet) A worker died ..." reaches the driver (our
    log has it at DEBUG) but not the console; with ``CONVEYOR_RAY_LOGS=1`` it does."""
    caplog.set_level(logging.DEBUG, logger="conveyor.backends.ray")
    message = "A worker died or was killed"

    def kill_one() -> None:
        executor = StreamingExecutor(RayBackend(address), max_attempts=1)
        result = Pipeline("p", [st.Poison(1, how="kill")]).run(executor, range(3))
        assert [(f.error_type, f.task) for f in result.failures] == [("WorkerDied", "1")]

    ray.shutdown()  # whoever connected this process before: the backend's way now
    RayConnection(address).connect()
    kill_one()
    _wait_for(lambda: message in caplog.text, "death message from Ray")
    console = capfd.readouterr()
    assert message not in console.out + console.err
    ray.shutdown()
    monkeypatch.setenv(ray_backend.RAY_LOGS_ENV, "1")
    try:
        RayConnection(address).connect()
        kill_one()
        echoed: list[str] = []

        def echoed_once() -> bool:
            echoed.append(capfd.readouterr().out)
            return message in "".join(echoed)

        _wait_for(echoed_once, "death message on the console")
    finally:
        ray.shutdown()
        monkeypatch.delenv(ray_backend.RAY_LOGS_ENV)
        RayConnection(address).connect()  # quiet again, for the tests after this one


@pytest.mark.slow
def test_private_cluster_shows_its_dashboard_stage_actors_and_no_death_messages(
    tmp_path: Path,
) -> None:
    """One private cluster, as a user's console sees it: the dashboard's URL once (it
    serves), the actors by stage in Ray's state API (what the dashboard lists), a killed
    worker and a timed-out one without Ray's death messages, our own notice there."""
    if not ray_backend.dashboard_available():
        pytest.skip("Ray's dashboard is not installed (ray[default])")
    code = textwrap.dedent(
        """
        import json, logging, time, urllib.request
        from ray.util.state import list_actors
        from conveyor import Pipeline
        from conveyor.backends import RayBackend
        from conveyor.executors import StreamingExecutor
        from tests.backends.ray_stages import Poison

        dropped = []  # Ray's death messages, as the backend logs them at DEBUG
        handler = logging.Handler()
        handler.emit = lambda record: dropped.append(record.getMessage())
        quiet = logging.getLogger("conveyor.backends.ray")
        quiet.setLevel(logging.DEBUG)
        quiet.addHandler(handler)
        quiet.propagate = False

        backend = RayBackend(num_cpus=2)
        stages = [
            Poison(3, how="kill").with_(name="killer"),
            Poison(5, how="hang").with_(name="sleepy stage", timeout_s=2),
        ]
        stream = Pipeline("p", stages).stream(StreamingExecutor(backend, max_attempts=1), range(8))
        with stream:
            outputs = [next(stream)]
            url = backend.connection.dashboard_url
            status = urllib.request.urlopen(url, timeout=30).status
            actors = sorted({(a.class_name, a.name) for a in list_actors(address=url)})
            outputs.extend(stream)
        deadline = time.monotonic() + 20
        while not any("A worker died" in m for m in dropped) and time.monotonic() < deadline:
            time.sleep(0.2)
        failures = sorted(f.error_type for f in stream.result.failures)
        print(json.dumps({"outputs": sorted(outputs), "failures": failures, "status": status,
                          "actors": actors,
                          "dropped": sum("A worker died or was" in m for m in dropped)}))
        """
    )
    token = tmp_path / "token"  # token authentication, with a token of its own
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", ray_backend.RAY_LOGS_ENV)
    }
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["outputs"] == [0, 1, 2, 4, 6, 7] and report["failures"] == [
        "TaskTimeout",
        "WorkerDied",
    ]
    urls = [line for line in out.stderr.splitlines() if line.startswith("Ray dashboard:")]
    assert len(urls) == 1 and re.fullmatch(r"Ray dashboard: http://127\.0\.0\.1:\d+", urls[0])
    assert report["status"] == 200
    classes = {c for c, _ in report["actors"]}
    assert classes == {"killerWorker", "sleepy_stageWorker"}, report["actors"]
    assert all(re.fullmatch(r"(killer|sleepy_stage)-\d+", n) for _, n in report["actors"])
    assert report["dropped"] >= 1  # Ray's message did come, to our log at DEBUG
    console = out.stdout + out.stderr
    assert "A worker died" not in console and "(raylet)" not in console
    assert "'sleepy stage': a batch of 1 input ran" in out.stderr  # our notice stays


def test_a_cluster_whose_gcs_stopped_answering_is_not_asked_to_stop_its_workers(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal to the driver's whole process group reaches a private cluster's processes:
    its GCS, alive, stopped answering, each stop waited 60 s on it, and Ray ended the driver
    with exit 1 (`timeout`, a scheduler's stop). Its workers are now left to the cluster's
    end; a cluster that answers is asked as before."""
    backend = RayBackend(address)
    result = Pipeline("p", [st.Slow("s", 0.0)]).run(StreamingExecutor(backend), range(3))
    assert sorted(result.outputs) == [0, 1, 2]
    assert backend.connection.answers()

    class Silent:
        def internal_kv_get(self, *args: Any, **kwargs: Any) -> None:
            raise TimeoutError("no answer within 2 s")

    monkeypatch.setattr(ray._private.worker.global_worker, "gcs_client", Silent())
    assert not backend.connection.answers()
