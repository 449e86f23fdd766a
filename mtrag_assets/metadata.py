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


def _cell(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 120 else text[:117] + "..."
