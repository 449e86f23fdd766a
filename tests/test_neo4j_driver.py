"""The neo4j driver import that leaves pandas out of a reader's process (stores/neo4j_driver.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_driver_loads_without_pandas_and_pandas_still_imports_after():
    out = _run("import sys\n"
               "from mtrag_resources.stores.neo4j_driver import GraphDatabase, ClientError\n"
               "print('pandas' in sys.modules, callable(GraphDatabase.driver), issubclass(ClientError, Exception))\n"
               "import pandas\n"
               "print(pandas.DataFrame({'a': [1]}).shape)")
    assert out.splitlines() == ["False True True", "(1, 1)"]


def test_a_process_that_loaded_pandas_first_keeps_the_drivers_pandas_support():
    out = _run("import pandas\n"
               "import mtrag_resources.stores.neo4j_driver\n"
               "import neo4j._optional_deps as deps\n"
               "print(deps.pd is pandas)")
    assert out == "True"
