"""Arrow set-up shared by the text stages.

pyarrow imports pandas lazily, on the first array it builds (~0.3 s). Importing both here, when
a stage module is loaded, makes that happen once in the process that loads the stage (the
local backend's root), whose stage hosts and workers inherit it: no worker pays it on its
first batch, where it would also make the stage look slow to the autoscaler.
"""

from __future__ import annotations

import pandas  # noqa: F401 - imported for its side effect on pyarrow, see above
import pyarrow as pa


def warm_up_arrow() -> None:
    """Finish pyarrow's lazy pandas set-up (cheap once pandas is imported)."""
    pa.array(["warm"], type=pa.string())


warm_up_arrow()
