"""Workers' tracebacks of stages sent by value name the user's file again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from conveyor import ProcessingStage, processing_stage
from conveyor.engine.tracebacks import named_sources


class Raises(ProcessingStage[int, int]):
    def process(self, task: int) -> int:
        return helper(task)

    @staticmethod
    def check(task: int) -> None:
        raise ValueError(task)


def helper(task: int) -> int:
    raise ValueError(task)


def frame(line: int, name: str) -> str:
    return f'  File "<dynamic-code>", line {line}, in {name}'


def test_a_frame_of_the_stage_s_code_gets_its_file_and_source() -> None:
    line = Raises.process.__code__.co_firstlineno + 1
    text = f"Traceback (most recent call last):\n{frame(line, 'process')}\nValueError: 3\n"
    named = named_sources(text, Raises())
    assert f'  File "{__file__}", line {line}, in process\n    return helper(task)\n' in named
    assert named.endswith("ValueError: 3\n")
    check = Raises.check.__code__.co_firstlineno + 1
    found = named_sources(frame(check, "check"), Raises())
    assert f'File "{__file__}", line {check}, in check' in found


def test_frames_it_cannot_place_are_left_as_they_are() -> None:
    for text in (frame(1, "process"), frame(10_000, "process"), frame(5, "elsewhere"), "plain"):
        assert named_sources(text, Raises()) == text


def test_a_decorated_function_s_frame_is_named_too() -> None:
    @processing_stage(name="double")
    def double(task: Any) -> Any:
        return task * 2

    code = next(v.__code__ for v in vars(double).values() if hasattr(v, "__code__"))
    named = named_sources(frame(code.co_firstlineno + 2, "double"), double)
    assert f'File "{__file__}"' in named and "return task * 2" in named


def test_a_script_s_stage_fails_naming_the_script(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "from conveyor import Pipeline, ProcessingStage\n"
        "from conveyor.backends import LocalBackend\n"
        "from conveyor.executors import StreamingExecutor\n"
        "class Boom(ProcessingStage[int, int]):\n"
        "    def process(self, task):\n"
        "        raise ValueError('boom')\n"
        "if __name__ == '__main__':\n"
        "    result = Pipeline('p', [Boom()]).run(\n"
        "        StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=range(1))\n"
        "    print(result.failures[0].traceback)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"File \"{script}\", line 6, in process\n    raise ValueError('boom')" in done.stdout
    assert "<dynamic-code>" not in done.stdout
