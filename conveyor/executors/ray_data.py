"""RayDataExecutor: the same pipeline as a Ray Data plan (``map_batches`` per stage).

Each stage becomes one ``map_batches``: stages with ``setup`` or a GPU run in an actor pool
(``setup`` once per actor), the others as Ray tasks; every call asks Ray for the stage's
resources and gets ``batch_size`` rows. Rows carry tasks as pickle bytes, so what a stage
receives is exactly what it would receive from the other executors (Ray Data never converts
a task to Arrow types). Inside, the stage runs through the same ``StageRunner`` as on the
backends: lineage ids, filtered counts and declared-input checks are the same, and so are
retries (``max_attempts`` per input, a failing batch retried one input at a time, a
``PermanentError`` final at once).

Failures and statistics travel with the data. A failing input becomes a failure row; a
batch's counts ride on its first output row, or on a counts-only row when it produced
nothing. Those rows are passed through later stages untouched and summed on the driver,
which returns the same ``RunResult`` as the other executors.

Ray Data's own rules apply where they differ from the streaming executor: batches are formed
per block, so a stage may get several short batches; ``setup_on_node`` runs once per stage on
every node alive when the run starts; ``teardown`` runs when Ray Data retires an actor
gracefully (it cannot when an actor is killed); a worker that crashes is restarted by Ray
Data, and an input that crashes every worker fails the whole run. A stage's ``timeout_s``,
``batch_wait_s`` and ``max_batches_per_worker`` have no Ray Data equivalent: the run warns,
naming them, and goes on without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import cloudpickle
import pyarrow as pa

try:
    import ray
except ModuleNotFoundError as exc:  # said with what installs it, on the command line too
    if exc.name != "ray":
        raise
    raise ModuleNotFoundError(
        "RayDataExecutor needs Ray Data: pip install 'conveyor[ray]'", name="ray"
    ) from None
import ray.data
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from conveyor.backends.ray import (
    RayConnection,
    _dumps,
    _extend_sys_path,
    _node_id,
    probe_gpu_memory,
)
from conveyor.backends.runtime import StageRunner
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.journal import Journal, JournalKey
from conveyor.engine.messages import ErrorInfo
from conveyor.engine.policies.placement import fits_nowhere
from conveyor.engine.spec import StageSpec
from conveyor.errors import BackendError, JournalError, StageSetupError
from conveyor.resources import Resources
from conveyor.result import FailureRecord, RunResult, StageStats
from conveyor.tasks.base import EmptyTask, Task

TASK, FAILURE, COUNTS, SETUP_FAILED = 0, 1, 2, 3
#: a stage's per-batch counts: (stage index, in, out, filtered, failed, retried, busy seconds,
#: CPU seconds)
Counts = tuple[int, int, int, int, int, int, float, float]
_SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("label", pa.string()),
        ("data", pa.large_binary()),
        ("counts", pa.large_binary()),
    ]
)


def _table(rows: list[tuple[int, str, bytes, bytes | None]]) -> pa.Table:
    kinds, labels, datas, counts = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table(
        [
            pa.array(kinds, pa.int8()),
            pa.array(labels, pa.string()),
            pa.array(datas, pa.large_binary()),
            pa.array(counts, pa.large_binary()),
        ],
        schema=_SCHEMA,
    )


class _StageFn:
    """One stage inside a Ray Data worker (an actor, or a task process that caches it)."""

    def __init__(
        self,
        payload: bytes,
        index: int,
        name: str,
        max_attempts: int,
        sys_path: list[str],
        gpu_fraction: float = 0.0,
        setup: bool = True,
    ) -> None:
        _extend_sys_path(sys_path)
        self.index = index
        self.name = name
        self.max_attempts = max_attempts
        gpu_ids = tuple(int(g) for g in ray.get_gpu_ids() if str(g).isdigit())
        if not ray.get_gpu_ids():
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        worker_id = f"{name}-raydata-{os.getpid()}"
        os.environ["CONVEYOR_WORKER_ID"] = worker_id
        info = WorkerInfo(worker_id, name, _node_id(), gpu_ids, gpu_fraction if gpu_ids else 0.0)
        self.setup_error: ErrorInfo | None = None
        self.runner: StageRunner | None = None
        try:
            self.runner = StageRunner(cloudpickle.loads(payload), name, info)
            if setup:
                self.runner.setup()
        except Exception as exc:  # noqa: BLE001 - reported as a row; the driver stops the run
            self.setup_error = ErrorInfo.from_exception(exc)
            self.runner = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.runner is None:
            error = pickle.dumps((self.name, self.setup_error))
            return _table([(SETUP_FAILED, self.name, error, None)])
        rows = batch.to_pylist()
        passed: list[tuple[int, str, bytes, bytes | None]] = []
        carried: list[Counts] = []
        tasks, labels = [], []
        for row in rows:
            if row["counts"] is not None:
                carried.extend(pickle.loads(row["counts"]))
            if row["kind"] == TASK:
                tasks.append(pickle.loads(row["data"]))
                labels.append(row["label"])
            else:
                passed.append((row["kind"], row["label"], row["data"], None))
        out: list[tuple[int, str, bytes, bytes | None]] = []
        if tasks:
            begun, cpu = time.perf_counter(), time.process_time()
            outputs, out_labels, filtered, failures, retried = self._process(tasks, labels)
            busy, cpu = time.perf_counter() - begun, time.process_time() - cpu
            for data, label in zip(outputs, out_labels, strict=True):
                out.append((TASK, label, data, None))
            for record in failures:
                out.append((FAILURE, record.task, pickle.dumps(record), None))
            done = len(tasks) - len(failures)  # as the controller counts: inputs that finished
            carried.append(
                (self.index, done, len(outputs), filtered, len(failures), retried, busy, cpu)
            )
        out.extend(passed)
        if carried:
            blob = pickle.dumps(carried)
            if out:
                kind, label, data, _ = out[0]
                out[0] = (kind, label, data, blob)
            else:
                out.append((COUNTS, "", b"", blob))
        return _table(out)

    def _run(self, tasks: list[Any], labels: list[str]) -> tuple[list[bytes], list[str], int]:
        """A batch's outputs, pickled: one that cannot be fails its input here
        (``UnpicklablePayload``, at once), not the Ray Data task that carries the batch."""
        runner = self.runner
        assert runner is not None
        outputs, out_labels, filtered = runner.run(tasks, labels)
        return [_dumps(obj, None) for obj in outputs], out_labels, filtered

    def _process(
        self, tasks: list[Any], labels: list[str]
    ) -> tuple[list[bytes], list[str], int, list[FailureRecord], int]:
        """Run a batch; on an exception retry its inputs one at a time, as the controller does."""
        try:
            outputs, out_labels, filtered = self._run(tasks, labels)
            return outputs, out_labels, filtered, [], 0
        except Exception as exc:  # noqa: BLE001 - retried below, then recorded
            first = ErrorInfo.from_exception(exc)
        outputs, out_labels, filtered, failures, retried = [], [], 0, [], 0
        for task, label in zip(tasks, labels, strict=True):
            error, attempts = first, 1
            final = error.final and len(tasks) == 1
            while not final and attempts < self.max_attempts:
                retried += 1
                attempts += 1
                try:
                    one, one_labels, one_filtered = self._run([task], [label])
                except Exception as exc:  # noqa: BLE001 - the next attempt, or a record
                    error = ErrorInfo.from_exception(exc)
                    final = error.final
                    continue
                outputs.extend(one)
                out_labels.extend(one_labels)
                filtered += one_filtered
                break
            else:
                failures.append(
                    FailureRecord(
                        self.name,
                        label,
                        error.type,
                        error.message,
                        error.traceback,
                        attempts,
                        deferred=error.deferred,
                    )
                )
        return outputs, out_labels, filtered, failures, retried

    def __del__(self) -> None:
        runner, self.runner = getattr(self, "runner", None), None
        if runner is not None:
            with contextlib.suppress(BaseException):
                runner.teardown()


_TASK_FNS: dict[tuple[int, bytes], _StageFn] = {}


def _task_fn(batch: pa.Table, **kwargs: Any) -> pa.Table:
    """A stage without ``setup`` as a Ray task: the stage is loaded once per worker process."""
    key = (kwargs["index"], kwargs["payload"])
    fn = _TASK_FNS.get(key)
    if fn is None:
        fn = _TASK_FNS[key] = _StageFn(**kwargs, setup=False)
    return fn(batch)


def _node_setup(payload: bytes, name: str, node: NodeInfo, sys_path: list[str]) -> ErrorInfo | None:
    from conveyor.backends.ray import _node_setup as run

    return run(payload, name, node, sys_path)


class RayDataRun:
    """An iterator over the pipeline's outputs, like ``Run``; ``result`` once exhausted."""

    def __init__(
        self,
        executor: RayDataExecutor,
        specs: list[StageSpec],
        initial_tasks: Iterable[Any] | None,
        pipeline_name: str,
    ) -> None:
        self.executor = executor
        self.specs = specs
        self.initial_tasks = initial_tasks
        self.pipeline_name = pipeline_name
        self._result = RunResult()
        self._iter: Iterator[Any] | None = None

    def __iter__(self) -> RayDataRun:
        return self

    def __next__(self) -> Any:
        if self._iter is None:
            self._iter = self._run()
        return next(self._iter)

    @property
    def result(self) -> RunResult:
        return self._result

    def close(self) -> None:
        if self._iter is not None:
            self._iter.close()  # type: ignore[attr-defined]

    def __enter__(self) -> RayDataRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the run --------------------------------------------------------------------------
    def _run(self) -> Iterator[Any]:
        executor = self.executor
        t0 = time.perf_counter()
        result = self._result
        stats = {s.name: StageStats(s.name) for s in self.specs}
        result.stats = stats
        names = [s.name for s in self.specs]
        outputs = 0
        context = ray.data.DataContext.get_current()
        saved = (context.enable_progress_bars, context.verbose_stats_logs)
        context.enable_progress_bars = executor.progress_bars
        context.verbose_stats_logs = False
        try:
            rows = self._source()
            result.counts = {
                "inputs": len(rows),
                "outputs": 0,
                "filtered": 0,
                "failed": 0,
                "skipped": 0,
            }
            if not rows:  # nothing to do: no cluster is started (a private one takes seconds)
                result.completed = True
                return
            executor.connection.connect()
            self._check_fits()
            for spec in self.specs:
                _warn_unhonoured(spec)
            self._setup_on_nodes()
            ds = self._plan(rows)
            result.startup_s = time.perf_counter() - t0
            for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                for row in batch.to_pylist():
                    if row["counts"] is not None:
                        for (
                            index,
                            n_in,
                            n_out,
                            filtered,
                            failed,
                            retried,
                            busy,
                            cpu,
                        ) in pickle.loads(row["counts"]):
                            s = stats[names[index]]
                            s.tasks_in += n_in
                            s.tasks_out += n_out
                            s.filtered += filtered
                            s.failed += failed
                            s.retried += retried
                            s.busy_s += busy
                            s.cpu_s += cpu
                    if row["kind"] == FAILURE:
                        result.failures.append(pickle.loads(row["data"]))
                    elif row["kind"] == SETUP_FAILED:
                        name, error = pickle.loads(row["data"])
                        raise StageSetupError(
                            name, f"{error.type}: {error.message}", error.traceback
                        )
                    elif row["kind"] == TASK:
                        if result.first_output_s is None:
                            result.first_output_s = time.perf_counter() - t0
                        outputs += 1
                        yield pickle.loads(row["data"])
            result.completed = True
        finally:
            context.enable_progress_bars, context.verbose_stats_logs = saved
            result.wall_s = time.perf_counter() - t0
            if not result.startup_s:
                result.startup_s = result.wall_s
            result.counts.update(
                outputs=outputs,
                filtered=sum(s.filtered for s in stats.values()),
                failed=len(result.failures),
            )
            executor.connection.disconnect()

    def _source(self) -> list[dict[str, Any]]:
        """Source tasks as rows (Ray Data needs the list up front): lineage id = position."""
        tasks = [EmptyTask()] if self.initial_tasks is None else self.initial_tasks
        rows = []
        for position, task in enumerate(tasks):
            label = str(position)
            if isinstance(task, Task):
                task.task_id = label
            rows.append({"kind": TASK, "label": label, "data": _dumps(task, None), "counts": None})
        return rows

    def _check_fits(self) -> None:
        """A stage no node can host fails the run before it starts: Ray would otherwise wait
        for such an actor for ever (it reserves CPUs, so CPUs count here too)."""
        nodes = _live_nodes()
        memory = None
        if any(spec.resources.gpu_memory_gb for spec in self.specs):
            memory = self._gpu_memory_gb()
            nodes = [dataclasses.replace(node, gpu_memory_gb=memory) for node in nodes]
        for spec in self.specs:
            why = fits_nowhere(spec.name, spec.resources, nodes, share_cpus=False)
            if why is not None:
                raise BackendError(why)
        cpus, gpus = sum(node.cpus for node in nodes), sum(n.gpus for n in nodes)
        check_pools_fit(self.specs, cpus, gpus, memory)

    def _setup_on_nodes(self) -> None:
        """``setup_on_node`` of every stage that has one, on every live node, before the plan."""
        staged = [s for s in self.specs if s.has_node_setup]
        if not staged:
            return
        fn = ray.remote(num_cpus=0, max_retries=0)(_node_setup)
        sys_path = [p for p in sys.path if p]
        pending = []
        for info in _live_nodes():
            strategy = NodeAffinitySchedulingStrategy(info.node_id, soft=False)
            for spec in staged:
                ref = fn.options(scheduling_strategy=strategy).remote(
                    spec.payload, spec.name, info, sys_path
                )
                pending.append((spec, ref))
        for spec, ref in pending:
            error = ray.get(ref)
            if error is not None:
                raise StageSetupError(spec.name, f"{error.type}: {error.message}", error.traceback)

    def _gpu_memory_gb(self) -> float | None:
        """The smallest GPU of the cluster (a fraction that fits there fits everywhere)."""
        if self.executor.gpu_memory_gb is not None:
            return self.executor.gpu_memory_gb
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU")]
        known = [m for m in probe_gpu_memory(nodes).values() if m]
        return min(known) if known else None

    def _plan(self, rows: list[dict[str, Any]]) -> ray.data.Dataset:
        executor = self.executor
        resources = ray.cluster_resources()
        cpus, gpus = float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0))
        sys_path = [p for p in sys.path if p]
        blocks = max(1, min(len(rows), executor.max_blocks))
        ds = (
            ray.data.from_items(rows, override_num_blocks=blocks)
            if rows
            else ray.data.from_items([])
        )
        for position, spec in enumerate(self.specs):
            res = spec.resources
            if res.gpus >= 1:
                gpu_share = float(res.whole_gpus)
            elif res.gpu_memory_gb:
                gpu_share = res.gpu_fraction(self._gpu_memory_gb())
            else:
                gpu_share = res.gpus
            kwargs = {
                "payload": spec.payload,
                "index": spec.index,
                "name": spec.name,
                "max_attempts": spec.max_attempts or executor.max_attempts,
                "sys_path": sys_path,
                "gpu_fraction": gpu_share if 0 < gpu_share < 1 else (1.0 if gpu_share else 0.0),
            }
            limit = math.inf
            if res.cpus > 0:
                limit = cpus / res.cpus
            if gpu_share > 0:
                limit = min(limit, gpus / gpu_share)
            limit = max(1, int(limit if math.isfinite(limit) else len(rows) or 1))
            if executor.max_workers_per_stage is not None:
                limit = min(limit, executor.max_workers_per_stage)
            remote: dict[str, float] = {"num_cpus": res.cpus}
            if gpu_share:
                remote["num_gpus"] = gpu_share
            if _runs_in_actors(spec):
                pool = (
                    ray.data.ActorPoolStrategy(size=spec.num_workers)
                    if spec.num_workers
                    else ray.data.ActorPoolStrategy(min_size=1, max_size=limit)
                )
                ds = ds.map_batches(
                    _StageFn,
                    fn_constructor_kwargs=kwargs,
                    batch_size=spec.batch_size,
                    batch_format="pyarrow",
                    zero_copy_batch=True,
                    compute=pool,
                    **remote,
                )
            else:
                ds = ds.map_batches(
                    _task_fn,
                    fn_kwargs=kwargs,
                    batch_size=spec.batch_size,
                    batch_format="pyarrow",
                    zero_copy_batch=True,
                    compute=ray.data.TaskPoolStrategy(size=spec.num_workers),
                    **remote,
                )
            if executor.rows_per_block and position + 1 < len(self.specs):
                # a fan-out leaves a task's children in one block, which reaches the next
                # stage as one serial call (ray#54430); cutting blocks fixes that, at a cost
                # (``rows``, the source rows, still sizes a later stage that asks no CPU)
                per_block = max(executor.rows_per_block, self.specs[position + 1].batch_size)
                ds = ds.repartition(target_num_rows_per_block=per_block)
        return ds


def check_pools_fit(
    specs: Sequence[StageSpec], cpus: float, gpus: int | None, memory: float | None = None
) -> None:
    """``BackendError`` unless every actor pool can keep its actors on a cluster of ``cpus``
    CPUs and ``gpus`` GPUs (None: not judged) for the whole run, with a task's CPUs for the
    task stages besides: where the cluster has fewer, an actor never starts and Ray Data
    waits for it for ever (it did). A ``gpu_memory_gb`` stage's share is its memory over
    ``memory``, the smallest GPU's (it counted as no GPU). A command asks before it starts
    a private cluster whose size it knows (``--cpus``)."""
    pools = [
        (spec, (spec.num_workers or 1) * spec.resources.cpus)
        for spec in specs
        if _runs_in_actors(spec)
    ]
    tasks = max((s.resources.cpus for s in specs if not _runs_in_actors(s)), default=0)
    needed = sum(c for _, c in pools) + tasks
    if pools and needed > cpus + 1e-9:
        each = ", ".join(f"{spec.name} {c:g}" for spec, c in pools)
        also = f", and {tasks:g} for a task of the other stages" if tasks else ""
        raise BackendError(
            f"RayDataExecutor: the stages' actor pools hold {needed - tasks:g} CPUs for the "
            f"whole run ({each}){also}, more than the cluster's {cpus:g}: Ray Data would "
            "wait for ever for an actor that cannot start. Give the stages fewer CPUs (or "
            "the cluster more), or run the streaming executor, whose stages share the CPUs"
        )
    if gpus is None:
        return
    shares = [
        (spec, (spec.num_workers or 1) * _gpu_share(spec.resources, memory))
        for spec in specs
        if spec.resources.gpus > 0 or (spec.resources.gpu_memory_gb and memory)
    ]
    if sum(g for _, g in shares) > gpus + 1e-9:
        each = ", ".join(f"{spec.name} {g:g}" for spec, g in shares)
        raise BackendError(
            f"RayDataExecutor: the stages' actor pools hold {sum(g for _, g in shares):g} "
            f"GPUs for the whole run ({each}), more than the cluster's {gpus}: Ray Data "
            "would wait for ever for an actor that cannot start"
        )


def _gpu_share(res: Resources, memory: float | None) -> float:
    """The GPUs one actor of a stage holds: whole ones, a fraction, or its memory's share of
    the smallest GPU (``memory``)."""
    if res.gpus >= 1:
        return float(res.whole_gpus)
    if res.gpu_memory_gb and memory:
        return res.gpu_fraction(memory)
    return float(res.gpus)


def _runs_in_actors(spec: StageSpec) -> bool:
    """Whether the plan runs the stage in an actor pool: it sets up, tears down or takes a
    GPU (the others run as Ray tasks)."""
    res = spec.resources
    return (
        spec.stage.overrides("setup")
        or spec.stage.overrides("teardown")
        or res.gpus > 0
        or res.gpu_memory_gb > 0
    )


#: stage settings a Ray Data plan cannot honour, and what the run does instead
UNHONOURED = {
    "timeout_s": "a hung batch is not killed",
    "batch_wait_s": "batches are formed per block",
    "max_batches_per_worker": "Ray Data keeps its actors for the run",
}


def _warn_unhonoured(spec: StageSpec) -> None:
    """Say which of a stage's settings this executor leaves aside (silently, a hung call
    held the run that ``timeout_s`` was set to protect)."""
    said = [f"{key} ({why})" for key, why in UNHONOURED.items() if getattr(spec, key) is not None]
    if said:
        warnings.warn(
            f"RayDataExecutor: stage {spec.name!r} sets {'; '.join(said)}; the streaming "
            "executor honours them",
            UserWarning,
            stacklevel=2,
        )


class RayDataExecutor:
    """Runs a built pipeline as a Ray Data plan; ``Pipeline.run``/``stream`` accept it.

    Connecting follows ``RayBackend``: ``address`` (or ``RAY_ADDRESS``) joins a cluster,
    otherwise a private local one is started with ``num_cpus``/``num_gpus`` and stopped when
    the run ends. ``gpu_memory_gb`` turns ``Resources(gpu_memory_gb=...)`` into a fraction.

    Source tasks are spread over at most ``max_blocks`` blocks. ``rows_per_block`` cuts the
    blocks between stages to that many rows (at least the next stage's batch size): after a
    fan-out the children of one task otherwise stay in one block and the next stage processes
    them in one call, one after the other. It costs Ray Data a repartition per stage, which
    on small machines costs more than it gains (see the README), so it is off by default.
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
        *,
        max_attempts: int = 3,
        gpu_memory_gb: float | None = None,
        max_workers_per_stage: int | None = None,
        max_blocks: int = 1000,
        rows_per_block: int | None = None,
        object_store_memory: int | None = None,
        node_ip_address: str | None = None,
        progress_bars: bool = False,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(
                f"RayDataExecutor: max_attempts must be an int >= 1, got {max_attempts!r}"
            )
        if max_workers_per_stage is not None and max_workers_per_stage < 1:
            raise ValueError(
                "RayDataExecutor: max_workers_per_stage must be None or >= 1, got "
                f"{max_workers_per_stage!r}"
            )
        if max_blocks < 1:
            raise ValueError(f"RayDataExecutor: max_blocks must be >= 1, got {max_blocks!r}")
        if rows_per_block is not None and rows_per_block < 1:
            raise ValueError(
                f"RayDataExecutor: rows_per_block must be None or >= 1, got {rows_per_block!r}"
            )
        if gpu_memory_gb is not None and not gpu_memory_gb > 0:
            raise ValueError(f"RayDataExecutor: gpu_memory_gb must be > 0, got {gpu_memory_gb!r}")
        self.connection = RayConnection(
            address, num_cpus, num_gpus, object_store_memory, node_ip_address, init_kwargs or {}
        )
        self.max_attempts = max_attempts
        self.gpu_memory_gb = gpu_memory_gb
        self.max_workers_per_stage = max_workers_per_stage
        self.max_blocks = max_blocks
        self.rows_per_block = rows_per_block
        self.progress_bars = progress_bars

    def held(self) -> contextlib.AbstractContextManager[None]:
        """A private cluster stays up between the runs within the block (``RayConnection``)."""
        return self.connection.held()

    def start(
        self,
        specs: list[StageSpec],
        initial_tasks: Iterable[Any] | None = None,
        pipeline_name: str = "pipeline",
        *,
        journal: Journal | None = None,
        journal_key: JournalKey | None = None,
        description: str = "",
    ) -> RayDataRun:
        del description  # Ray Data has its own dashboard; our monitors see no snapshots here
        if journal is not None:
            journal.close()
            raise JournalError(
                "RayDataExecutor keeps no journal (Ray Data does not say when all that was "
                "made from one input is done); run with StreamingExecutor(RayBackend(...)) "
                "to resume on a Ray cluster"
            )
        return RayDataRun(self, specs, initial_tasks, pipeline_name)


__all__ = ["RayDataExecutor", "RayDataRun"]


def _live_nodes() -> list[NodeInfo]:
    """The cluster's live nodes as Ray reports them (``node_id``: Ray's node id)."""
    return [
        NodeInfo(
            node["NodeID"],
            float(node["Resources"].get("CPU", 0.0)),
            int(node["Resources"].get("GPU", 0.0)),
            address=node.get("NodeManagerAddress", ""),
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]
