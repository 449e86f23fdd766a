"""pyarrow as mtrag imports it (`from mtrag_resources.core.arrow import pa, pc, pq`): its pandas
probe answered before the first use.

pyarrow asks whether pandas is installed when `pyarrow.dataset` is imported (a filtered Parquet
read) and the first time it converts Python values (`pa.array`, `pa.table` of lists), and asking
imports pandas: ~0.3 s of every `mtrag build` process, for conversions that never see a pandas
object. Here it asks once while pandas is hidden and records "no pandas" for those probes. pandas
itself still imports where it is used (the golden report), and pyarrow's explicit pandas calls
(`to_pandas`, `from_pandas`) import it when they are called. A process that loaded pandas first
is left as it is."""
from __future__ import annotations

import pyarrow as pa

from mtrag_resources.core.pandas_hidden import pandas_hidden

with pandas_hidden():
    import pyarrow.dataset  # noqa: F401 - its import is one of the probes
    pa.array([0])  # the conversions' probe: asked once per process

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

__all__ = ["pa", "pc", "pq"]
