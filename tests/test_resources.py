"""Resources: validation of each field and resolution of gpu_memory_gb against a node's GPU."""

from __future__ import annotations

import dataclasses
import math

import pytest

from conveyor import Resources


def test_defaults_are_one_cpu_and_no_gpu() -> None:
    r = Resources()
    assert (r.cpus, r.gpus, r.gpu_memory_gb) == (1.0, 0.0, 0.0)
    assert not r.requires_gpu
    assert r.whole_gpus == 0


@pytest.mark.parametrize("cpus", [0, 0.0, 0.25, 0.5, 1, 3.5, 64])
def test_cpus_may_be_zero_or_fractional(cpus: float) -> None:
    assert Resources(cpus=cpus).cpus == cpus


@pytest.mark.parametrize("field", ["cpus", "gpus", "gpu_memory_gb", "memory_gb"])
def test_negative_values_are_rejected_naming_the_field_and_rule(field: str) -> None:
    with pytest.raises(ValueError, match=rf"Resources\.{field} must be >= 0"):
        Resources(**{field: -0.5})


@pytest.mark.parametrize("field", ["cpus", "gpus", "gpu_memory_gb", "memory_gb"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_values_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"Resources\.{field} must be finite"):
        Resources(**{field: value})


@pytest.mark.parametrize("field", ["cpus", "gpus", "gpu_memory_gb", "memory_gb"])
@pytest.mark.parametrize("value", ["1", None, True])
def test_non_numbers_are_rejected(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"Resources\.{field} must be a number"):
        Resources(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("gpus", [0.1, 0.25, 0.5, 0.999])
def test_gpus_below_one_is_a_fraction_of_one_device(gpus: float) -> None:
    r = Resources(gpus=gpus)
    assert r.requires_gpu
    assert r.whole_gpus == 0
    assert r.gpu_fraction(None) == gpus
    assert r.gpu_fraction(80.0) == gpus


@pytest.mark.parametrize("gpus", [1, 1.0, 2, 4.0, 8])
def test_gpus_of_one_or_more_are_whole_gpus(gpus: float) -> None:
    r = Resources(gpus=gpus)
    assert r.requires_gpu
    assert r.whole_gpus == int(gpus)
    assert isinstance(r.whole_gpus, int)
    assert r.gpu_fraction(80.0) == 0.0  # not a fractional worker


@pytest.mark.parametrize("gpus", [1.5, 2.25, 3.0001])
def test_fractional_gpus_above_one_are_rejected(gpus: float) -> None:
    with pytest.raises(ValueError, match=r"Resources\.gpus above 1 must be a whole number"):
        Resources(gpus=gpus)


def test_gpus_and_gpu_memory_together_are_rejected_naming_both() -> None:
    with pytest.raises(ValueError, match=r"either gpus or gpu_memory_gb, not both") as info:
        Resources(gpus=0.5, gpu_memory_gb=20)
    assert "gpus=0.5" in str(info.value)
    assert "gpu_memory_gb=20" in str(info.value)


def test_zero_gpus_with_gpu_memory_is_fine() -> None:
    r = Resources(cpus=2, gpus=0, gpu_memory_gb=20)
    assert r.requires_gpu
    assert r.whole_gpus == 0


@pytest.mark.parametrize(
    ("memory", "node_memory", "fraction"),
    [(20, 80, 0.25), (40, 80, 0.5), (80, 80, 1.0), (10, 40, 0.25), (24, 96, 0.25)],
)
def test_gpu_memory_becomes_a_fraction_of_the_node_gpu(
    memory: float, node_memory: float, fraction: float
) -> None:
    assert Resources(gpu_memory_gb=memory).gpu_fraction(node_memory) == pytest.approx(fraction)


def test_same_memory_request_gives_different_fractions_on_different_gpus() -> None:
    r = Resources(gpu_memory_gb=20)
    assert r.gpu_fraction(80) == pytest.approx(0.25)
    assert r.gpu_fraction(40) == pytest.approx(0.5)


@pytest.mark.parametrize("unknown", [None, 0, 0.0])
def test_gpu_memory_on_node_with_unknown_gpu_memory_raises(unknown: float | None) -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_gb=20.*unknown"):
        Resources(gpu_memory_gb=20).gpu_fraction(unknown)


def test_gpu_memory_larger_than_the_node_gpu_raises_naming_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_gb=100.*exceeds.*80") as info:
        Resources(gpu_memory_gb=100).gpu_fraction(80)
    assert "Resources(gpus=N)" in str(info.value)


def test_cpu_only_worker_has_no_gpu_fraction() -> None:
    assert Resources(cpus=4).gpu_fraction(80) == 0.0


def test_resources_are_frozen_and_hashable() -> None:
    r = Resources(cpus=2, gpus=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cpus = 3  # type: ignore[misc]
    assert r == Resources(cpus=2.0, gpus=1.0)
    assert len({r, Resources(cpus=2, gpus=1), Resources(cpus=1)}) == 2


def test_describe_lists_only_what_is_requested() -> None:
    assert Resources(cpus=0.5).describe() == "cpus=0.5"
    assert Resources(cpus=2, gpus=1).describe() == "cpus=2, gpus=1"
    assert Resources(cpus=1, gpu_memory_gb=20).describe() == "cpus=1, gpu_memory_gb=20"
    assert Resources(cpus=1, memory_gb=1.5).describe() == "cpus=1, memory_gb=1.5"


def test_memory_gb_is_host_memory_per_worker_in_bytes() -> None:
    assert Resources().memory_bytes == 0
    assert Resources(memory_gb=0.5).memory_bytes == 512 * 2**20
    assert not Resources(memory_gb=4).requires_gpu
