"""The ``conveyor`` command. Heavy imports happen inside commands so ``--help`` stays instant."""

from __future__ import annotations

import io
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

import conveyor
from conveyor.cli_common import (
    DEVICE_ERRORS,
    LIVE,
    METRICS_PORT,
    REPORT,
    CheckedCommand,
    close_monitors,
    fail,
    report_path,
    run_monitors,
)
from conveyor.cli_dedup import dedup
from conveyor.cli_image import image
from conveyor.cli_report import report as report_command
from conveyor.cli_text import text
from conveyor.cli_video import video

app = typer.Typer(
    name="conveyor",
    help="Streaming, auto-balanced pipelines for curating datasets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: the most documents ``conveyor text-demo`` generates
DEMO_DOCS = 1_000_000


def command(*args: Any, **kwargs: Any) -> Any:
    """``app.command``, each value checked before the command runs (``CheckedCommand``)."""
    return app.command(*args, cls=CheckedCommand, **kwargs)


class ExecutorChoice(StrEnum):
    streaming = "streaming"
    batch = "batch"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"conveyor {conveyor.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Streaming, auto-balanced pipelines for curating datasets."""
    # a path the OS gave as bytes that are not UTF-8 (an old camera's file names) is printed
    # escaped rather than ending the command half-way through its output
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


_CPUS = Annotated[
    float | None,
    typer.Option(min=0.5, help="CPUs the local backend may use.", show_default="this machine's"),
]
_EXECUTOR = Annotated[
    ExecutorChoice, typer.Option(case_sensitive=False, help="How stages are scheduled.")
]


@command(short_help="Curate generated videos with the full CPU pipeline; check them.")
def demo(
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where input/ and output/ go.", show_default="<tmp>/conveyor-demo"),
    ] = None,
    executor: _EXECUTOR = ExecutorChoice.streaming,
    live: LIVE = True,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the generated videos.")] = 0,
    cpus: _CPUS = None,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Generate synthetic videos (cuts, a crossfade, a still stretch, a broken file) and curate
    them with the full CPU video pipeline, then check the result against what was generated.
    Exits 1 if a check fails."""
    settings = dict(locals())
    from rich.console import Console

    from conveyor.demos.video import DEFAULT_WORKDIR, check_workdir, print_report, run_demo
    from conveyor.pipelines.fields import package_problems

    console = Console()
    root = workdir or DEFAULT_WORKDIR
    missing = package_problems(
        [("av", "the video demo", "video"), ("torch", "the video demo", "video")]
    )
    if missing:
        raise fail("; ".join(missing))
    try:
        check_workdir(root)
    except ValueError as exc:
        raise fail(str(exc)) from None
    watch = run_monitors(root / "output", metrics_port, report, settings, console.print)
    try:
        outcome = run_demo(
            root,
            seed=seed,
            executor=executor.value,
            live=live,
            cpus=cpus,
            console=console,
            monitors=watch,
        )
    except OSError as exc:  # the work folder's disk full, ...: said, not a traceback
        where = f"--workdir {root}: " if exc.errno in DEVICE_ERRORS else ""
        raise fail(f"{where}{exc}", code=1) from None
    finally:
        close_monitors(watch)
    print_report(outcome, console)
    _print_report_path(watch)
    if not outcome.ok:
        raise typer.Exit(code=1)


@command("text-demo", short_help="Curate a generated web-text corpus; check the filters.")
def text_demo(
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where input/ and output/ go.", show_default="<tmp>/conveyor-text-demo"),
    ] = None,
    files: Annotated[int, typer.Option(min=1, max=10_000, help="JSONL files to generate.")] = 40,
    docs_per_file: Annotated[
        int, typer.Option(min=1, max=100_000, help="Documents per file.")
    ] = 200,
    executor: _EXECUTOR = ExecutorChoice.streaming,
    live: LIVE = True,
    seed: Annotated[int, typer.Option(help="Seed of the generated corpus.")] = 0,
    cpus: _CPUS = None,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Generate a synthetic web-text corpus and curate it: partition, read, filter, annotate,
    write Parquet. Exits 1 if a task failed or the filters disagree with the generator labels."""
    settings = dict(locals())
    from rich.console import Console

    from conveyor.demos import check_places
    from conveyor.demos.text import DEFAULT_WORKDIR, print_report, run_demo

    if files * docs_per_file > DEMO_DOCS:  # about a kilobyte each: a demo, not a disk filler
        raise fail(f"--files x --docs-per-file must be at most {DEMO_DOCS:,} documents")
    console = Console()
    root = workdir or DEFAULT_WORKDIR
    try:
        check_places(root)
    except ValueError as exc:
        raise fail(str(exc)) from None
    watch = run_monitors(root / "output", metrics_port, report, settings, console.print)
    try:
        outcome = run_demo(
            root,
            files,
            docs_per_file,
            executor=executor.value,
            live=live,
            seed=seed,
            cpus=cpus,
            console=console,
            monitors=watch,
        )
    except OSError as exc:  # the work folder's disk full, ...: said, not a traceback
        where = f"--workdir {root}: " if exc.errno in DEVICE_ERRORS else ""
        raise fail(f"{where}{exc}", code=1) from None
    finally:
        close_monitors(watch)
    print_report(outcome, console)
    _print_report_path(watch)
    if not outcome.ok:
        raise typer.Exit(code=1)


def _print_report_path(monitors: list[object], label: str = "report:") -> None:
    html = report_path(monitors)  # type: ignore[arg-type]
    if html is not None:
        typer.echo(f"{label} {html}")


# one line each in `conveyor --help` (each command's own --help says the rest)
command(short_help="Videos to filtered, embedded H.264 clips; resumes.")(video)
command(name="report", short_help="Write DIR/report.html from DIR/events.jsonl.")(report_command)
command(short_help="JSONL or Parquet text: filters, language ID, dedup.")(text)
command(short_help="Near-duplicates by the cosine similarity of embeddings.")(dedup)
command(short_help="Images to WebDataset shards: filters, embeddings, dedup; resumes.")(image)


@command(short_help="Run a scenario on the simulated backend's virtual clock.")
def simulate(
    scenario: Annotated[
        str | None,
        typer.Argument(
            help="A scenario YAML file, or the name of a shipped scenario (see --list).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Folder for the chart (PNG) and the report (JSON).")
    ] = Path("sim-out"),
    executor: Annotated[
        ExecutorChoice | None,
        typer.Option(case_sensitive=False, help="Override the scenario's executor."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    chart: Annotated[bool, typer.Option("--chart/--no-chart", help="Write the PNG chart.")] = True,
    list_scenarios: Annotated[
        bool, typer.Option("--list", help="List the shipped scenarios and exit.")
    ] = False,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Run a scenario on the simulated backend (the real controller on a virtual clock) and
    print, per stage, workers over time, busy fraction after warm-up and throughput."""
    settings = dict(locals())
    import json

    from conveyor.errors import BackendError
    from conveyor.sim import ScenarioError, format_report, resolve_scenario, shipped_scenarios
    from conveyor.sim import simulate as run_simulation
    from conveyor.sim.scenario import batch_problem
    from conveyor.storage import check_output_place

    if list_scenarios:
        from conveyor.sim import parse_scenario_text

        for name, text in shipped_scenarios().items():
            description = parse_scenario_text(text, name).description.strip()
            first = description.split(". ")[0].rstrip(".")
            typer.echo(f"{name:<28} {first}.")
        return
    if scenario is None:
        typer.echo("Missing SCENARIO (a YAML file or a shipped name; --list shows them).", err=True)
        raise typer.Exit(code=2)
    try:
        loaded = resolve_scenario(scenario)
    except ScenarioError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        check_output_place(out)
    except ValueError as exc:
        raise fail(f"--out: {exc}") from None
    problem = batch_problem(loaded, executor.value if executor else loaded.executor.kind)
    if problem:
        raise fail(f"scenario {loaded.name!r}: {problem}")
    watch = run_monitors(out, metrics_port, report, settings)
    try:
        sim = run_simulation(
            loaded, executor=executor.value if executor else None, seed=seed, monitors=watch
        )
    except BackendError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    finally:
        close_monitors(watch)
    summary = sim.report
    typer.echo(format_report(summary))
    # the extension is appended, never put in with with_suffix: that would cut "v1.5" to "v1"
    stem = f"{summary.scenario}-{summary.executor}-seed{summary.seed}"
    json_path = out / f"{stem}.json"
    try:
        out.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary.to_dict(), indent=1) + "\n")
        typer.echo(f"\nreport: {json_path}")
        if chart:
            from conveyor.sim.chart import write_chart

            typer.echo(f"chart:  {write_chart(summary, out / f'{stem}.png')}")
    except OSError as exc:
        raise fail(f"--out: cannot write {exc.filename or out} ({exc.strerror or exc})") from None
    _print_report_path(watch, "html:  ")
