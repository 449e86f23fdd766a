"""Every `status` of a server mtrag starts (build-server, neo4j, postgres) follows one convention,
that of an LSB init script: exit 0 while it runs, 3 while it does not; the line says which."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MTRAG = str(Path(sys.executable).with_name("mtrag"))


@pytest.mark.unit
@pytest.mark.parametrize("server", ["build-server", "neo4j", "postgres"])
def test_status_of_a_server_that_does_not_run_exits_3(tmp_path, server):
    env = {k: v for k, v in os.environ.items() if k not in ("NEO4J_URI", "DAGSTER_HOME")}
    env["MTRAG_HOME"] = str(tmp_path / "home")
    out = subprocess.run([MTRAG, server, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.strip() == f"{server.replace('-', ' ')}: not running"
