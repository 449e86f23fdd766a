"""pyarrow as mtrag imports it (`from mtrag_resources.core.arrow import pa, pc, pq`): its pandas
probe answered before the first use.

pyarrow asks whether pandas is installed the first time it converts Python values (`pa.array`,
`pa.table` of lists) or imports `pyarrow.dataset` (a filtered Parquet read), and asking imports
pandas, a cost every `mtrag build` process paid (docs/performance.md#processes) for conversions that never see a pandas object.
Here one conversion asks while pandas is hidden, and pyarrow keeps that answer for every later
probe, the dataset import's included (which stays lazy). pandas itself still imports where it is
used (the golden report), and pyarrow's explicit pandas calls (`to_pandas`, `from_pandas`) import
it when they are called. A process that loaded pandas first is left as it is."""
from __future__ import annotations

import pyarrow as pa

from mtrag_resources.core.pandas_hidden import pandas_hidden

with pandas_hidden():
    pa.array([0])  # pyarrow's pandas probe: asked once per process, answered "no pandas"

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

__all__ = ["pa", "pc", "pq", "read_parquet_file"]


def read_parquet_file(path, columns: list[str] | None = None) -> "pa.Table":
    """One Parquet file, whole or some columns: pq.read_table without a filter, without the dataset
    it builds for a path (a partitioning probe and a fragment scan per small file, read several
    times a watch batch)."""
    with pq.ParquetFile(path) as file:
        if columns is not None and not set(columns) <= set(file.schema_arrow.names):
            return pq.read_table(path, columns=columns)  # a nested or missing column: its own answer
        return file.read(columns=columns)
