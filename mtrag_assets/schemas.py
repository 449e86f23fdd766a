"""Column schemas of the Parquet tables, shown on the assets in the UI."""
import dagster as dg

from mtrag_resources.core.models import Chunk, GraphNode, GraphRelation
from mtrag_resources.stores.tables import column_schema


def _schema(row_type, drop=()) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, typ) for name, typ in column_schema(row_type)
                                   if name not in drop])


CHUNK_TABLE_SCHEMA = _schema(Chunk, drop=("text", "embed_text"))  # both live in the CAS
GRAPH_NODE_SCHEMA = _schema(GraphNode)
GRAPH_RELATION_SCHEMA = _schema(GraphRelation)
