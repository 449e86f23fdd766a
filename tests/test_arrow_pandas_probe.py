"""pyarrow with its pandas probe answered once (core/arrow.py): the table layer writes, reads and
converts without importing pandas, and pandas still works where it is asked for."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def _run(code: str, cwd) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=cwd)
    return out.stdout.split()


TABLE_WORK = """
import sys
from dataclasses import dataclass
from mtrag_resources.core.arrow import pa
from mtrag_resources.stores import tables
from mtrag_resources.stores.bucketed import Bucketing

@dataclass
class Row:
    file_path: str
    row_id: str
    n: int

rows = [Row(f"f{i % 7}.py", f"r{i:03d}", i) for i in range(50)]
path = "t.parquet"
tables.write_rows(path, [r.__dict__ for r in rows])
tables.write_rows_changed("b", rows, Row, "row_id", Bucketing(key="file_path", order=("row_id",)))
tables._DECODED.clear()
tables._ARROW.clear()
read = tables.read_table("b", filters=[("n", ">", 10)])
print(read.num_rows, len(tables.read_shared(path)), pa.table({"a": [1, None]}).num_rows)
print("pandas" in sys.modules)
"""


def test_the_table_layer_converts_and_reads_without_importing_pandas(tmp_path):
    out = _run(TABLE_WORK + "print(tables.read_table('b').to_pandas().shape[0])\nprint('pandas' in sys.modules)",
               tmp_path)
    assert out == ["39", "50", "2", "False", "50", "True"]  # to_pandas imports it when asked


def test_a_process_that_loaded_pandas_first_keeps_pyarrows_pandas_support(tmp_path):
    out = _run("import pandas\n" + TABLE_WORK + "print(pa.table(pandas.DataFrame({'x': [1, 2]})).num_rows)\n"
               "print(pa.array(pandas.Series([1.5])).type)", tmp_path)
    assert out == ["39", "50", "2", "True", "2", "double"]
