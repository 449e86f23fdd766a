"""A source's generation (stages/common.chunk_set_generation): the digest of its chunk set, the
same whether a row's part of it is taken from the last call's (the same row dict) or made anew."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.common import chunk_set_generation

pytestmark = pytest.mark.unit

_ROW = st.fixed_dictionaries({
    "chunk_id": st.text(min_size=1, max_size=6), "content_hash": st.sampled_from(["h1", "h2", "中"]),
    "parent_id": st.sampled_from([None, "p"]), "file_path": st.sampled_from(["a.py", "docs/b.md"]),
    "start_line": st.integers(0, 9), "end_line": st.integers(0, 9),
    "embed_hash": st.sampled_from(["", "e1"]), "page": st.sampled_from([None, 0, 3])})


def by_definition(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for name in ("cas_chunks", "canonical_graph", "qdrant_collection", "fts_db", "neo4j_graph"):
        h.update(f"{name}={CODE_VERSIONS[name]};".encode())
    for r in sorted(rows, key=lambda r: r["chunk_id"]):
        h.update(f"{r['chunk_id']}\0{r['content_hash']}\0{r['parent_id'] or ''}\0{r['file_path']}\0"
                 f"{r['start_line']}\0{r['end_line']}\n".encode())
        if r.get("embed_hash"):
            h.update(f"e{r['embed_hash']}\n".encode())
        if r.get("page"):
            h.update(f"p{r['page']}\n".encode())
    return h.hexdigest()[:24]


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(_ROW, max_size=8, unique_by=lambda r: r["chunk_id"]), changed=st.sets(st.integers(0, 7)))
def test_the_remembered_parts_give_the_digest_of_the_rows(rows, changed):
    assert chunk_set_generation(rows, "src") == by_definition(rows)
    # a changed row is a new dict (the chunk stage's rows are never changed in place)
    again = [dict(r, content_hash=r["content_hash"] + "x") if i in changed else r for i, r in enumerate(rows)]
    assert chunk_set_generation(again, "src") == by_definition(again) == chunk_set_generation(again)
