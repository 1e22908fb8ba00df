"""The ``conveyor`` command. Heavy imports happen inside commands so ``--help`` stays instant."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

import conveyor

app = typer.Typer(
    name="conveyor",
    help="Streaming, auto-balanced pipelines for curating datasets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


@app.command()
def demo(
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where input/ and output/ go.", show_default="<tmp>/conveyor-demo"),
    ] = None,
    files: Annotated[int, typer.Option(min=1, help="JSONL files to generate.")] = 40,
    docs_per_file: Annotated[int, typer.Option(min=1, help="Documents per file.")] = 200,
    executor: Annotated[
        ExecutorChoice, typer.Option(case_sensitive=False, help="How stages are scheduled.")
    ] = ExecutorChoice.streaming,
    live: Annotated[
        bool, typer.Option("--live/--no-live", help="Show the live per-stage view.")
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of the generated corpus.")] = 0,
    cpus: Annotated[
        float | None,
        typer.Option(
            min=0.5,
            help="CPUs the local backend may use.",
            show_default="this machine's",
        ),
    ] = None,
) -> None:
    """Generate a synthetic web-text corpus and curate it: partition, read, filter, annotate,
    write Parquet. Exits 1 if a task failed or the filters disagree with the generator labels."""
    from rich.console import Console

    from conveyor.demo import DEFAULT_WORKDIR, print_report, run_demo

    console = Console()
    report = run_demo(
        workdir or DEFAULT_WORKDIR,
        files,
        docs_per_file,
        executor=executor.value,
        live=live,
        seed=seed,
        cpus=cpus,
        console=console,
    )
    print_report(report, console)
    if not report.ok:
        raise typer.Exit(code=1)
