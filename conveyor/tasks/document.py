"""A batch of text documents held as a pyarrow Table (or a pandas DataFrame) with conversions.

pyarrow and pandas are imported lazily so that importing ``conveyor`` stays fast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.tasks.base import Task, wrong_data

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


@dataclass
class DocumentBatch(Task[Any]):
    """Rows of documents; ``data`` is a ``pyarrow.Table`` or a ``pandas.DataFrame``."""

    def check_data(self, data: Any) -> None:
        if data is None or _is_table(data):
            return
        raise wrong_data(self, "a pyarrow Table or a pandas DataFrame", data)

    def to_pyarrow(self) -> pa.Table:
        import pyarrow as pa

        data = self.data
        if data is None:
            return pa.table({})
        if isinstance(data, pa.Table):
            return data
        return pa.Table.from_pandas(data, preserve_index=False)

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd
        import pyarrow as pa

        data = self.data
        if data is None:
            return pd.DataFrame()
        if isinstance(data, pa.Table):
            return data.to_pandas()
        return data

    @property
    def num_items(self) -> int:
        data = self.data
        if data is None:
            return 0
        return int(data.num_rows) if hasattr(data, "num_rows") else len(data)

    @property
    def columns(self) -> list[str]:
        data = self.data
        if data is None:
            return []
        if hasattr(data, "column_names"):
            return list(data.column_names)
        return [str(c) for c in data.columns]

    def has_attribute(self, name: str) -> bool:
        """Declared-input check: a task attribute or a column of the data."""
        return hasattr(self, name) or name in self.columns


def _is_table(data: Any) -> bool:
    """A pyarrow Table or pandas DataFrame, without importing either: an object of one
    exists only once its module is loaded."""
    pa, pd = sys.modules.get("pyarrow"), sys.modules.get("pandas")
    return (pa is not None and isinstance(data, pa.Table)) or (
        pd is not None and isinstance(data, pd.DataFrame)
    )
