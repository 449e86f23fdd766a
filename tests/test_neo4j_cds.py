"""The local Neo4j's class-data archive (mtrag_resources/stores/neo4j_cds.py): made from the shipped
class list, mapped by the server's JVM, made in the background by a launch without one, and never
in the way of a boot (a broken archive, a failed dump, MTRAG_NEO4J_CDS=off)."""
from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import ConfigError
from mtrag_resources.stores import neo4j_cds
from mtrag_resources.stores.neo4j_server import (Neo4jServer, bolt_answers, find_java,
                                                 neo4j_version, resolve_jars)


@pytest.mark.unit
def test_the_shipped_class_list_is_one_jdk_17_parses():
    shipped = neo4j_cds.classlist_path(neo4j_version())
    text = gzip.decompress(shipped.read_bytes()).decode()
    lines = text.splitlines()
    assert text.endswith("\n") and len(lines) > 10_000
    assert max(map(len, lines)) < neo4j_cds.MAX_LINE
    assert "org/neo4j/server/CommunityEntryPoint" in lines  # the server's own classes, not the JDK's alone
    assert any(line.startswith("org/neo4j/cypher/") for line in lines)  # and the query engine's


@pytest.mark.unit
def test_pack_drops_what_the_parser_refuses_and_a_cut_last_line(tmp_path):
    recorded = tmp_path / "recorded.lst"
    long_line = "@lambda-proxy " + "x" * neo4j_cds.MAX_LINE
    recorded.write_text(f"# header\njava/lang/Object\n{long_line}\norg/neo4j/A\norg/neo4j/B_cut")
    out = tmp_path / "data" / "x.classlist.gz"
    assert neo4j_cds.pack(recorded, out) == 3
    assert gzip.decompress(out.read_bytes()).decode() == "# header\njava/lang/Object\norg/neo4j/A\n"


@pytest.mark.unit
def test_the_archive_key_follows_the_runtime_the_jars_and_the_class_list(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.jar").write_bytes(b"a")
    (lib / "b.jar").write_bytes(b"b")
    classlist = tmp_path / "list.gz"
    classlist.write_bytes(gzip.compress(b"java/lang/Object\n"))
    java = find_java()
    key = neo4j_cds.archive_key(java, lib, classlist)
    assert neo4j_cds.archive_key(java, lib, classlist) == key
    (lib / "b.jar").write_bytes(b"bb")  # a jar replaced
    assert neo4j_cds.archive_key(java, lib, classlist) != key
    key = neo4j_cds.archive_key(java, lib, classlist)
    classlist.write_bytes(gzip.compress(b"java/lang/String\n"))
    assert neo4j_cds.archive_key(java, lib, classlist) != key
    key = neo4j_cds.archive_key(java, lib, classlist)
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_text("")
    assert neo4j_cds.archive_key(str(other_java), lib, classlist) != key


@pytest.mark.unit
def test_off_uses_and_starts_nothing_and_a_bad_value_is_named(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(neo4j_cds, "start_dump", lambda *a: started.append(a))
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setenv("MTRAG_NEO4J_CDS", "off")
    assert neo4j_cds.archive_flags(find_java(), lib, neo4j_version()) == []
    monkeypatch.setenv("MTRAG_NEO4J_CDS", "sometimes")
    with pytest.raises(ConfigError, match="MTRAG_NEO4J_CDS='sometimes'"):
        neo4j_cds.archive_flags(find_java(), lib, neo4j_version())
    monkeypatch.setenv("MTRAG_NEO4J_CDS", "on")
    assert neo4j_cds.archive_flags(find_java(), lib, "0.0.1") == []  # no class list for that version
    assert started == []


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A jar cache of its own (the real jars, linked), so archives are made beside it, and a short
    class list (the JDK's first classes and some of Neo4j's: a dump of seconds, not ~36 s)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    real = resolve_jars()
    (cache / "lib").symlink_to(real)
    for marker in real.parent.iterdir():
        if marker.is_file():
            (cache / marker.name).symlink_to(marker)
    monkeypatch.setenv("MTRAG_NEO4J_CACHE", str(cache))
    monkeypatch.delenv("NEO4J_URI", raising=False)
    lines = gzip.decompress(neo4j_cds.classlist_path(neo4j_version()).read_bytes()).decode().splitlines()
    short = [line for line in lines if not line.startswith("@")][:1500]
    short += [line for line in lines if line.startswith("org/neo4j/server/")]
    classlist = tmp_path / "short.classlist.gz"
    classlist.write_bytes(gzip.compress(("\n".join(short) + "\n").encode()))
    monkeypatch.setattr(neo4j_cds, "classlist_path", lambda version: classlist)
    return cache / "lib", classlist


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow  # boots three Neo4j JVMs of its own
def test_a_launch_makes_the_archive_in_the_background_and_the_next_server_maps_it(tmp_path, private_cache):
    lib, classlist = private_cache
    archive = neo4j_cds.archive_path(find_java(), lib, classlist)
    server = Neo4jServer(Settings(home=tmp_path / "home"))
    try:
        server.start()  # no archive yet: this boot goes without, and a dump starts beside it
        assert neo4j_cds.mapped_archive(server._pid()) != str(archive)
        deadline = time.monotonic() + 120
        while not archive.is_file():
            assert time.monotonic() < deadline, (archive.parent / f"{archive.stem}.log").read_text()
            time.sleep(0.2)
        assert not list(archive.parent.glob(f"{archive.stem}.tmp*"))  # made beside its name, then renamed
    finally:
        server.stop()
    try:
        uri = server.start()
        assert neo4j_cds.mapped_archive(server._pid()) == str(archive)
        assert bolt_answers(uri)
    finally:
        server.stop()
    # a broken archive (a disk that filled mid-copy, say) is not mapped and stops no boot
    data = archive.read_bytes()
    archive.chmod(0o644)
    archive.write_bytes(data[: len(data) // 3])
    try:
        uri = server.start()
        assert neo4j_cds.mapped_archive(server._pid()) != str(archive)
        assert bolt_answers(uri)
    finally:
        server.stop()


@pytest.mark.integration
def test_a_failed_dump_is_recorded_and_not_started_again(tmp_path, monkeypatch):
    lib = resolve_jars()
    bad = tmp_path / "bad.classlist.gz"
    # a line longer than JDK 17's parser takes (as the JVM itself records some lambda proxies)
    bad.write_bytes(gzip.compress(b"java/lang/Object\n@lambda-proxy " + b"x" * 8000 + b"\n"))
    archive = tmp_path / "cds" / "k.jsa"
    archive.parent.mkdir()
    killed = archive.parent / "k.tmpold"  # what a dump killed mid-way left
    killed.mkdir()
    (killed / "k.jsa").write_bytes(b"partial")
    assert neo4j_cds.dump(find_java(), lib, bad, archive, niceness=0) == 1
    assert not archive.exists() and "exit" in archive.with_suffix(".failed").read_text()
    assert not killed.exists()
    # archive_flags: that key's failure is on record, so a launch boots plain and starts no dump
    monkeypatch.setattr(neo4j_cds, "classlist_path", lambda version: bad)
    monkeypatch.setattr(neo4j_cds, "cds_dir", lambda lib: archive.parent)
    os.replace(archive.with_suffix(".failed"), neo4j_cds.archive_path(find_java(), lib, bad).with_suffix(".failed"))
    started = []
    monkeypatch.setattr(neo4j_cds, "start_dump", lambda *a: started.append(a))
    assert neo4j_cds.archive_flags(find_java(), lib, neo4j_version()) == [] and started == []
