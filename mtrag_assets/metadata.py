"""Turning a stage's plain metadata into Dagster metadata values."""
from __future__ import annotations

import dagster as dg

from mtrag_resources.stages.common import StageResult


def to_metadata(meta: dict) -> dict:
    out = {}
    for key, value in meta.items():
        if isinstance(value, bool) or value is None:
            out[key] = dg.MetadataValue.text(str(value))
        elif isinstance(value, (int, float)):
            out[key] = value
        elif isinstance(value, (dict, list)):
            out[key] = dg.MetadataValue.json(value)
        else:
            out[key] = dg.MetadataValue.text(str(value))
    return out


def materialize_result(result: StageResult, extra: dict | None = None, check_results=None) -> dg.MaterializeResult:
    metadata = to_metadata(result.metadata)
    if extra:
        metadata.update(extra)
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(result.data_version),
                                check_results=check_results)


def sample_table(rows: list[dict], columns: list[str], n: int = 5) -> dg.MetadataValue:
    records = [dg.TableRecord({c: _cell(r.get(c)) for c in columns}) for r in rows[:n]]
    schema = dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in columns])
    return dg.MetadataValue.table(records, schema=schema)


def typed_table(rows: list[dict], columns: dict[str, str]) -> dg.MetadataValue:
    """Rows as a Dagster table with typed columns (`columns`: name -> int | float | bool |
    string), so the UI sorts numbers as numbers; a missing value stays an empty cell."""
    schema = dg.TableSchema(columns=[dg.TableColumn(c, t) for c, t in columns.items()])
    records = [dg.TableRecord({c: (r.get(c) if t != "string" or r.get(c) is None else _cell(r.get(c)))
                               for c, t in columns.items()}) for r in rows]
    return dg.MetadataValue.table(records, schema=schema)


def frame_table(frame) -> dg.MetadataValue:
    """A pandas DataFrame as a Dagster table, its column types read from the dtypes (integers with
    gaps stay integers: pandas' nullable Int64), so people get sortable, typed columns in the UI."""
    import pandas as pd
    kinds = {}
    for name, dtype in frame.dtypes.items():
        if pd.api.types.is_bool_dtype(dtype):
            kinds[name] = "bool"
        elif pd.api.types.is_integer_dtype(dtype):
            kinds[name] = "int"
        elif pd.api.types.is_float_dtype(dtype):
            kinds[name] = "float"
        else:
            kinds[name] = "string"
    rows = [{k: (None if pd.isna(v) else v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in frame.to_dict("records")]
    return typed_table(rows, kinds)


def _cell(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 120 else text[:117] + "..."
