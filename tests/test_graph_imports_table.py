"""The graph stage's imports table in a long-lived process (canonical_graph.write_imports): written
when an import changed, left as it is when none did, and written again when another writer
replaced the file since."""
from __future__ import annotations

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stages.canonical_graph import assemble_graph, write_imports
from mtrag_resources.stores.table_changes import identity
from mtrag_resources.stores.tables import read_rows, write_rows

pytestmark = pytest.mark.unit


def parsed(files: dict[str, str]) -> list:
    return [(path, chunk_code("pkg", path, text, "python")) for path, text in sorted(files.items())]


def rows_on_disk(layout: SourceLayout) -> list[tuple]:
    return [(r["module_qn"], r["imported"], r["alias"]) for r in read_rows(layout.imports)]


def stage_imports(layout: SourceLayout, files: list) -> list[dict]:
    """As the graph stage: the graph assembled first (each file's part, with its import rows, is
    kept for the next call), then the imports written."""
    assemble_graph(SourceSpec(id="pkg", kind="code", path="."), files)
    return write_imports(layout, "pkg", files)


@pytest.mark.parametrize("write", [stage_imports, lambda layout, files: write_imports(layout, "pkg", files)],
                         ids=["after_the_graph", "alone"])
def test_the_table_is_written_only_when_an_import_changed(tmp_path, write):
    layout = SourceLayout(Settings(home=tmp_path), "pkg")
    files = {"pkg/a.py": "import os\nfrom pkg.b import g as h\n\ndef f():\n    return h()\n",
             "pkg/b.py": "def g():\n    return 1\n"}
    first = parsed(files)
    rows = write(layout, first)
    assert [(r["module_qn"], r["imported"], r["alias"]) for r in rows] == rows_on_disk(layout)
    assert ("pkg.a", "pkg.b.g", "h") in rows_on_disk(layout)
    written = identity(layout.imports)

    # b.py parsed again with a new function: no import changed, the file stays the one written
    edited = [first[0], parsed({"pkg/b.py": files["pkg/b.py"] + "\ndef k():\n    return 2\n"})[0]]
    write(layout, edited)
    assert identity(layout.imports) == written

    # a.py's alias changes: written, and what the table holds is the new rows
    changed = [parsed({"pkg/a.py": files["pkg/a.py"].replace("as h", "as hh")})[0], edited[1]]
    write(layout, changed)
    assert identity(layout.imports) != written
    assert ("pkg.a", "pkg.b.g", "hh") in rows_on_disk(layout)
    assert ("pkg.a", "pkg.b.g", "h") not in rows_on_disk(layout)


def test_a_table_another_writer_replaced_is_written_again(tmp_path):
    layout = SourceLayout(Settings(home=tmp_path), "pkg")
    files = parsed({"pkg/a.py": "import os\n"})
    write_imports(layout, "pkg", files)
    write_rows(layout.imports, [{"module_qn": "other", "imported": "x", "alias": ""}])  # another writer
    write_imports(layout, "pkg", files)  # the same files: this process's memo says nothing changed
    assert rows_on_disk(layout) == [("pkg.a", "os", "os")]
