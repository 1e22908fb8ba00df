"""The benchmarks' shared helpers that decide what a printed figure means."""

from __future__ import annotations

import importlib
import py_compile
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("_common")


@pytest.fixture
def bytecode(common: ModuleType) -> ModuleType:
    return importlib.import_module("_bytecode")  # on the path ``common`` put it on


def test_a_package_without_bytecode_is_named_until_it_is_compiled(
    common: ModuleType, bytecode: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs whose processes compile their imports are told apart from a pip-installed
    environment's: the machine line names the packages whose bytecode is missing."""
    package = tmp_path / "cvy_probe_package"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(bytecode, "BYTECODE_PROBES", ("cvy_probe_package", "cvy_not_installed"))

    assert bytecode.without_bytecode() == ["cvy_probe_package"]
    assert "bytecode MISSING for cvy_probe_package (every process compiles them" in (
        common.machine_line(1)
    )

    py_compile.compile(str(package / "__init__.py"), doraise=True)  # as pip does on install
    assert bytecode.without_bytecode() == []
    assert common.machine_line(1).endswith("installed packages' bytecode compiled")
    assert bytecode.without_bytecode(["cvy_not_installed"]) == []
