"""Record the class list the local Neo4j's class-data archive is made from
(mtrag_resources/stores/neo4j_cds.py): the classes a server loads while the demo writes its graph
from scratch (first writes, the warm-up's rehearsed changes) and answers its queries and paths.

Run after `bash scripts/demo` (it copies that home without its graph and the Neo4j folder), when
the pinned Neo4j version changes:

    .venv/bin/python scripts/neo4j_classlist.py

It writes mtrag_resources/stores/data/neo4j-<version>.classlist.gz. The server it starts is stopped
before the copy is removed.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mtrag_resources.core.config import Settings  # noqa: E402
from mtrag_resources.stores import neo4j_cds  # noqa: E402
from mtrag_resources.stores.neo4j_server import (Neo4jServer, _free_port, bolt_answers, neo4j_version,  # noqa: E402
                                                 resolve_jars)


def main() -> int:
    demo_home = REPO / "data"
    if not (demo_home / "08-manifest" / "CURRENT").exists():
        print("run `bash scripts/demo` first: this records the classes its graph writes load", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mtrag-classlist-") as tmp:
        work = Path(tmp)
        home = work / "home"
        shutil.copytree(demo_home, home, ignore=shutil.ignore_patterns("neo4j"))
        recorded = work / "classes.lst"
        server = Neo4jServer(Settings(home=work / "neo4j-home"))
        lib = resolve_jars(server.version)
        port = _free_port()
        server.write_conf(port)
        os.environ["MTRAG_NEO4J_CDS"] = "off"  # record what a plain JVM loads
        command = server.command(lib)
        command.insert(1, f"-XX:DumpLoadedClassList={recorded}")
        with open(work / "console.log", "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=server.home,
                                    start_new_session=True)
        try:
            uri = f"bolt://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while not bolt_answers(uri):
                if proc.poll() is not None or time.monotonic() > deadline:
                    print((work / "console.log").read_text()[-3000:], file=sys.stderr)
                    return 1
                time.sleep(0.2)
            env = {**os.environ, "MTRAG_HOME": str(home), "MTRAG_SOURCES": str(demo_home / "sources.yaml"),
                   "DAGSTER_HOME": str(home / "dagster_home"), "NEO4J_URI": uri, "MTRAG_BUILD_SERVER": "off",
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
            subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "demo"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # a clean stop: the list's last lines are written
            proc.wait(timeout=120)
        out = neo4j_cds.classlist_path(neo4j_version())
        print(f"{neo4j_cds.pack(recorded, out)} classes -> {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
