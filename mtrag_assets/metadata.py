"""Turning a stage's plain metadata into Dagster metadata values, as a maintainer reads them in
the UI: numbers stay numbers (scripts read `.value`), floats are rounded, durations and byte
counts are typed, counters are small markdown tables, and nothing is an empty row."""
from __future__ import annotations

import math

import dagster as dg

from mtrag_resources.stages.common import StageResult

# A counter's markdown table lists this many rows (largest first) and says how many it left out;
# Dagster shows a markdown value inline below 1000 characters, behind "[Show Markdown]" above.
COUNTER_ROWS = 20
# Counters whose values are sizes in bytes (name -> size), with what they count; a counter whose
# key has a `bytes` word is one too.
SIZE_COUNTERS = {"skipped_too_large": "file"}
# Keys holding a filesystem path (a PathMetadataValue: shown with a copy button).
PATH_KEYS = {"root", "path", "location"}


def to_metadata(meta: dict) -> dict:
    """`meta`'s entries as Dagster metadata, keys unchanged. A value that is None or empty ("",
    {}, []) is left out; a bool is its text ("True"/"False"). Numbers stay numeric: a duration
    (`seconds`, `*_seconds`, `*_s`, `*_ms`, but not a rate `*_per_s`) is a float rounded to 4
    significant digits and at most 3 decimals, any other float 4 significant digits, an int an
    int; a byte count (a key with a `bytes` word: `bytes`, `db_bytes`, `*_bytes_written`) is an int
    followed by `<key>_readable` ("61.6 MiB") where it is 1 KiB or more. A counter (a dict of
    names to numbers: `by_type`, `nodes_by_label`, ...) is a markdown table, largest first; other
    dicts and lists are JSON. A path under `root`, `path` or `location` is a path value."""
    out: dict = {}
    for key, value in meta.items():
        if _empty(value):
            continue
        if isinstance(value, dg.MetadataValue):
            out[key] = value
        elif isinstance(value, bool):
            out[key] = dg.MetadataValue.text(str(value))
        elif isinstance(value, (int, float)):
            if is_duration_key(key):
                out[key] = dg.MetadataValue.float(round_duration(float(value)))
            elif isinstance(value, float):
                out[key] = dg.MetadataValue.float(round_float(value))
            else:
                out[key] = dg.MetadataValue.int(value)
            if is_size_key(key) and abs(value) >= 1024:
                out[f"{key}_readable"] = dg.MetadataValue.text(readable_bytes(value))
        elif isinstance(value, dict) and _is_counter(value):
            out[key] = dg.MetadataValue.md(counter_table(key, value))
        elif isinstance(value, (dict, list, tuple)):
            out[key] = dg.MetadataValue.json(list(value) if isinstance(value, tuple) else value)
        elif isinstance(value, str) and key in PATH_KEYS and value.startswith("/"):
            out[key] = dg.MetadataValue.path(value)
        else:
            out[key] = dg.MetadataValue.text(str(value))
    return out


def is_duration_key(key: str) -> bool:
    return (key == "seconds" or key.endswith(("_seconds", "_s", "_ms"))) and not key.endswith("_per_s")


def is_size_key(key: str) -> bool:
    return "bytes" in key.split("_")


def round_float(value: float) -> float:
    """4 significant digits, the integer part kept whole (12345.6 -> 12346.0)."""
    if not math.isfinite(value) or value == 0:
        return value
    digits = max(0, 3 - math.floor(math.log10(abs(value))))
    return round(value, digits)


def round_duration(seconds: float) -> float:
    """4 significant digits, no finer than a millisecond (0.10105200700002115 -> 0.101)."""
    return round(round_float(seconds), 3) if math.isfinite(seconds) else seconds


def readable_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 64593510 -> '61.6 MiB' (binary units; below 1 KiB, bytes)."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{int(n)} B" if unit == "B" else f"{size:.1f} {unit}"


def counter_table(key: str, counts: dict) -> str:
    """A counter as a markdown table: `| <what> | count |`, one row per name, largest first (then
    by name), at most COUNTER_ROWS rows and a line saying how many more. `<what>` is the word after
    `by_` (`nodes_by_label` -> label), else the key; a size counter has a readable size column."""
    what = SIZE_COUNTERS.get(key) or (key.rsplit("by_", 1)[1] if "by_" in key else key)
    sizes = key in SIZE_COUNTERS or is_size_key(key)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    lines = [f"| {_md_cell(what)} | {'bytes | size' if sizes else 'count'} |",
             "| --- | ---: |" + (" ---: |" if sizes else "")]
    for name, number in rows[:COUNTER_ROWS]:
        shown = _md_number(number)
        lines.append(f"| {_md_cell(name)} | {shown} |" + (f" {readable_bytes(number)} |" if sizes else ""))
    if len(rows) > COUNTER_ROWS:
        rest = rows[COUNTER_ROWS:]
        lines.append("")
        lines.append(f"and {len(rest)} more (total {_md_number(sum(v for _, v in rest))})")
    return "\n".join(lines)


def _is_counter(value: dict) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())


def _empty(value) -> bool:
    return value is None or (isinstance(value, (str, dict, list, tuple, set)) and len(value) == 0)


def _md_number(number) -> str:
    return str(round_float(number)) if isinstance(number, float) else str(number)


def _md_cell(text) -> str:
    """A table cell's text with markdown's active characters escaped, so that a path's `_` or `*`
    shows as written; an empty name is `(none)`."""
    text = str(text) if str(text) else "(none)"
    for ch in "\\`*_[]<>|#":
        text = text.replace(ch, "\\" + ch)
    return " ".join(text.split())


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
