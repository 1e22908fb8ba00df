"""``conveyor report DIR``: write ``DIR/report.html`` from ``DIR/events.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    run_dir: Annotated[
        Path,
        typer.Argument(metavar="DIR", help="A run's output folder (the one holding events.jsonl)."),
    ],
) -> None:
    """Write DIR/report.html from DIR/events.jsonl."""
    from conveyor.report import ReportError, write_report

    if not run_dir.is_dir():
        reason = "not a folder" if run_dir.exists() else "no such folder"
        typer.echo(f"error: {run_dir}: {reason}", err=True)
        raise typer.Exit(code=2)
    if not (run_dir / "events.jsonl").is_file():
        typer.echo(
            f"error: {run_dir}: no events.jsonl (was the run started with --report?)", err=True
        )
        raise typer.Exit(code=2)
    try:
        path = write_report(run_dir)
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(f"report: {path}")
