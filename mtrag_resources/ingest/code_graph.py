"""Source-level code graph: resolve the per-file facts (imports, calls, bases, web routes) of every
file in a source against one symbol table and emit IMPORTS, INHERITS and CALLS edges, and an
Endpoint node (`GET /login`) per web route with a ROUTES_TO edge to its handler (resolved as a call
is; an endpoint whose handler is not in the source keeps its node and gets no edge).

Only targets inside the source get an edge; external names are dropped, not guessed. An edge is
VERIFIED when scope rules lead to exactly one target; INFERRED (with `candidates`) when several
targets fit or when only a method name matched an unknown receiver (`obj.save()`)."""
from __future__ import annotations

import builtins
import posixpath
from collections import defaultdict
from dataclasses import dataclass

from mtrag_resources.core.models import GraphNode, GraphRelation, ParsedFile, stable_id
from mtrag_resources.core.session import session_cache
from mtrag_resources.ingest.routes import compose_endpoints

_SYMBOL_LABELS = ("Module", "Class", "Function", "Method")
_HANDLER_LABELS = ("Class", "Function", "Method")  # what a route may name (a class: `View.as_view()`)
_JS = ("javascript", "typescript", "tsx")
_PY_BUILTINS = set(dir(builtins))
# An unknown receiver matching more methods than this says nothing about the target.
_MAX_NAME_CANDIDATES = 5
_MAX_HOPS = 64  # re-export / star-import hops followed for one name
# The memos below are per source, in the session: one evicted costs that source a resolution from
# scratch, so the bound is past the sources a project has.
_MAX_SOURCES = 256


# The last resolution's edges per source: rel_id -> (fact, targets, verified, edge). Where a fact
# (the same object: the facts of an unchanged file are cas_chunks' memo) resolves as it did, its
# edge is the same object as before, so the graph stage's change log (stores/table_changes.py)
# finds it unchanged by identity rather than by comparing every edge's fields (docs/performance.md#stages).
_LAST_EDGES = session_cache("code_graph.last_edges", max_entries=_MAX_SOURCES)
# The last resolution's edge ids per source: (rel_type, src_id, dst_id) -> rel_id. An id is a
# sha256 (stable_id, ~1.5 us); django's 28.7k call facts hashed ~45 ms of every watch batch.
_LAST_IDS = session_cache("code_graph.last_edge_ids", max_entries=_MAX_SOURCES)
# The last resolution's resolver and call results per source (resolve_code_graph, `reuse`): a call
# whose reads of the symbol tables did not change resolves as before.
_LAST_CALLS = session_cache("code_graph.last_calls", max_entries=_MAX_SOURCES)
_KEEP_RESOLUTIONS = False  # keep_resolutions()


@dataclass
class _FileCalls:
    """One file's calls in the last resolution of its source: the ParsedFile (cas_chunks' memo: the
    same object while the file is unchanged), every table entry its calls' resolutions and edges
    read, their results by call key, and each edge it tried to add in order (rel_id, ends, add's
    arguments). A file still the same object none of whose entries changed adds those edges again
    without a step per call (django: 28.7k calls in ~880 files, ~0.1 s of a watch batch)."""
    parsed: ParsedFile
    tokens: frozenset
    resolved: dict
    attempts: list
    # ({ends: rel_id}, {rel_id: edge}, {rel_id: (fact, targets, verified, edge)}) of the last time its
    # attempts were replayed, where each added its own edge then (none was another file's): the
    # next replay merges these in C (django: ~35k attempts a watch batch, ~18 ms step by step)
    added: tuple[dict, dict, dict] | None = None


# The last resolution's calls per source and file (by the ParsedFile's id; the object is held).
_LAST_FILES = session_cache("code_graph.last_file_calls", max_entries=_MAX_SOURCES)
# ... and its imports (a _FileCalls of the file's import facts: no call results).
_LAST_IMPORTS = session_cache("code_graph.last_file_imports", max_entries=_MAX_SOURCES)
# ... and its resolver's tables per file (_FileTables).
_LAST_TABLES = session_cache("code_graph.last_file_tables", max_entries=_MAX_SOURCES)
# Per source, the last resolution's distinct calls resolved and those it took from the one before
# (resolution_counts: the graph stage's metadata shows whether the reuse works).
_COUNTS = session_cache("code_graph.resolution_counts", max_entries=_MAX_SOURCES)


@dataclass
class _FileTables:
    """One file's entries of a resolver's symbol tables, as _Resolver's loop adds them (the first in
    the file where a table keeps the first), made once per ParsedFile object. A long-lived process
    (`reuse`) builds a resolver by merging the files' parts with dict.update, in C, instead of a
    Python step per node, relation and import of every file (django: 12k nodes, 11.6k relations,
    6.2k imports, ~31 ms of each watch batch)."""
    parsed: ParsedFile
    by_id: dict[str, GraphNode]
    by_qn: dict[str, GraphNode]
    language: dict[str, str]                    # module qn -> language (the last wins)
    package: dict[tuple[str, str], list[str]]   # (dir, language) -> module qns
    methods_by_name: dict[tuple[str, str], list[str]]  # (language, name) -> method qns, no repeats
    members: dict[str, dict[str, str]]          # container qn -> name -> qn
    stars: dict[str, list[str]]
    aliases: dict[str, dict[str, str]]
    # a DEFINES relation whose end is no node of this file: what it adds depends on the files
    # before this one, so the resolver takes the loop
    foreign_defines: bool


def _file_tables(pf: ParsedFile) -> _FileTables:
    t = _FileTables(pf, {}, {}, {}, defaultdict(list), defaultdict(list), defaultdict(dict),
                    defaultdict(list), defaultdict(dict), False)
    t.foreign_defines = not _add_file(t, pf)
    return t


def _add_file(tables, pf: ParsedFile) -> bool:
    """Add one file's entries to `tables` (a _Resolver's or a _FileTables: the same attributes), as
    the files before it left them; whether every DEFINES relation's end was found there."""
    language = pf.language or (pf.chunks[0].language if pf.chunks else "")
    found = True
    for node in pf.nodes:
        tables.by_id.setdefault(node.node_id, node)
        if node.label in _SYMBOL_LABELS:
            tables.by_qn.setdefault(node.qualified_name, node)
        if node.label == "Module":
            tables.language[node.qualified_name] = language
            tables.package[(posixpath.dirname(node.file_path), language)].append(node.qualified_name)
        if node.label == "Method":
            methods = tables.methods_by_name[(language, node.name)]
            if node.qualified_name not in methods:
                methods.append(node.qualified_name)
    for rel in pf.relations:
        if rel.rel_type == "DEFINES":
            dst = tables.by_id.get(rel.dst_id)
            if dst is None:
                found = False
                continue
            # A Go/Rust method defined away from its type hangs under `module.Type`.
            tables.members[dst.qualified_name.rsplit(".", 1)[0]].setdefault(dst.name, dst.qualified_name)
    for fact in pf.imports:
        if fact["kind"] == "star":
            tables.stars[fact["module_qn"]].append(fact["bound"])
        elif fact["alias"]:
            tables.aliases[fact["module_qn"]].setdefault(fact["alias"], fact["bound"])
    return found


def _first_wins(parts: list[dict]) -> tuple[dict, bool]:
    """The parts merged as setdefault over them in order would merge them (each key where its first
    part put it, with that part's value), in C; and whether a key was in more than one part."""
    merged: dict = {}
    for part in parts:
        merged.update(part)
    repeated = len(merged) != sum(map(len, parts))
    if repeated:
        first: dict = {}
        for part in reversed(parts):
            first.update(part)
        merged.update(first)  # existing keys: their place stays, the first part's value wins
    return merged, repeated


def keep_resolutions() -> None:
    """This process resolves its sources again and again (`mtrag watch`): from now on a resolution
    records what each call read and reuses the last one's results where those reads still hold
    (bench/graph_reuse.py on django: 0.34 s a resolution after a one-file edit against 0.99 s from
    scratch; recording costs a resolution from scratch ~7%)."""
    global _KEEP_RESOLUTIONS
    _KEEP_RESOLUTIONS = True


def resolution_counts(source_id: str) -> dict[str, int]:
    """{"calls_resolved": distinct calls resolved, "calls_reused": taken from the resolution
    before} of this process's last resolution of the source ({} before any)."""
    return dict(_COUNTS.get(source_id, {}))


def resolve_code_graph(source_id: str, parsed: list[ParsedFile],
                       reuse: bool | None = None) -> tuple[list[GraphNode], list[GraphRelation]]:
    """The whole code graph of one source: every file's nodes and structural relations
    (deduplicated by id) plus the resolved IMPORTS, INHERITS and CALLS edges. `reuse` (default:
    keep_resolutions() was called): take the call results of this source's last recorded
    resolution in this process whose reads still hold, and record this one (the graph is the one
    a resolution from scratch makes)."""
    reuse = _KEEP_RESOLUTIONS if reuse is None else reuse
    resolver = _Resolver(parsed, record=reuse, memo=_LAST_TABLES.get(source_id, {}) if reuse else None)
    if reuse:
        _LAST_TABLES[source_id] = resolver.file_tables
    graph = _Edges(source_id, parsed, resolver)
    _add_bases(parsed, graph)
    # With `reuse`, a call the last resolution of this source made keeps its result where none of
    # the table entries it read changed (a watch batch re-resolves the calls of the changed files
    # and few others).
    previous = _LAST_CALLS.get(source_id) if reuse else None
    graph.changed = resolver.changed_since(previous[0]) if previous is not None else None
    earlier = previous[1] if graph.changed is not None else {}
    last_files = _LAST_FILES.get(source_id, {}) if graph.changed is not None else {}
    resolved, reused, files = _add_calls(parsed, graph, earlier, last_files, reuse)
    last_imports = _LAST_IMPORTS.get(source_id, {}) if graph.changed is not None else {}
    file_imports = _add_imports(parsed, graph, last_imports, reuse)
    nodes = _add_endpoints(source_id, parsed, graph)
    if resolver.order_dependent and earlier:
        # an import cycle or the hop bound cut a name: what it resolved to depends on what was
        # resolved before it, so this source resolves whole, as a fresh process would
        for memo in (_LAST_CALLS, _LAST_FILES, _LAST_IMPORTS):
            memo.pop(source_id, None)
        return resolve_code_graph(source_id, parsed, reuse=False)
    _LAST_EDGES[source_id] = graph.edges
    _LAST_IDS[source_id] = graph.ids
    _LAST_FILES[source_id] = files
    _LAST_IMPORTS[source_id] = file_imports
    _COUNTS[source_id] = {"calls_resolved": len(resolved) - reused, "calls_reused": reused}
    if resolver.order_dependent or "go" in resolver.language.values():
        for memo in (_LAST_CALLS, _LAST_FILES, _LAST_IMPORTS):  # Go's package imports take what the calls used: whole
            memo.pop(source_id, None)
    elif reuse:
        _LAST_CALLS[source_id] = (resolver, resolved)
    return list(nodes.values()), list(graph.relations.values())


class _Edges:
    """The relations of one resolution: every file's structural ones, then each resolved edge,
    which keeps its id (and, where the same fact made it with the same targets, its relation) from
    this source's last resolution. `changed`: the table entries that changed since the last
    resolution (None: no reuse), set before the calls are resolved."""

    def __init__(self, source_id: str, parsed: list[ParsedFile], resolver: "_Resolver"):
        self.source_id = source_id
        self.resolver = resolver
        self.relations: dict[str, GraphRelation] = {r.rel_id: r for pf in parsed for r in pf.relations}
        self.last, self.edges = _LAST_EDGES.get(source_id, {}), {}
        self.last_ids, self.ids = _LAST_IDS.get(source_id, {}), {}
        self.changed: set | None = None

    def add(self, rel_type: str, src_id: str, targets: list[str], verified: bool, fact: dict,
            attempts=None) -> None:
        if not targets:
            return
        dst = self.resolver.by_qn[targets[0]]
        if dst.node_id == src_id and rel_type != "CALLS":
            return
        ends = (rel_type, src_id, dst.node_id)
        rel_id = self.ids.get(ends) or self.last_ids.get(ends) or stable_id(*ends)
        self.ids[ends] = rel_id
        if attempts is not None:  # the file's replay (_FileCalls): the edge, or what makes it
            attempts.append((rel_id, ends, (rel_type, src_id, targets, verified, fact)))
        if rel_id in self.relations:
            return
        was = self.last.get(rel_id)
        if was is not None and was[0] is fact and was[1] == targets and was[2] == verified \
                and was[3].dst_id == dst.node_id:
            self.relations[rel_id] = was[3]
            self.edges[rel_id] = was
            return
        several = len(targets) > 1 or not verified
        self.relations[rel_id] = GraphRelation(
            rel_id=rel_id, rel_type=rel_type, src_id=src_id, dst_id=dst.node_id,
            confidence="INFERRED" if several else "VERIFIED",
            candidates=sorted(targets) if several else [],
            evidence_file=fact["file_path"], evidence_start=fact["line"],
            evidence_end=fact["line"], evidence_hash=fact.get("evidence_hash", ""),
            evidence_text=fact.get("text", "")[:200], source_id=self.source_id,
        )
        self.edges[rel_id] = (fact, list(targets), verified, self.relations[rel_id])

    def replay(self, was: _FileCalls) -> None:
        """A file's edges as its last resolution added them (_FileCalls.attempts)."""
        if was.added is not None and self.relations.keys().isdisjoint(was.added[1]):
            # every edge was its own last time, and no file before it has one of them now
            for table, part in zip((self.ids, self.relations, self.edges), was.added):
                table.update(part)
            return
        own: tuple[dict, dict, dict] | None = ({}, {}, {})
        for rel_id, ends, args in was.attempts:
            self.ids[ends] = rel_id
            if own is not None:
                own[0][ends] = rel_id
            if rel_id in self.relations:
                if own is not None and rel_id not in own[1]:
                    own = None  # an edge of a file before it
                continue
            edge = self.last.get(rel_id)
            if edge is not None and edge[0] is args[4]:
                self.relations[rel_id] = edge[3]
                self.edges[rel_id] = edge
                if own is not None:
                    own[1][rel_id], own[2][rel_id] = edge[3], edge
            else:  # another file's fact made it last time
                own = None
                self.add(*args)
        was.added = own

    def replayed(self, last_of: dict[int, _FileCalls], pf: ParsedFile) -> _FileCalls | None:
        """The file's _FileCalls of the last resolution, its edges added again as they were, where
        it is the same file and read no entry that changed since; else None (nothing added)."""
        was = last_of.get(id(pf))
        if was is None or was.parsed is not pf or not self.changed.isdisjoint(was.tokens):
            return None
        self.replay(was)
        return was


def _add_bases(parsed: list[ParsedFile], graph: _Edges) -> None:
    """The INHERITS edges, before the calls: `self.m()` may resolve to an inherited method."""
    resolver = graph.resolver
    resolver.in_bases_pass = True
    for pf in parsed:
        for fact in pf.bases:
            targets = [t for t in resolver.resolve(fact["base_expr"], fact, in_class=False)[0]
                       if resolver.by_qn[t].label == "Class" and t != fact["class_qn"]]
            if fact["class_id"] in resolver.by_id and targets:
                if len(targets) == 1:  # only a certain base may pin inherited methods
                    resolver.class_bases[fact["class_qn"]].append(targets[0])
                    resolver.bases_appended.append((fact["class_qn"], targets[0]))
                graph.add("INHERITS", fact["class_id"], targets, len(targets) == 1, fact)
    resolver.in_bases_pass = False


def _add_calls(parsed: list[ParsedFile], graph: _Edges, earlier: dict, last_files: dict[int, _FileCalls],
               reuse: bool) -> tuple[dict, int, dict[int, _FileCalls]]:
    """The CALLS edges: (each distinct call's result, how many were reused, each file's calls).
    A call resolves from its expression and where it stands, nothing else, and the resolver's
    tables no longer change in this pass: a quarter of django's 28.7k calls repeat one (`len(x)`,
    `self.check()` in one class), and each resolves once. `earlier`: the last resolution's
    results, each kept where none of the entries it read changed."""
    resolver, changed = graph.resolver, graph.changed
    resolved: dict[tuple, tuple[list[str], bool, frozenset]] = {}
    reused = 0
    directories: dict[str, str] = {}
    files: dict[int, _FileCalls] = {}
    for pf in parsed:
        if not pf.calls:
            continue
        was = graph.replayed(last_files, pf)
        if was is not None:  # an unchanged file none of whose calls read a changed entry
            size = len(resolved)
            resolved.update(was.resolved)
            reused += len(resolved) - size
            files[id(pf)] = was
            continue
        mine: dict = {}
        attempts: list = []
        for fact in pf.calls:
            path = fact["file_path"]
            directory = directories.get(path)
            if directory is None:
                directory = directories[path] = posixpath.dirname(path)
            key = (fact["callee_expr"], fact["language"], fact["module_qn"], fact.get("class_qn", ""),
                   fact.get("class_name", ""), directory)
            found = resolved.get(key)
            if found is None:
                found = earlier.get(key)
                if found is None or not changed.isdisjoint(found[2]):
                    found = resolver.recorded(fact["callee_expr"], fact)
                else:
                    reused += 1
                resolved[key] = found
            mine[key] = found
            graph.add("CALLS", fact["caller_id"], found[0], found[1], fact, attempts)
        if reuse:
            tokens = {("qn", found[0][0]) for found in mine.values() if found[0]}  # add's by_qn lookup
            for found in mine.values():
                tokens.update(found[2])
            files[id(pf)] = _FileCalls(pf, frozenset(tokens), mine, attempts)
    return resolved, reused, files


def _add_imports(parsed: list[ParsedFile], graph: _Edges, last_imports: dict[int, _FileCalls],
                 reuse: bool) -> dict[int, _FileCalls]:
    """The IMPORTS edges, after the calls: a Go import points at the package files actually used.
    With `reuse`, an unchanged file whose imports read no changed entry adds its edges as they
    were (docs/performance.md#stages: what a watch batch saves)."""
    resolver = graph.resolver
    file_imports: dict[int, _FileCalls] = {}
    for pf in parsed:
        if not pf.imports:
            continue
        was = graph.replayed(last_imports, pf)
        if was is not None:
            file_imports[id(pf)] = was
            continue
        attempts: list | None = [] if reuse else None
        if reuse:
            resolver._reads.append(set())
        try:
            for fact in pf.imports:
                for target in resolver.import_targets(fact):
                    graph.add("IMPORTS", fact["module_id"], [target], True, fact, attempts)
        finally:
            tokens = resolver._reads.pop() if reuse else None
        if reuse:
            tokens.update(("qn", args[2][0]) for _rel_id, _ends, args in attempts)  # add's by_qn lookup
            file_imports[id(pf)] = _FileCalls(pf, frozenset(tokens), {}, attempts)
    return file_imports


def _add_endpoints(source_id: str, parsed: list[ParsedFile], graph: _Edges) -> dict[str, GraphNode]:
    """Every file's nodes (the first of an id, as by_id) with the source's Endpoint nodes and their
    ROUTES_TO edges."""
    resolver = graph.resolver
    nodes: dict[str, GraphNode] = dict(resolver.by_id)
    for endpoint in compose_endpoints([f for pf in parsed for f in pf.routes], resolver.aliases):
        targets, verified = resolver.handler(endpoint)
        node_id = endpoint_node_id(source_id, endpoint["name"])
        nodes.setdefault(node_id, GraphNode(
            node_id=node_id, label="Endpoint", name=endpoint["name"], qualified_name=endpoint["name"],
            source_id=source_id, file_path=endpoint["file_path"], start_line=endpoint["line"],
            end_line=endpoint["line"], chunk_id=resolver.by_qn[targets[0]].chunk_id if targets else "",
            content_hash=endpoint.get("evidence_hash", "")))
        graph.add("ROUTES_TO", node_id, targets, verified, endpoint)
    return nodes


def endpoint_node_id(source_id: str, name: str) -> str:
    """The id of a source's Endpoint node `METHOD /path` (one per name, whichever app serves it)."""
    return f"{source_id}:endpoint:{name}"


def _entry(node: GraphNode | None) -> tuple[str, str] | None:
    """What a by_qn entry resolves to: the node's id and label."""
    return None if node is None else (node.node_id, node.label)


class _Resolver:
    def __init__(self, parsed: list[ParsedFile], record: bool = False,
                 memo: dict[int, _FileTables] | None = None):
        """`memo`: the files' tables of this source's last resolver (by the ParsedFile's id), where
        this process resolves the source again: the tables are merged from the files' parts and
        `self.file_tables` holds them for the next one; None builds them file by file, node by node."""
        self.parsed = parsed  # kept: a later resolver tells the files it shares with this one by identity
        self.by_id: dict[str, GraphNode] = {}
        self.by_qn: dict[str, GraphNode] = {}       # first occurrence wins for repeated names
        self.language: dict[str, str] = {}          # module qn -> language
        self.package: dict[tuple[str, str], list[str]] = defaultdict(list)  # (dir, lang) -> modules
        self.members: dict[str, dict[str, str]] = defaultdict(dict)  # container qn -> name -> qn
        self.aliases: dict[str, dict[str, str]] = defaultdict(dict)  # module -> local -> bound
        self.stars: dict[str, list[str]] = defaultdict(list)
        self.class_bases: dict[str, list[str]] = defaultdict(list)
        self.methods_by_name: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.file_tables: dict[int, _FileTables] | None = None
        if memo is not None:
            self.file_tables = {id(pf): was if (was := memo.get(id(pf))) is not None and was.parsed is pf
                                else _file_tables(pf) for pf in parsed}
        self.tables_merged = self.file_tables is not None and self._merge([self.file_tables[id(pf)] for pf in parsed])
        if not self.tables_merged:
            self._add_files(parsed)
        self._init_state(record)

    def _add_files(self, parsed: list[ParsedFile]) -> None:
        """The symbol tables, file by file in order (the reference _merge makes the same tables as)."""
        for pf in parsed:
            _add_file(self, pf)

    def _merge(self, parts: list[_FileTables]) -> bool:
        """The symbol tables from the files' parts, as _add_files makes them; False (nothing kept)
        where a node id is in two files or a DEFINES relation ends in another file's node (which
        node a relation reads then depends on the files before it: _add_files decides)."""
        if any(p.foreign_defines for p in parts):
            return False
        by_id, repeated = _first_wins([p.by_id for p in parts])
        if repeated:
            return False
        self.by_id = by_id
        self.by_qn = _first_wins([p.by_qn for p in parts])[0]
        # a name's methods so far as a set, made where a second file has the name: a scan of the
        # list per file was quadratic in the files that define a method of a name (`__init__`)
        known_sets: dict[tuple[str, str], set[str]] = {}
        for p in parts:
            self.language.update(p.language)
            for key, modules in p.package.items():
                self.package[key].extend(modules)
            for key, qns in p.methods_by_name.items():
                known = self.methods_by_name[key]
                if not known:
                    known.extend(qns)
                    continue
                seen = known_sets.get(key)
                if seen is None:
                    seen = known_sets[key] = set(known)
                fresh = [q for q in qns if q not in seen]
                known.extend(fresh)
                seen.update(fresh)
            for table, part in ((self.members, p.members), (self.aliases, p.aliases)):
                for key, entries in part.items():
                    into = table.get(key)
                    if into is None:
                        table[key] = dict(entries)
                    else:
                        for name, value in entries.items():
                            into.setdefault(name, value)
            for module, bound in p.stars.items():
                self.stars[module].extend(bound)
        return True

    def _init_state(self, record: bool) -> None:
        self.go_used: dict[tuple[str, str], set[str]] = defaultdict(set)  # (module, alias)
        # What a resolution read (`recorded`): a stack of token sets, one per resolution or canon
        # name being worked out; a canon name's tokens are memoized with its answer.
        self.record = record
        self._reads: list[set] = []
        self.order_dependent = False  # an import cycle or the hop bound cut a name
        self.in_bases_pass = False    # class_bases is still being filled
        self.bases_appended: list[tuple[str, str]] = []
        self._canon_tokens: dict[str, frozenset] = {}
        self._canon_memo: dict[str, list[str]] = {}
        self._canon_active: set[str] = set()
        self._canon_hops = 0
        self._go_memo: dict[str, list[str]] = {}
        self._suffix_memo: dict[tuple[str, str], list[str]] = {}
        self._qn_memo: dict[str, tuple[str, str]] | None = None
        self.module_index = {qn[: -len(".index")]: qn for qn in self.language
                             if qn.endswith(".index") and self.language[qn] in _JS}

    # -- what a resolution read --------------------------------------------------------
    # A token names one entry of a table: ("qn", name), ("mem", container), ("ali", module),
    # ("star", module), ("bases", class), ("meth", language, name), ("pkg", dir, language),
    # ("mi", prefix); ("all",) a scan of a whole table (Java/Rust suffixes, Go packages);
    # ("bpass",) class_bases read while the bases pass still fills it.
    def _read(self, *token) -> None:
        if self._reads:
            self._reads[-1].add(token)

    def recorded(self, expr: str, fact: dict) -> tuple[list[str], bool, frozenset]:
        """A call's resolution and, where this resolver records, the tokens of every table entry
        it read."""
        if not self.record:
            return (*self.resolve(expr, fact, in_class=True), frozenset())
        self._reads.append(set())
        try:
            targets, verified = self.resolve(expr, fact, in_class=True)
        finally:
            tokens = frozenset(self._reads.pop())
        return targets, verified, tokens

    def changed_since(self, old: "_Resolver") -> frozenset | None:
        """The tokens whose entries differ between `old`'s tables and these (complete: every entry a
        resolution reads is named by one); None where `old` cannot be compared (Go: its imports
        take what the calls used)."""
        if "go" in self.language.values() or "go" in old.language.values():
            return None
        changed: set = set()
        def differ(kind: str, a: dict, b: dict) -> None:  # a tuple key is the token's tail
            changed.update((kind, *k) if type(k) is tuple else (kind, k)
                           for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        changed.update(self._qn_changed(old))
        differ("mem", self.members, old.members)
        differ("ali", self.aliases, old.aliases)
        differ("star", self.stars, old.stars)
        differ("bases", self.class_bases, old.class_bases)
        differ("mi", self.module_index, old.module_index)
        differ("meth", self.methods_by_name, old.methods_by_name)
        differ("pkg", self.package, old.package)
        if self.bases_appended != old.bases_appended:
            changed.add(("bpass",))
        if changed or self.language != old.language:
            changed.add(("all",))
        return frozenset(changed)

    def _qn_changed(self, old: "_Resolver") -> set[tuple[str, str]]:
        """The ("qn", name) tokens whose by_qn entry (node id, label) differs from `old`'s. by_qn
        keeps a name's first node in file order, so where the files both resolvers read (the same
        ParsedFile objects: not parsed again) stand in the same order, only a name that a file of
        one side alone defines can differ: a watch batch on django looks at the edited file's
        names, not at ~50k entries (~40 ms a batch). Any other order compares every entry."""
        mine, theirs = {id(pf) for pf in self.parsed}, {id(pf) for pf in old.parsed}
        if [id(pf) for pf in self.parsed if id(pf) in theirs] != [id(pf) for pf in old.parsed if id(pf) in mine]:
            return {("qn", qn) for qn, _ in self._qn_entries().items() ^ old._qn_entries().items()}
        names = {n.qualified_name for files, other in ((self.parsed, theirs), (old.parsed, mine))
                 for pf in files if id(pf) not in other for n in pf.nodes if n.label in _SYMBOL_LABELS}
        return {("qn", qn) for qn in names if _entry(self.by_qn.get(qn)) != _entry(old.by_qn.get(qn))}

    def _qn_entries(self) -> dict[str, tuple[str, str]]:
        """by_qn as {qn: (node id, label)} (_qn_changed's fallback), made once per resolver."""
        if self._qn_memo is None:
            self._qn_memo = {qn: _entry(n) for qn, n in self.by_qn.items()}
        return self._qn_memo

    # -- lookups -------------------------------------------------------------------------
    def mro(self, class_qn: str) -> list[str]:
        order, stack = [], [class_qn]
        while stack:
            current = stack.pop()
            if current not in order:
                order.append(current)
                self._read("bases", current)
                stack.extend(reversed(self.class_bases.get(current, [])))
        if self.in_bases_pass:
            self._read("bpass")
        return order

    def member(self, class_qn: str, attr: str) -> list[str]:
        """`attr` on a class or the first in-source base that defines it."""
        for cls in self.mro(class_qn):
            qn = f"{cls}.{attr}"
            self._read("qn", qn)
            if qn in self.by_qn:
                return [qn]
        return []

    def canon(self, qn: str) -> list[str]:
        """An absolute dotted name -> the in-source symbol it denotes, following re-exports
        (`pkg/__init__.py: from .core import X`), star imports and inherited members.
        Every name is worked out once (memo), and one lookup follows at most _MAX_HOPS names:
        star imports re-export each other in big packages, and an alias such as
        `from pkg.x import x` can grow a name at each hop. A name already being followed
        answers [] (an import cycle)."""
        self._read("qn", qn)
        if qn in self.by_qn:
            return [qn]
        if qn in self._canon_memo:
            if self._reads:
                self._reads[-1].update(self._canon_tokens[qn])
            return self._canon_memo[qn]
        if not self._canon_active:
            self._canon_hops = 0
        self._canon_hops += 1
        if qn in self._canon_active or self._canon_hops > _MAX_HOPS:
            self.order_dependent = True
            return []
        self._canon_active.add(qn)
        if self.record:
            self._reads.append(set())
        try:
            found = self._canon(qn)
        finally:
            self._canon_active.discard(qn)
            tokens = self._reads.pop() if self.record else ()
        self._canon_memo[qn] = found
        if self.record:
            self._canon_tokens[qn] = frozenset(tokens)
            if self._reads:
                self._reads[-1].update(tokens)
        return found

    def _canon(self, qn: str) -> list[str]:
        parts = qn.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix, head, rest = ".".join(parts[:cut]), parts[cut], parts[cut + 1:]
            self._read("mi", prefix)
            if prefix in self.module_index:  # JS `./util` meaning `./util/index`
                return self.canon(".".join([self.module_index[prefix], head, *rest]))
            self._read("qn", prefix)
            node = self.by_qn.get(prefix)
            if node is None:
                continue
            if node.label == "Class":
                return self.member(prefix, head) if not rest else []
            if node.label != "Module":
                return []
            self._read("ali", prefix)
            if head in self.aliases.get(prefix, {}):
                return self.canon(".".join([self.aliases[prefix][head], *rest]))
            self._read("star", prefix)
            for star in self.stars.get(prefix, []):
                self._read("qn", star)
                if star not in self.by_qn:   # an external module re-exports nothing of ours
                    continue
                found = self.canon(".".join([star, head, *rest]))
                if found:
                    return found
            return []
        return []

    def suffix(self, dotted: str, language: str) -> list[str]:
        """Java/Rust imports name packages, not files: match a dotted tail of a qualified name.
        `com.shop.Tax` -> module `src.main.java.com.shop.Tax` -> its class `...Tax.Tax`."""
        key = (dotted, language)
        self._read("all")
        if key not in self._suffix_memo:
            self._suffix_memo[key] = self._suffix(dotted, language)
        return self._suffix_memo[key]

    def _suffix(self, dotted: str, language: str) -> list[str]:
        parts = dotted.split(".")
        while parts and parts[0] in ("crate", "self", "super"):
            parts = parts[1:]
        if not parts:
            return []
        tail = ".".join(parts)
        found = []
        for qn, node in self.by_qn.items():
            if (qn == tail or qn.endswith("." + tail)) and self.language_of(qn) == language:
                same_named = f"{qn}.{parts[-1]}"
                found.append(same_named if node.label == "Module" and same_named in self.by_qn else qn)
        return sorted(set(found))

    def module_of(self, qn: str) -> str:
        """The module a qualified name lives in."""
        self._read("all")
        while qn and qn not in self.language:
            qn = qn.rpartition(".")[0]
        return qn

    def language_of(self, qn: str) -> str:
        return self.language.get(self.module_of(qn), "")

    def go_package(self, import_path: str) -> list[str]:
        """Modules of the in-source directory an import path ends with (longest match)."""
        self._read("all")
        if import_path not in self._go_memo:
            self._go_memo[import_path] = self._go_package(import_path)
        return self._go_memo[import_path]

    def _go_package(self, import_path: str) -> list[str]:
        best = None
        for directory, language in self.package:
            if language == "go" and directory and (
                    import_path == directory or import_path.endswith("/" + directory)):
                if best is None or len(directory) > len(best):
                    best = directory
        return self.package.get((best, "go"), []) if best is not None else []

    # -- facts ---------------------------------------------------------------------------
    def handler(self, endpoint: dict) -> tuple[list[str], bool]:
        """The code entity a route's handler names, and whether it is certain: the decorated
        definition itself (INFERRED when it is nested in a function: its enclosing function's node
        holds it), else the view expression resolved as a call is (`views.login`, `LoginView`)."""
        if endpoint["handler_def"]:
            qn = f"{endpoint['module_qn']}.{endpoint['handler']}" if endpoint["module_qn"] else endpoint["handler"]
            return ([qn], not endpoint["nested"]) if qn in self.by_qn else ([], False)
        targets, verified = self.resolve(endpoint["handler"], endpoint, in_class=False)
        kept = [t for t in targets if self.by_qn[t].label in _HANDLER_LABELS]
        return kept, verified and len(kept) == len(targets)

    def import_targets(self, fact: dict) -> list[str]:
        language, imported = fact["language"], fact["imported"]
        if language == "go":
            used = self.go_used.get((fact["module_qn"], fact["alias"]))
            return sorted(used) if used else self.go_package(imported)[:20]
        if language in ("java", "rust"):
            found = self.suffix(imported, language)
            return found if len(found) == 1 else []
        found = self.canon(imported) or (self.canon(fact["from_module"]) if fact["from_module"] else [])
        if not found and language in _JS:
            self._read("mi", imported)
        if not found and language in _JS and imported in self.module_index:
            found = [self.module_index[imported]]
        return [t for t in found if t != fact["module_qn"]
                and self.by_qn[t].label in ("Module", "Class", "Function")]

    def resolve(self, expr: str, fact: dict, in_class: bool) -> tuple[list[str], bool]:
        """Candidates for a callee or base expression, and whether scope rules pinned them."""
        found = self._scoped(expr, fact, in_class)
        if found:
            return sorted(set(found)), len(set(found)) == 1
        head, *rest = expr.split(".")
        if head in ("self", "cls", "super", "super()") and len(rest) == 1:
            return [], False  # not on the class nor its known bases: a dynamic attribute
        return self._by_method_name(expr, fact), False

    def _scoped(self, expr: str, fact: dict, in_class: bool) -> list[str]:
        language, module = fact["language"], fact["module_qn"]
        class_qn, class_name = fact.get("class_qn", ""), fact.get("class_name", "")
        head, *rest = expr.split(".")
        if head in ("self", "cls") and in_class and len(rest) == 1:
            if head == "cls" and language != "python":
                return []
            if class_qn:
                found = self.member(class_qn, rest[0])
                if found:
                    return found
            return self._receiver_method(class_name, rest[0], fact)
        if head in ("super", "super()") and in_class and len(rest) == 1 and class_qn:
            self._read("bases", class_qn)
            for base in self.class_bases.get(class_qn, []):
                found = self.member(base, rest[0])
                if found:
                    return found
            return []
        if head in ("self", "cls", "super", "super()"):
            return []
        if language == "java" and in_class and class_qn and not rest:
            found = self.member(class_qn, head)  # Java: a bare call is `this.` or static
            if found:
                return found
        self._read("mem", module)
        if head in self.members.get(module, {}):
            return self.canon(f"{module}.{expr}")
        self._read("ali", module)
        if head in self.aliases.get(module, {}):
            bound = self.aliases[module][head]
            if language == "go":
                found = [qn for m in self.go_package(bound) if rest
                         for qn in self.canon(f"{m}.{'.'.join(rest)}")]
                self.go_used[(module, head)].update(self.module_of(qn) for qn in found)
                return found
            if language in ("java", "rust"):
                return [qn for base in self.suffix(bound, language)
                        for qn in (self.canon(".".join([base, *rest])) if rest else [base])]
            return self.canon(".".join([bound, *rest]))
        if language == "rust" and head == "crate":
            return self.suffix(expr, language)
        if language == "python":
            found = self.canon(expr)
            if found:
                return found
        self._read("star", module)
        for star in self.stars.get(module, []):
            found = self.canon(f"{star}.{expr}") if language not in ("java", "rust") else \
                [qn for base in self.suffix(star, language) for qn in self.canon(f"{base}.{expr}")]
            if found:
                return found
        if language in ("go", "java"):  # same package = same directory, no import needed
            directory = posixpath.dirname(fact["file_path"])
            self._read("all")
            return [qn for m in self.package.get((directory, language), [])
                    if m != module and head in self.members.get(m, {})
                    for qn in self.canon(f"{m}.{expr}")]
        return []

    def _receiver_method(self, class_name: str, attr: str, fact: dict) -> list[str]:
        """Go/Rust methods whose type is declared in another file: `module.Type.attr` in the
        same package (Go) or file (Rust)."""
        if not class_name:
            return []
        self._read("all")
        if fact["language"] == "go":
            modules = self.package.get((posixpath.dirname(fact["file_path"]), "go"), [])
        else:
            modules = [fact["module_qn"]]
        return [f"{m}.{class_name}.{attr}" for m in modules if f"{m}.{class_name}.{attr}" in self.by_qn]

    def _by_method_name(self, expr: str, fact: dict) -> list[str]:
        """`obj.save()` on a receiver we cannot type: every in-source method named `save`,
        only when few enough to be informative. Never for imported or builtin heads."""
        head, _, attr = expr.partition(".")
        if not attr:
            return []
        attr = attr.rsplit(".", 1)[-1]
        module, language = fact["module_qn"], fact["language"]
        for token in (("ali", module), ("mem", module), ("qn", head), ("meth", language, attr)):
            self._read(*token)
        if head in self.aliases.get(module, {}) or head in self.members.get(module, {}) or \
                (language == "python" and head in _PY_BUILTINS) or head in self.by_qn:
            return []
        found = self.methods_by_name.get((language, attr), [])
        return sorted(found) if 0 < len(found) <= _MAX_NAME_CANDIDATES else []
