"""Code embedded with its context, declarations ranked below their implementations: one Dagster build
of a small package of this test's own (overload stubs, an abstract method and its implementation),
then queries through the reader against the real stores."""
from __future__ import annotations

import textwrap

import pytest

from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.stores.embedding_cache import EmbeddingCache
from mtrag_resources.stores.tables import read_rows
from tests.build_helpers import build, settings
from tests.conftest import use_fresh_home

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

TRANSPORT_PY = '''\
"""Transports that carry payloads to a peer."""
import abc


class Transport(abc.ABC):
    """Carries payloads to a peer."""

    @abc.abstractmethod
    def send(self, payload: bytes) -> bytes:
        """Send the payload over the wire to the peer and wait for the peer's reply."""


class HttpTransport(Transport):
    """A transport over HTTP."""

    def send(self, payload: bytes) -> bytes:
        response = self.session.post(self.url, data=payload)
        return response.content
'''

FETCH_PY = '''\
"""Downloads."""
import typing as t


@t.overload
def fetch(url: str, raw: t.Literal[True]) -> bytes: ...


@t.overload
def fetch(url: str, raw: t.Literal[False] = ...) -> str: ...


def fetch(url, raw=False):
    """Download a resource and decode it unless raw bytes are asked for."""
    data = _download(url)
    return data if raw else data.decode("utf-8")


def _download(url):
    return b""
'''


@pytest.fixture(scope="module")
def netkit(tmp_path_factory, neo4j_uri):
    root = tmp_path_factory.mktemp("netkit")
    pkg = root / "netkit" / "src" / "netkit"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Netkit: transports and downloads."""\n')
    (pkg / "transport.py").write_text(TRANSPORT_PY)
    (pkg / "fetch.py").write_text(FETCH_PY)
    sources = root / "sources.yaml"
    sources.write_text(textwrap.dedent("""\
        sources:
          - {id: netkit, kind: code, path: netkit, include: ["src/**/*.py"]}
        """))
    home = root / "home"
    with pytest.MonkeyPatch.context() as mp:
        use_fresh_home(mp, home, sources, neo4j_uri)
        build()
        reader = IndexReader(home=str(home), log_proposals=False)
        try:
            yield {"pkg": pkg, "reader": reader, "settings": settings(),
                   "rows": read_rows(SourceLayout(settings(), "netkit").chunks)}
        finally:
            reader.close()


def _symbols(result) -> list[str]:
    return [h["symbol"] for h in result["hits"]]


def test_overload_stubs_fold_into_the_implementation_that_ranks_first(netkit):
    rows = [r for r in netkit["rows"] if r["symbol"] == "netkit.fetch.fetch"]
    assert len(rows) == 1 and rows[0]["role"] == "child" and not rows[0]["declaration"]
    for query, mode in (("netkit.fetch.fetch", "hybrid"), ("download a resource and decode it", "hybrid"),
                        ("decode it unless raw bytes", "lexical"), ("fetch a url", "dense")):
        result = netkit["reader"].query(query, k=5, kind="code", mode=mode)
        top = result["hits"][0]
        assert top["symbol"] == "netkit.fetch.fetch", (query, mode, _symbols(result))
        assert "@t.overload" in top["text"] and 'data.decode("utf-8")' in top["text"]
        # no hit is a stub on its own
        assert not any(h["symbol"] == "netkit.fetch.fetch" and "_download" not in h["text"] for h in result["hits"])


def test_an_abstract_declaration_ranks_below_its_implementation(netkit):
    decl = next(r for r in netkit["rows"] if r["symbol"] == "netkit.transport.Transport.send")
    impl = next(r for r in netkit["rows"] if r["symbol"] == "netkit.transport.HttpTransport.send")
    assert decl["declaration"] and not impl["declaration"]
    # the declaration's own docstring: the channels prefer the declaration (lexical finds nothing
    # else), the answer shows the implementation right above it
    query = "send the payload over the wire to the peer and wait for the reply"
    assert _symbols(netkit["reader"].query(query, k=10, kind="code", mode="lexical"))[0] == \
        "netkit.transport.Transport.send"
    for mode in ("hybrid", "dense"):
        symbols = _symbols(netkit["reader"].query(query, k=10, kind="code", mode=mode))
        assert symbols.index("netkit.transport.HttpTransport.send") + 1 == \
            symbols.index("netkit.transport.Transport.send"), (mode, symbols)
    # named exactly, the declaration itself comes first in the exact channel (and its short name
    # gives the implementation first)
    named = _symbols(netkit["reader"].query("netkit.transport.Transport.send", k=5, kind="code", mode="exact"))
    assert named[:2] == ["netkit.transport.Transport.send", "netkit.transport.HttpTransport.send"]
    short = _symbols(netkit["reader"].query("send", k=5, kind="code", mode="exact"))
    assert short[:2] == ["netkit.transport.HttpTransport.send", "netkit.transport.Transport.send"]


def test_code_is_embedded_with_its_name_while_hits_show_the_source(netkit):
    s = netkit["settings"]
    cas, cache = ContentStore(s.cas_dir), EmbeddingCache(s.embeddings_dir)
    fingerprint_id = _fingerprint()
    impl = next(r for r in netkit["rows"] if r["symbol"] == "netkit.transport.HttpTransport.send")
    source_lines = (netkit["pkg"] / "transport.py").read_text().splitlines(keepends=True)
    source = "".join(source_lines[impl["start_line"] - 1:impl["end_line"]])
    assert cas.get_text(impl["content_hash"]) == source
    assert impl["embed_hash"] and impl["embed_hash"] != impl["content_hash"]
    assert cas.get_text(impl["embed_hash"]) == "http transport send\n" + source.strip("\n") + "\n"
    # the vector is the embedding text's; the source's own text was never embedded
    assert cache.lookup(fingerprint_id, [impl["embed_hash"]])
    assert not cache.lookup(fingerprint_id, [impl["content_hash"]])
    # every definition's child has an embedding text; parents and module-level code none
    assert all(bool(r["embed_hash"]) == (r["role"] == "child" and r["chunk_type"] != "module")
               for r in netkit["rows"])
    for mode in ("hybrid", "dense", "lexical"):
        result = netkit["reader"].query("http transport send", k=5, kind="code", mode=mode)
        hit = next(h for h in result["hits"] if h["symbol"] == "netkit.transport.HttpTransport.send")
        assert hit["text"] == source, mode
        assert not hit["text"].startswith("http transport send")
    # the name's words reach the dense channel: the method and its class lead
    assert "netkit.transport.HttpTransport.send" in \
        _symbols(netkit["reader"].query("http transport send", k=5, kind="code", mode="dense"))[:2]


def _fingerprint() -> str:
    from mtrag_assets.resources import MtragResource
    return MtragResource().embedder().fingerprint_id
