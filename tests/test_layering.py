"""The house rules that keep mtrag's layers apart: import-linter's contracts (.importlinter), the
CLI's query path free of Dagster, Dagster's private modules only through one module, and one
declared place for every environment variable."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.core.config import ENVIRONMENT

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mtrag_resources", "mtrag_assets")


def test_import_contracts_hold():
    """Layers, the Dagster-free core, store clients only in stores/, no cycles, pyarrow only
    through core/arrow.py (.importlinter)."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "8 kept, 0 broken" in proc.stdout


def test_every_module_beside_the_app_room_is_held_below_it():
    """The contract that keeps the definitions from importing mtrag_assets.app names each module
    of mtrag_assets: a new module is named there too, or it could import the app unseen."""
    import configparser
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    named = set(config["importlinter:contract:definitions-below-the-app"]["source_modules"].split())
    present = {f"mtrag_assets.{p.stem}" for p in (REPO / "mtrag_assets").glob("*.py") if p.stem != "__init__"}
    assert named == present


def test_query_and_serve_paths_do_not_import_dagster(tmp_path):
    """`mtrag query` (and what `mtrag serve` loads) run without importing Dagster."""
    probe = (
        "import sys, json\n"
        "from mtrag_assets.app.cli import main\n"
        "rc = main(['query', 'how do I prompt', '--json'])\n"
        "import mtrag_resources.serving.http, mtrag_resources.serving.render\n"
        "import mtrag_resources.stores.qdrant_store, mtrag_resources.stores.fts_store\n"
        "import mtrag_resources.stores.neo4j_store, mtrag_resources.embedding.embedder\n"
        "print(json.dumps({'rc': rc, 'dagster': sorted(m for m in sys.modules if m.split('.')[0] == 'dagster')}))\n"
    )
    env = {"MTRAG_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert result["dagster"] == []


DAGSTER_PRIVATE = REPO / "mtrag_assets" / "dagster_private.py"


def _private_dagster_uses(path: Path) -> list[str]:
    """Imports of `dagster._...` in a module, and any other mention of it (a string handed to
    importlib, an attribute path): what `grep "dagster\\._"` finds, comments aside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = re.findall(r"\bdagster\._\w*", node.value)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in ("dagster", "dg") and node.attr.startswith("_"):
            names = [f"dagster.{node.attr}"]
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.startswith("dagster._")]
    return found


def test_only_dagster_private_uses_dagster_internals():
    """Dagster's private modules are used in mtrag_assets/dagster_private.py alone, where each says
    which public API is missing and tests/test_dagster_private.py checks it."""
    uses = [u for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py")) if p != DAGSTER_PRIVATE
            for u in _private_dagster_uses(p)]
    assert uses == []
    assert _private_dagster_uses(DAGSTER_PRIVATE)  # the check finds what it looks for


def _environment_reads(path: Path) -> list[str]:
    """`os.environ.get(...)`, `os.environ[...]` loads and `os.getenv(...)` in a module (writes for
    third-party libraries, such as HF_HUB_OFFLINE for the hub client, are not reads)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
                found.append(f"{path}:{node.lineno}")
            if f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "environ":
                found.append(f"{path}:{node.lineno}")
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
            found.append(f"{path}:{node.lineno}")
    return found


def test_environment_is_read_only_through_config():
    reads = [r for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             if p.name != "config.py" or p.parent.name != "core" for r in _environment_reads(p)]
    assert reads == []


def test_configuration_table_matches_the_declared_variables():
    """docs/configuration.md's table (the README links it and shows a few) lists every variable."""
    page = (REPO / "docs" / "configuration.md").read_text()
    section = page.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    assert documented == set(ENVIRONMENT)
