"""``conveyor dedup``: semantic deduplication of any Parquet of (id, embedding).

It only turns options into ``semantic_dedup``'s arguments and an executor; the passes run on
the engine like any pipeline's, with the same backends.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from conveyor.cli_common import (
    ADDRESS,
    BACKEND,
    CPUS,
    LIVE,
    MEMORY_GB,
    BackendChoice,
    Machine,
    fail,
    hold_output,
)


class DedupExecutor(StrEnum):
    streaming = "streaming"
    batch = "batch"


#: how the command names the columns a missing one is given by
COLUMN_FLAGS = "name yours with --id-column, --embedding-column, --order-by"


def check_place(output: str) -> None:
    """Exit 2 with one line where OUTPUT lies under a file: it cannot be made a folder."""
    from conveyor.storage import check_output_place

    try:
        check_output_place(output)
    except ValueError as exc:
        raise fail(str(exc)) from None


def dedup(
    inputs: Annotated[
        list[str],
        typer.Argument(
            metavar="INPUT... OUTPUT",
            help="Parquet files, folders, globs or URLs of (id, embedding), then the output "
            "folder (duplicates.parquet and dedup.json are written there).",
            show_default=False,
        ),
    ],
    id_column: Annotated[str, typer.Option(help="The column of item ids.")] = "id",
    embedding_column: Annotated[
        str, typer.Option(help="The column of embeddings (a list of numbers per row).")
    ] = "embedding",
    threshold: Annotated[
        float,
        typer.Option(help="Cosine similarity at or above which an item duplicates an earlier one."),
    ] = 0.95,
    clusters: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="k-means clusters (fewer find more pairs and cost more).",
            show_default="one per 10,000 items",
        ),
    ] = None,
    order_by: Annotated[
        list[str] | None,
        typer.Option(
            help="A column deciding which item of a near-duplicate set is kept: the smallest, "
            "or with a leading - the largest (--order-by=-score; repeat the option for ties).",
            show_default="input order",
        ),
    ] = None,
    executor: Annotated[
        DedupExecutor, typer.Option(case_sensitive=False, help="How stages are scheduled.")
    ] = DedupExecutor.streaming,
    backend: BACKEND = BackendChoice.local,
    address: ADDRESS = None,
    cpus: CPUS = None,
    memory_gb: MEMORY_GB = None,
    live: LIVE = True,
) -> None:
    """Find near-duplicate items by the cosine similarity of their embeddings (k-means, then
    every pair within a cluster) and write OUTPUT/duplicates.parquet (id, duplicate_of,
    similarity: one row per item to remove) and OUTPUT/dedup.json. Of each near-duplicate set
    the first item (by --order-by, then input order) is kept."""
    from conveyor.dedup.plan import MissingColumns, SemanticDedupError
    from conveyor.dedup.semantic import PassFailed, semantic_dedup
    from conveyor.errors import ConveyorError
    from conveyor.executors import BatchExecutor, StreamingExecutor
    from conveyor.pipelines.fields import absolute

    if len(inputs) < 2:
        raise fail("give INPUT... and OUTPUT")
    if not 0 < threshold <= 1:
        raise fail(f"--threshold must be in (0, 1], got {threshold}")
    if address is not None and backend is BackendChoice.local:
        raise fail("--address needs --backend ray")
    *sources, output = [absolute(i) for i in inputs]  # "~/out" was a folder named "~"
    from rich.console import Console

    from conveyor.monitor import LiveView

    cls = BatchExecutor if executor is DedupExecutor.batch else StreamingExecutor
    # each pass's stages as they run (a compare pass over millions takes minutes)
    view = LiveView(console=Console(), live=None if live else False)
    try:
        engine = cls(Machine(cpus, None, memory_gb).backend(backend, address), monitors=[view])
    except (ImportError, ValueError, OSError, ConveyorError) as exc:  # OSError: no cluster there
        raise fail(str(exc), 2 if isinstance(exc, (ValueError, OSError)) else 1) from None
    check_place(output)
    from conveyor.pipelines.owner import output_kind, whose

    kind = output_kind(output)
    if kind is not None:  # its summary and tables would not say what the dedup wrote
        raise fail(
            f"OUTPUT {output} holds {whose(kind)}: write the dedup to another OUTPUT "
            f"(conveyor {kind} --dedup dedups its own)"
        )
    try:
        with hold_output(output), view:
            result = semantic_dedup(
                sources,
                output,
                id_column=id_column,
                embedding_column=embedding_column,
                threshold=threshold,
                n_clusters=clusters,
                executor=engine,
                order_by=tuple(order_by or ()),
            )
    except PassFailed as exc:
        raise fail(str(exc), 1) from None
    except MissingColumns as exc:
        raise fail(exc.explain(COLUMN_FLAGS)) from None
    except (SemanticDedupError, ConnectionError, PermissionError) as exc:
        raise fail(str(exc)) from None  # a store that cannot be reached or refuses: its URL
    passes = ", ".join(f"{name} {s:.1f} s" for name, s in result.passes.items())
    missing = result.skipped - result.nonfinite
    left_out = [f"{missing:,} without an embedding"] if missing else []
    left_out += [f"{result.nonfinite:,} holding NaN or infinite values"] if result.nonfinite else []
    skipped = f" ({' and '.join(left_out)} left out)" if left_out else ""
    typer.echo(
        f"{result.items:,} items{skipped}, {result.clusters:,} clusters: {result.duplicates:,} "
        f"duplicates at >= {threshold:g} in {result.wall_s:.1f} s ({passes})\n"
        f"  {result.duplicates_path}\n  {result.report_path}"
    )
