"""The local Neo4j's boot with and without its class-data archive (mtrag_resources/stores/neo4j_cds.py),
alternating in one run: per round a fresh server home each way, the seconds from the launch to
Bolt answering, the JVM's CPU seconds by then, and a first write on the just-booted JVM (10k nodes,
then 20k relationships in UNWIND batches of 2,000): its seconds and relationships/s, and the JVM's
CPU seconds after it; then the same write three times more on new nodes, the last one's seconds
(`warm_write_s`: the steady state, which the archive should leave as it was). Medians per way and their ratios. The archive is made first when missing
(its seconds are reported: what a machine pays once per Java runtime and jar set).

Usage: python bench/neo4j_boot.py [--rounds 3] [--out bench/out/neo4j_boot.json]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, cpu_s, write_json  # noqa: E402
from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.stores import neo4j_cds  # noqa: E402
from mtrag_resources.stores.neo4j_server import Neo4jServer, find_java, resolve_jars  # noqa: E402

NODES, RELS, BATCH = 10_000, 20_000, 2_000
WARM_WRITES = 3  # the last of these writes (each on new nodes) is warm_write_s: the steady state


def write(uri: str, label: str = "BenchN") -> float:
    from neo4j import GraphDatabase
    t0 = time.perf_counter()
    with GraphDatabase.driver(uri, auth=None) as driver, driver.session() as session:
        session.run(f"CREATE INDEX {label.lower()}_id IF NOT EXISTS FOR (n:{label}) ON (n.id)").consume()
        for start in range(0, NODES, BATCH):
            session.run(f"UNWIND $ids AS id CREATE (:{label} {{id: id}})",
                        ids=[f"n{i}" for i in range(start, start + BATCH)]).consume()
        session.run("CALL db.awaitIndexes()").consume()
        for start in range(0, RELS, BATCH):
            rows = [{"a": f"n{i % NODES}", "b": f"n{(i * 7 + 1) % NODES}"} for i in range(start, start + BATCH)]
            session.run(f"UNWIND $rows AS r MATCH (a:{label} {{id: r.a}}), (b:{label} {{id: r.b}}) "
                        "CREATE (a)-[:BENCH_R]->(b)",
                        rows=rows).consume()
    return time.perf_counter() - t0


def one_boot(cds: str, work: Path, archive: Path) -> dict:
    os.environ["MTRAG_NEO4J_CDS"] = cds
    home = Path(tempfile.mkdtemp(prefix=f"boot-{cds}-", dir=work))
    server = Neo4jServer(Settings(home=home))
    try:
        t0 = time.perf_counter()
        uri = server.start()
        boot = time.perf_counter() - t0
        pid = server._pid()
        boot_cpu = cpu_s(pid)
        mapped = neo4j_cds.mapped_archive(pid)
        first = write(uri)
        cpu_after = cpu_s(pid)
        for n in range(WARM_WRITES - 1):  # the same write again, on new nodes: the JVM warms up
            write(uri, f"BenchWarm{n}")
        warm = write(uri, "BenchWarm")
        return {"cds": cds, "archive_mapped": mapped == str(archive), "boot_s": round(boot, 3),
                "boot_cpu_s": round(boot_cpu, 2), "write_s": round(first, 3), "rels_per_s": round(RELS / first),
                "cpu_after_write_s": round(cpu_after, 2), "warm_write_s": round(warm, 3)}
    finally:
        server.stop()  # stopped before its folder goes
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench/out/neo4j_boot.json"))
    args = ap.parse_args()
    os.environ.pop("NEO4J_URI", None)
    result: dict = {"java": find_java(), "rounds": []}
    server = Neo4jServer(Settings(home=Path(tempfile.gettempdir())))
    lib = resolve_jars(server.version)
    classlist = neo4j_cds.classlist_path(server.version)
    archive = neo4j_cds.archive_path(find_java(), lib, classlist)
    if not archive.is_file():
        print("making the class-data archive ...", flush=True)
        t0 = time.perf_counter()
        if neo4j_cds.dump(find_java(), lib, classlist, archive, niceness=0) != 0:
            raise SystemExit(f"no archive: {archive.with_suffix('.failed').read_text()}")
        result["archive_made_s"] = round(time.perf_counter() - t0, 1)
    result["archive_mb"] = round(archive.stat().st_size / 2**20, 1)
    with tempfile.TemporaryDirectory(prefix="mtrag-neo4j-boot-") as tmp:
        for n in range(args.rounds):
            for cds in (("off", "on") if n % 2 == 0 else ("on", "off")):
                run = one_boot(cds, Path(tmp), archive)
                print(run, flush=True)
                result["rounds"].append(run)
    for cds in ("off", "on"):
        runs = [r for r in result["rounds"] if r["cds"] == cds]
        result[cds] = {k: statistics.median(r[k] for r in runs)
                       for k in ("boot_s", "boot_cpu_s", "write_s", "rels_per_s", "cpu_after_write_s",
                                 "warm_write_s")}
    result["archive_used_every_time"] = all(r["archive_mapped"] == (r["cds"] == "on") for r in result["rounds"])
    result["ratio_on_off"] = {k: round(result["on"][k] / result["off"][k], 3) for k in result["on"]}
    print({k: result[k] for k in ("off", "on", "ratio_on_off", "archive_used_every_time")})
    write_json(args.out, result)


if __name__ == "__main__":
    main()
