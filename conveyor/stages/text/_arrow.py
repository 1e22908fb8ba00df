"""Arrow warm-up shared by the text stages."""

from __future__ import annotations

import pyarrow as pa


def warm_up_arrow() -> None:
    """Pay pyarrow's lazy imports (it pulls in pandas on its first array) once per node.

    Called from ``setup_on_node``: on the local backend that runs in the stage's host process
    before it forks workers, so no worker spends ~0.3 s importing on its first batch, which would
    also make the stage look slow to the autoscaler.
    """
    pa.array(["warm"], type=pa.string())
