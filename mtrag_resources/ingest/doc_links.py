"""Resolve the references docs make (roles, autodoc directives, code spans) against the symbols of
every code source: exact qualified names, re-exports (`from .core import Group` or
`from .core import *` in a package's `__init__`), the `currentmodule` context, members inherited
through INHERITS, then dotted suffixes (a member by its class's suffix through the class's bases
too). One candidate is VERIFIED; several stay INFERRED with their candidates. A file path an
issue names (`ref_kind` "file") resolves to the File nodes of code sources with that path, or whose
path ends with it (`stores/fts_store.py`, `fts_store.py`)."""
from __future__ import annotations

import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress, groupby, repeat
from operator import attrgetter, is_, ne, not_

from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation, stable_id

CODE_LABELS = {"Module", "Class", "Function", "Method"}
INDEXED_LABELS = CODE_LABELS | {"File"}  # the nodes a SymbolIndex keeps (add_nodes)
EVIDENCE_TEXT_CHARS = 200  # of a reference's text, a link's evidence_text
# The code a role names where it names one kind (Sphinx's object types of the role): a suffix guess
# keeps to it, so `:mod:`readline`` is not some class's `readline` method. Other roles name any.
ROLE_LABELS = {"mod": ("Module",), "automodule": ("Module",), "class": ("Class",), "exc": ("Class",), "func": ("Function", "Method"),
               "meth": ("Method", "Function"), "deco": ("Function", "Method")}
# Roles whose target is a full name, never relative to the current module nor guessed (Sphinx:
# `:mod:`logging`` under `currentmodule:: flask` is the standard library's, not flask.logging).
EXACT_ROLES = {"mod", "automodule"}
# Roles and directives that name a class's member: a bare name under them may be a method.
MEMBER_ROLES = {"meth", "attr", "automethod", "autoattribute", "autoproperty", "method"}
IMPLEMENTS_ROLES = {"autofunction", "autoclass", "automethod", "automodule", "autoexception",
                    "autodata", "autoattribute", "autodecorator", "function", "class", "method"}


def _node_entries(n: GraphNode) -> tuple[tuple[str, str], ...]:
    """The (table, key) entries that hold `n` in a SymbolIndex (add_nodes)."""
    if n.label in CODE_LABELS:
        return ("by_qn", n.qualified_name), ("by_short", n.name)
    if n.label == "File":
        return ("files", n.qualified_name), ("file_names", posixpath.basename(n.qualified_name))
    return ()


@dataclass
class SymbolIndex:
    by_qn: dict[str, list[GraphNode]] = field(default_factory=lambda: defaultdict(list))
    by_short: dict[str, list[GraphNode]] = field(default_factory=lambda: defaultdict(list))
    exports: dict[str, str] = field(default_factory=dict)            # "pkg.Name" -> "pkg.mod.Name"
    stars: dict[str, list[str]] = field(default_factory=dict)        # "pkg" -> modules it star-imports
    bases: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # class qn -> base qns
    files: dict[str, list[GraphNode]] = field(default_factory=lambda: defaultdict(list))  # file path -> File nodes
    file_names: dict[str, list[GraphNode]] = field(default_factory=lambda: defaultdict(list))  # basename -> File nodes
    # While a resolution is recorded (resolve_links' `reads`): the entries it read, as tokens
    # (table, key); an entry read absent counts too. changed_reads gives the tokens two indexes
    # answer differently, so a resolution whose tokens meet none of them holds on the new index.
    reads: list | None = field(default=None, repr=False, compare=False)

    def add_nodes(self, nodes: list[GraphNode]) -> None:
        by_qn, by_short, files, file_names = self.by_qn, self.by_short, self.files, self.file_names  # one lookup each
        for n in nodes:
            label = n.label
            if label in CODE_LABELS:
                by_qn[n.qualified_name].append(n)
                by_short[n.name].append(n)
            elif label == "File":
                files[n.qualified_name].append(n)
                file_names[posixpath.basename(n.qualified_name)].append(n)

    def with_nodes_changed(self, gone: list[GraphNode], fresh: list[GraphNode],
                           order) -> tuple["SymbolIndex", set[tuple[str, str]]]:
        """A copy of this index whose node tables lose the nodes `gone` and gain `fresh`, each entry
        they touch in `order`'s order (a node -> where it stands among every source's nodes), as
        add_nodes of the new node lists makes it; its other tables are this one's (the caller sets
        them). And the tokens (table, key) whose entries changed, compared by value as changed_reads
        compares them. This index is left as it was: a resolution may still read it. A watch batch
        that appended a function to django rebuilt the index from its 12k nodes and compared every
        entry of both (~50 ms of the GIL)."""
        new = SymbolIndex(by_qn=defaultdict(list, self.by_qn), by_short=defaultdict(list, self.by_short),
                          exports=self.exports, stars=self.stars, bases=self.bases, files=defaultdict(list, self.files),
                          file_names=defaultdict(list, self.file_names))
        gone_ids = set(map(id, gone))
        added: dict[tuple[str, str], list[GraphNode]] = {}
        touched = dict.fromkeys(t for n in gone for t in _node_entries(n))
        for n in fresh:
            for t in _node_entries(n):
                added.setdefault(t, []).append(n)
                touched[t] = None
        changed = set()
        for table, key in touched:
            entries = getattr(new, table)
            was = getattr(self, table).get(key) or []
            now = [n for n in was if id(n) not in gone_ids] + added.get((table, key), [])
            if len(now) > 1:
                now.sort(key=order)
            if now:
                entries[key] = now
            else:
                entries.pop(key, None)
            if (was or None) != (now or None):
                changed.add((table, key))
        return new, changed

    def file(self, path: str) -> list[GraphNode]:
        """File nodes whose path is `path`, else those whose path ends with `/path`."""
        path = path.strip().lstrip("/").removeprefix("./")
        if not path:
            return []
        if self.reads is not None:
            self.reads += [("files", path), ("file_names", posixpath.basename(path))]
        if path in self.files:
            return self.files[path]
        return [n for n in self.file_names.get(posixpath.basename(path), []) if n.qualified_name.endswith("/" + path)]

    def add_relations(self, nodes_by_id: dict[str, GraphNode], relations: list[GraphRelation]) -> None:
        for r in relations:
            if r.rel_type == "INHERITS" and r.src_id in nodes_by_id and r.dst_id in nodes_by_id:
                self.bases[nodes_by_id[r.src_id].qualified_name].append(nodes_by_id[r.dst_id].qualified_name)

    def add_imports(self, imports: list[dict]) -> None:
        """Re-exports: `from .core import Group` in module `click` makes `click.Group` a name, and
        `from .core import *` every name of `click.core` one of `click`."""
        for imp in imports:
            module = imp.get("module_qn") or ""
            target = imp.get("imported") or ""
            if not module or not target:
                continue
            if imp.get("kind") == "star":
                self.stars.setdefault(module, []).append(target)
                continue
            local = imp.get("alias") or target.rsplit(".", 1)[-1]
            if imp.get("kind") == "import" and target.split(".", 1)[0] == local:
                target = local  # `import a.b` binds `a`
            self.exports.setdefault(f"{module}.{local}", target)

    def lookup(self, qn: str, depth: int = 0) -> list[GraphNode]:
        if self.reads is not None:
            self.reads += [("by_qn", qn), ("exports", qn)]
        if qn in self.by_qn:
            return self.by_qn[qn]
        if depth < 4 and qn in self.exports and self.exports[qn] != qn:
            return self.lookup(self.exports[qn], depth + 1)
        head, _, tail = qn.rpartition(".")
        if head and depth < 4:
            if self.reads is not None:
                self.reads.append(("stars", head))
            for module in self.stars.get(head, ()):
                found = self.lookup(f"{module}.{tail}", depth + 1) if module != head else []
                if found:
                    return found
            # A re-exported prefix: click.Group.command -> click.core.Group.command
            for owner in self.lookup(head, depth + 1):
                if self.reads is not None:
                    self.reads.append(("by_qn", f"{owner.qualified_name}.{tail}"))
                found = self.by_qn.get(f"{owner.qualified_name}.{tail}")
                if found:
                    return found
                inherited = self._inherited(owner.qualified_name, tail)
                if inherited:
                    return inherited
        return []

    def _inherited(self, class_qn: str, member: str, seen: set | None = None) -> list[GraphNode]:
        seen = seen or set()
        if self.reads is not None:
            self.reads.append(("bases", class_qn))
        for base in self.bases.get(class_qn, []):
            if base in seen:
                continue
            seen.add(base)
            if self.reads is not None:
                self.reads.append(("by_qn", f"{base}.{member}"))
            found = self.by_qn.get(f"{base}.{member}") or self._inherited(base, member, seen)
            if found:
                return found
        return []

    def suffix(self, dotted: str) -> list[GraphNode]:
        last = dotted.rsplit(".", 1)[-1]
        if self.reads is not None:
            self.reads.append(("by_short", last))
        return [n for n in self.by_short.get(last, [])
                if n.qualified_name == dotted or n.qualified_name.endswith("." + dotted)]

    def inherited_suffix(self, dotted: str) -> list[GraphNode]:
        """A member named through a class that only inherits it (`Flask.after_request`, defined on
        a base class): the classes whose names end with the owner part, each member found on the
        class or its bases."""
        owner, _, member = dotted.rpartition(".")
        found = []
        for cls in self.suffix(owner) if owner else []:
            if cls.label == "Class":
                found += self._inherited(cls.qualified_name, member)
        return found


_READ_TABLES = ("by_qn", "by_short", "exports", "stars", "bases", "files", "file_names")


def changed_reads(old: SymbolIndex, new: SymbolIndex) -> set[tuple[str, str]]:
    """The tokens (table, key) whose entries differ between two indexes, a key one has and the
    other not included (an empty entry counts as none). Nodes compare by value, so an unchanged
    source's nodes read again compare equal."""
    changed = set()
    for table in _READ_TABLES:
        changed |= table_changes(table, getattr(old, table), getattr(new, table))
    return changed


def table_changes(table: str, a: dict, b: dict) -> set[tuple[str, str]]:
    """changed_reads of one table: the tokens of the keys whose entries differ in `a` and `b`."""
    if a is b:
        return set()
    changed = {(table, k) for k in a.keys() ^ b.keys() if (a.get(k) or None) != (b.get(k) or None)}
    # keys of both, compared in C (an unchanged entry holds the same node objects: equal at once)
    both = list(a.keys() & b.keys())
    changed.update(zip(repeat(table), compress(both, map(ne, map(a.__getitem__, both), map(b.__getitem__, both)))))
    return changed


def kept_resolutions(old: SymbolIndex, new: SymbolIndex, resolved: dict, reads: dict,
                     changed: set | None = None) -> tuple[dict, dict]:
    """The resolutions made on `old` (and their read tokens) that hold on `new`: those whose tokens
    name no entry that changed (`changed`: those tokens where the caller knows them, else
    changed_reads of the two indexes)."""
    changed = changed_reads(old, new) if changed is None else changed
    if resolved.keys() == reads.keys():  # the keys compared in C
        # the few resolutions that read a changed entry, found in C (a step per key of django's 22k
        # was ~12 ms of each watch batch), go; the rest is copied whole
        dropped = list(compress(reads.keys(), map(not_, map(changed.isdisjoint, reads.values())))) if changed else []
        kept_resolved, kept_reads = dict(resolved), dict(reads)
        for key in dropped:
            del kept_resolved[key], kept_reads[key]
        return kept_resolved, kept_reads
    kept = [key for key, tokens in reads.items() if tokens.isdisjoint(changed)]  # no set made per key
    return {key: resolved[key] for key in kept}, {key: reads[key] for key in kept}


def clean_target(target: str) -> str:
    t = target.strip().lstrip("~").lstrip(".").removesuffix("()")
    return t.strip("`")


def resolve_reference(index: SymbolIndex, ref: DocReference) -> list[GraphNode]:
    if ref.ref_kind == "file":
        return _unique(index.file(ref.target))
    target = clean_target(ref.target)
    if not target or not all(part.isidentifier() for part in target.split(".")):
        return []
    if ref.role in EXACT_ROLES:
        return _unique(of_kind(index.lookup(target), ref.role, target))
    attempts = [target]
    if ref.module_context and not target.startswith(ref.module_context + "."):
        attempts.insert(0, f"{ref.module_context}.{target}")
    for qn in attempts:
        found = index.lookup(qn)
        if found:
            return _unique(found)
    # Plain code spans of a bare short name are too weak for a suffix guess over the whole index.
    if ref.ref_kind == "code_span" and "." not in target:
        if index.reads is not None:
            index.reads.append(("by_qn", target))
        return _unique(index.by_qn.get(target, []))
    return _unique(of_kind(index.suffix(target), ref.role, target)
                   or of_kind(index.inherited_suffix(target), ref.role, target))


def guess_labels(role: str, target: str) -> tuple[str, ...] | None:
    """The kinds of code a guess at a reference may name (None: any): its role's (ROLE_LABELS), and
    for a bare name its role does not make a member, module-level code only (a module's
    `:data:`session`` is not some class's `session` property)."""
    labels = ROLE_LABELS.get(role)
    if "." in target or role in MEMBER_ROLES:
        return labels
    return tuple(label for label in labels or ("Module", "Class", "Function") if label != "Method")


def of_kind(nodes: list[GraphNode], role: str, target: str) -> list[GraphNode]:
    """The nodes a guess at the reference `target` under `role` may name (guess_labels)."""
    labels = guess_labels(role, target)
    return nodes if labels is None else [n for n in nodes if n.label in labels]


def resolution_key(ref: DocReference) -> tuple:
    """What a reference's resolution depends on besides the index: the memo key of resolve_links."""
    return ref.ref_kind, ref.role, ref.target, ref.module_context


def _unique(nodes: list[GraphNode]) -> list[GraphNode]:
    seen, out = set(), []
    for n in nodes:
        if n.node_id not in seen:
            seen.add(n.node_id)
            out.append(n)
    return sorted(out, key=lambda n: n.qualified_name)


def link_for(ref: DocReference, candidates: list[GraphNode], confidence_override: str | None = None,
             evidence_hash: str | None = None) -> GraphRelation:
    """`evidence_hash`: the referring chunk's content hash (its chunk id where not given)."""
    rel_type = "IMPLEMENTS" if ref.ref_kind == "directive" and ref.role in IMPLEMENTS_ROLES else "MENTIONS"
    src = f"chunk:{ref.chunk_id}"
    dst = candidates[0]
    confidence = confidence_override or ("VERIFIED" if len(candidates) == 1 else "INFERRED")
    return GraphRelation(
        rel_id=stable_id(rel_type, src, dst.node_id), rel_type=rel_type, src_id=src, dst_id=dst.node_id,
        confidence=confidence,
        candidates=[c.qualified_name for c in candidates] if len(candidates) > 1 else [],
        evidence_file=ref.file_path, evidence_start=ref.line, evidence_end=ref.line,
        evidence_hash=ref.chunk_id if evidence_hash is None else evidence_hash, evidence_text=ref.matched_text[:EVIDENCE_TEXT_CHARS], source_id=ref.source_id)


@dataclass
class _FileLinks:
    """What resolve_links made of one file's references, aligned with them: each one's resolution
    key, candidates (the list objects of `resolved`), evidence hash and link (None: unresolved)."""
    refs: list
    keys: tuple
    candidates: tuple
    evidence: tuple
    links: list
    unresolved: int


def resolve_links(index: SymbolIndex, references: list[DocReference], resolved: dict | None = None,
                  evidence: dict[str, str] | None = None, made: dict | None = None,
                  reads: dict | None = None) -> tuple[list[GraphRelation], int]:
    """Links (deduplicated by id, VERIFIED winning over INFERRED) and the count of unresolved refs.
    `resolved`: the resolutions already made on this very index (filled in as it goes).
    `evidence`: chunk id -> content hash, each link's evidence_hash (else its chunk id).
    `reads`: filled with each new resolution's read tokens by its key (SymbolIndex.reads).
    `made`: the caller's memo of what this made last, by file, replaced by this call's. A file whose
    references are the same objects (read_shared gives an unchanged table's very rows), whose
    resolutions are the same entries of `resolved` (kept across a new index) and whose chunks'
    hashes are the same keeps its links as they are, without a step per reference (django: ~31k
    references in ~650 files, ~0.1 s of every watch batch); in a file resolved again, a reference
    resolved to the same nodes with the same evidence keeps its link object, so no id is hashed
    again and the links table's merge finds it unchanged by identity."""
    links: dict[str, GraphRelation] = {}
    unresolved = 0
    resolved = {} if resolved is None else resolved  # docs name the same targets again and again
    evidence = evidence or {}
    last, now = (made or {}), {}
    for path, group in groupby(references, key=attrgetter("file_path")):
        refs = list(group)
        chunk_ids = tuple(map(attrgetter("chunk_id"), refs))
        hashes = tuple(map(evidence.get, chunk_ids, chunk_ids))
        run = (path, 0)  # a file's references are one run (its row group); where not, each run apart
        while run in now:
            run = (path, run[1] + 1)
        was = last.get(run)
        if not (was is not None and was.refs == refs and was.evidence == hashes
                and all(map(is_, map(resolved.get, was.keys), was.candidates))):
            was = _resolve_file(index, refs, hashes, resolved, reads, was)
        now[run] = was
        unresolved += was.unresolved
        for link in was.links:
            if link is not None:
                add_link(links, link)
    if made is not None:
        made.clear()
        made.update(now)
    return sorted(links.values(), key=attrgetter("rel_id")), unresolved


def add_link(links: dict[str, GraphRelation], link: GraphRelation) -> None:
    """`link` into `links` (by rel_id) unless a link of that id is there already; a VERIFIED one
    replaces an INFERRED one."""
    old = links.get(link.rel_id)
    if old is None or (old.confidence != "VERIFIED" and link.confidence == "VERIFIED"):
        links[link.rel_id] = link


def _resolve_file(index: SymbolIndex, refs: list[DocReference], hashes: tuple,
                  resolved: dict, reads: dict | None, was: _FileLinks | None) -> _FileLinks:
    """One file's references resolved (resolve_links): a reference the file's last links (`was`)
    resolved to the same nodes with the same evidence keeps its link object."""
    before = {id(r): (r, c, l) for r, c, l in zip(was.refs, was.candidates, was.links)} if was else {}
    keys, found, made = [], [], []
    unresolved = 0
    for ref, evidence_hash in zip(refs, hashes):
        key = resolution_key(ref)
        candidates = resolved.get(key)
        if candidates is None:
            if reads is None:
                candidates = resolved[key] = resolve_reference(index, ref)
            else:  # recorded: the next index keeps this resolution where these entries are the same
                index.reads = []
                try:
                    candidates = resolved[key] = resolve_reference(index, ref)
                    reads[key] = frozenset(index.reads)
                finally:
                    index.reads = None
        keys.append(key)
        found.append(candidates)
        if not candidates:
            unresolved += 1
            made.append(None)
            continue
        old = before.get(id(ref))
        if old is not None and old[0] is ref and old[2] is not None and _same_nodes(old[1], candidates) \
                and old[2].evidence_hash == evidence_hash:
            made.append(old[2])
        else:
            made.append(link_for(ref, candidates, evidence_hash=evidence_hash))
    return _FileLinks(refs=refs, keys=tuple(keys), candidates=tuple(found),
                      evidence=hashes, links=made, unresolved=unresolved)


def _same_nodes(a: list[GraphNode], b: list[GraphNode]) -> bool:
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))
