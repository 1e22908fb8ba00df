"""HostSampler: the machine's CPU use, the run's own processes', and NVML's GPU utilisation."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from typing import Any

import pytest

from conveyor.monitor.host_usage import HostSampler

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_a_child_processes_cpu_time_is_the_runs_and_the_machines() -> None:
    sampler = HostSampler()
    assert sampler.cpus and sampler.gpu_count == 0
    first = sampler.sample()
    assert first.gpu_s is None
    subprocess.run([sys.executable, "-c", BURN.format(s=0.4)], check=True, timeout=60)
    second = sampler.sample()
    # the child was reaped: its time is in this process's children times
    assert second.run_cpu_s - first.run_cpu_s >= 0.35
    # the machine was at least as busy as the child made it (clock ticks: 10 ms)
    assert second.host_cpu_s - first.host_cpu_s >= 0.3
    assert second.wall_s > first.wall_s
    assert second.host_cpu_s <= second.wall_s * len(sampler.cpus) + 0.1


def test_a_live_grandchild_counts_for_the_run() -> None:
    sampler = HostSampler()
    code = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.3)!r}])\n"
        "import time; time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the grandchild ran and was reaped by the child
            totals = sampler.sample()
            if totals.run_cpu_s >= 0.3:
                break
            time.sleep(0.1)
        assert totals.run_cpu_s >= 0.3, totals
    finally:
        child.kill()
        child.wait()


def test_the_runs_counter_never_goes_back() -> None:
    sampler = HostSampler()
    values = [sampler.sample() for _ in range(20)]
    runs = [v.run_cpu_s for v in values]
    hosts = [v.host_cpu_s for v in values]
    assert runs == sorted(runs) and hosts == sorted(hosts)


class _FakeNvml:
    """pynvml with ``count`` GPUs at ``percent`` utilisation."""

    def __init__(self, count: int, percent: float) -> None:
        self.count, self.percent, self.shutdown = count, percent, 0

    def module(self) -> Any:
        fake = types.ModuleType("pynvml")
        fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
        fake.nvmlShutdown = self._shutdown  # type: ignore[attr-defined]
        fake.nvmlDeviceGetCount = lambda: self.count  # type: ignore[attr-defined]
        fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
        fake.nvmlDeviceGetUtilizationRates = (  # type: ignore[attr-defined]
            lambda handle: types.SimpleNamespace(gpu=self.percent, memory=0)
        )
        return fake

    def _shutdown(self) -> None:
        self.shutdown += 1


def test_gpus_are_measured_by_their_utilisation_over_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _FakeNvml(count=4, percent=50)
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    clock = [100.0]
    sampler = HostSampler(gpus=True, clock=lambda: clock[0])
    assert sampler.gpu_count == 2  # the GPUs CUDA would see
    clock[0] += 10.0
    assert sampler.sample().gpu_s == pytest.approx(10.0)  # 2 GPUs, half busy, 10 s
    nvml.percent = 100
    clock[0] += 2.0
    assert sampler.sample().gpu_s == pytest.approx(14.0)
    sampler.close()
    assert nvml.shutdown == 1


def test_without_nvml_gpus_are_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = HostSampler(gpus=True)
    assert sampler.gpu_count == 0 and sampler.sample().gpu_s is None


def test_a_rounding_the_wrong_way_in_the_kernels_counters_never_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conveyor.monitor import host_usage

    reads = iter([10.0, 10.06000000000131, 10.05999999999949, 10.2])
    monkeypatch.setattr(host_usage, "cpu_busy_s", lambda cpus: next(reads))
    sampler = host_usage.HostSampler()
    hosts = [sampler.sample().host_cpu_s for _ in range(3)]
    assert hosts == sorted(hosts) and hosts[-1] == pytest.approx(0.2)
