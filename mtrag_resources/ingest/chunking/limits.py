"""What one file may cost: at most `max_chunks` chunks (a source's `max_file_chunks`). Past it the
file is indexed from its start up to a cut, and one warning naming the file says where and what
was left out: nothing is dropped without a word. Every chunk is embedded, written to three stores
and held by the stages, so a 2 MB minified bundle of 30k functions would otherwise cost gigabytes.

`cap_chunks` is the cut every chunker's output can take (docs, PDFs, and code past what the code
chunker already left out): chunks are kept in file order, a child only with its parent, and the
graph facts and references of the chunks left out go with them."""
from __future__ import annotations

from mtrag_resources.core.models import ParsedFile

DEFAULT_MAX_FILE_CHUNKS = 2_000  # a source's `max_file_chunks`
DEFAULT_MAX_ISSUES = 10_000  # a source's `max_issues`: issues read from one export, the most recently updated
CUT = ": cut: "  # in a warning: the file was indexed only in part (cas_chunks reports them as cut files)


def cut_warning(file_path: str, what: str, key: str = "max_file_chunks") -> str:
    return f"{file_path}{CUT}{what}; the rest is not indexed (raise this source's {key} to index it)"


def is_cut(warning: str) -> bool:
    return CUT in warning


def cap_chunks(parsed: ParsedFile, max_chunks: int, file_path: str) -> ParsedFile:
    """`parsed` with at most `max_chunks` chunks: the first ones by line (a parent before its
    children), and a warning naming the last line kept. Unchanged when it fits."""
    if len(parsed.chunks) <= max_chunks:
        return parsed
    order = sorted(range(len(parsed.chunks)), key=lambda i: (parsed.chunks[i].start_line, i))
    kept_ids: set[str] = set()
    kept: list[int] = []
    for i in order:
        chunk = parsed.chunks[i]
        if chunk.parent_id is not None and chunk.parent_id not in kept_ids:
            continue
        if len(kept) == max_chunks:
            break
        kept.append(i)
        kept_ids.add(chunk.chunk_id)
    chunks = [parsed.chunks[i] for i in sorted(kept)]
    last_line = max((c.start_line for c in chunks if c.parent_id is not None), default=1)
    hashes = {c.content_hash for c in chunks}
    nodes = [n for n in parsed.nodes if n.chunk_id in kept_ids]
    gone = {n.node_id for n in parsed.nodes} - {n.node_id for n in nodes}
    gone |= {f"chunk:{c.chunk_id}" for c in parsed.chunks if c.chunk_id not in kept_ids}
    out = ParsedFile(
        chunks=chunks, nodes=nodes,
        relations=[r for r in parsed.relations if r.src_id not in gone and r.dst_id not in gone
                   and r.evidence_hash in hashes],
        references=[r for r in parsed.references if r.chunk_id in kept_ids],
        imports=[f for f in parsed.imports if f.get("chunk_id") in kept_ids],
        calls=[f for f in parsed.calls if f.get("evidence_hash") in hashes
               and f.get("caller_id") not in gone and f.get("class_id") not in gone],
        bases=[f for f in parsed.bases if f.get("evidence_hash") in hashes and f.get("class_id") not in gone],
        routes=[f for f in parsed.routes if f.get("chunk_id") in kept_ids],
        warnings=list(parsed.warnings), language=parsed.language)
    out.warnings.append(cut_warning(file_path, f"over max_file_chunks={max_chunks} chunks; indexed {len(chunks)}, "
                                               f"to line {last_line}"))
    return out
