"""The Ray backend and the Ray Data executor on a real two-node Ray cluster on loopback.

The session's cluster (``tests/backends/conftest.py``): a head on 127.0.0.2 and a second node
on 127.0.0.3, 2 CPUs and 2 fake GPUs each. After every test all of its CPUs and GPUs must be
free again: a worker actor left alive would hold them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ray = pytest.importorskip("ray")

from conveyor import AutoscaleConfig, Pipeline, Resources, StageSetupError  # noqa: E402
from conveyor.backends import LocalBackend, RayBackend  # noqa: E402
from conveyor.backends.ray import RayConnection, RayPayload, encode  # noqa: E402
from conveyor.engine.messages import (  # noqa: E402
    BatchesDone,
    WorkerDied,
    WorkerPlacement,
    WorkerReady,
)
from conveyor.executors import BatchExecutor, RayDataExecutor, StreamingExecutor  # noqa: E402
from conveyor.stage import ProcessingStage  # noqa: E402
from tests.backends import ray_stages as st  # noqa: E402
from tests.backends.ray_cluster import RANGE_FLOOR, LocalRayCluster, free_range  # noqa: E402

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


def test_joining_a_cluster_rejects_declared_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    connection = RayConnection("127.0.0.2:1", num_cpus=2)
    with pytest.raises(ValueError, match="num_cpus/num_gpus declare the resources of a private"):
        connection.connect()


def test_backend_used_before_open_is_a_clear_error() -> None:
    from conveyor.errors import BackendError

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


def test_workers_land_on_both_nodes(address: str, tmp_path: Path) -> None:
    stage = st.WhereAmI("spread", Resources(cpus=1), 4, 0.05, barrier=tmp_path)
    result = run([stage], range(24), RayBackend(address))
    assert result.counts == {"inputs": 24, "outputs": 24, "filtered": 0, "failed": 0, "skipped": 0}
    nodes = {o["node"] for o in result.outputs}
    assert nodes == set(node_ids().values())
    assert all(o["node"] == o["info_node"] for o in result.outputs)  # WorkerInfo is true
    assert len({o["worker"] for o in result.outputs}) == 4
    assert {o["assigned_cpu"] for o in result.outputs} == {1.0}  # Ray accounts the real CPUs


def test_gpu_workers_share_or_own_devices_as_asked(address: str, tmp_path: Path) -> None:
    """Fractional workers share one device, whole-GPU workers get distinct devices, and a
    ``gpu_memory_gb`` request becomes the matching fraction of the node's GPU in Ray's books."""
    stages = [
        st.WhereAmI("half", Resources(cpus=0.25, gpus=0.5), 2, 0.05, tmp_path),
        st.WhereAmI("whole", Resources(cpus=0.25, gpus=1), 2, 0.05, tmp_path),
        st.WhereAmI("mem", Resources(cpus=0.25, gpu_memory_gb=20), 2, 0.05, tmp_path),
    ]
    result = run(stages, range(16), RayBackend(address, gpu_memory_gb=80))
    assert result.counts["outputs"] == 16 and not result.failures
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
    result = run([st.NodeHooks(tmp_path, workers=4)], range(20), RayBackend(address))
    assert sorted(result.outputs) == list(range(20))
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


@pytest.mark.slow
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


# -- generator stages ---------------------------------------------------------------------
def test_a_generators_outputs_leave_as_they_are_made_on_ray(address: str, tmp_path: Path) -> None:
    stages = [st.Trickle(tmp_path, 5, gap_s=0.4, size=64 * 1024), st.Arrivals(tmp_path)]
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


@pytest.mark.slow
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


def _pending_on(controller: Any, stage: int, node: str) -> bool:
    """Whether an input of ``stage`` that waits or is in flight is stored on ``node``."""
    queued = list(controller.stages[stage].queue.fresh)
    sent = [e for b in controller.batches.values() if b.stage == stage for e in b.entries]
    return any(e.handle.node == node for e in queued + sent)


@pytest.mark.slow
def test_pipeline_survives_losing_a_node_mid_run(
    address: str, ray_cluster: LocalRayCluster
) -> None:
    """A third node (CPUs only, so placement prefers it for CPU stages) joins, takes workers,
    and is killed mid-run: the run finishes with every input's output, once. Inputs whose
    payload died with the node are made again from their sources (``recovered``)."""
    node = ray_cluster.add_node("127.0.0.4", gpus=0)
    third = node_ids()["127.0.0.4"]
    backend = RayBackend(address)
    try:
        # first's outputs (512 KiB: beyond what Ray returns inline to the driver) stay in the
        # object store of the node that made them: the third node's die with it
        stages = [st.Slow("first", 0.04, pad=512 << 10), st.Slow("second", 0.08)]
        stream = Pipeline("p", stages).stream(StreamingExecutor(backend), range(120))
        controller = stream._controller
        outputs = []
        killed_at = None
        lost_queued = False
        with stream:
            for out in stream:
                outputs.append(out)
                # kill it while payloads it holds wait for the next stage (so that some are
                # lost), or at the latest after half of the outputs
                on_third = _pending_on(controller, 1, third)
                if killed_at is None and ((len(outputs) >= 15 and on_third) or len(outputs) == 60):
                    assert third in {n.node_id for n in backend.nodes()}  # the join was seen
                    assert third in backend.worker_nodes().values()  # and used
                    ray_cluster.remove_node(node)
                    killed_at, lost_queued = len(outputs), on_third
        result = stream.result
    finally:
        if node in ray_cluster.nodes:
            ray_cluster.remove_node(node)
    counts = result.counts
    assert killed_at is not None
    assert counts["inputs"] == 120
    assert result.failures == []
    assert sorted(outputs) == list(range(120))  # every input once, nothing twice
    assert counts["outputs"] == 120
    assert sum(s.worker_deaths for s in result.stats.values()) >= 1
    assert lost_queued, "no payload of the third node was waiting when it was killed"
    assert result.stats["second"].recovered >= 1  # payloads did die with the node


# -- same results as the local backend ----------------------------------------------------
def _local_reference() -> Any:
    return run(st.item_pipeline_stages(), range(40), LocalBackend(num_cpus=2))


def _comparable(result: Any) -> tuple[Any, ...]:
    return (sorted(result.outputs), result.counts, sorted(f.task for f in result.failures))


@pytest.mark.slow
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

    with pytest.raises(StageSetupError, match="no model here"):
        Pipeline("p", [st.FailingSetup()]).run(RayDataExecutor(address), initial_tasks=range(3))
    with pytest.raises(StageSetupError, match="disk full on this node"):
        Pipeline("p", [st.FailingNodeSetup()]).run(RayDataExecutor(address), range(3))


# -- the benchmarks' Ray engines ------------------------------------------------------------
@pytest.mark.slow
def test_benchmarks_run_the_ray_engines(
    address: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.benchmarks.test_benchmarks_smoke import load

    join = ["--ray-address", address]
    bench = load("unbalanced3", monkeypatch)
    quick = ["--quick", "--tasks", "6", "--costs-ms", "5,20,10", "--only", "streaming"]
    results = bench.main([*quick, "--engines", "local,ray,ray-data", *join])
    assert [(m.label, m.outputs, m.failures) for m in results] == [
        ("streaming", 6, 0),
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
