"""Where things live. Every path derives from MTRAG_HOME so a test or a bench gets a private tree."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    home: Path

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(home=Path(os.environ.get("MTRAG_HOME", "./data")).resolve())

    @property
    def sources_file(self) -> Path:
        return Path(os.environ.get("MTRAG_SOURCES", self.home / "sources.yaml")).resolve()

    @property
    def dagster_home(self) -> Path:
        return Path(os.environ.get("DAGSTER_HOME", self.home / "dagster_home")).resolve()

    @property
    def raw_dir(self) -> Path:
        return self.home / "01-raw"

    @property
    def cas_dir(self) -> Path:
        return self.home / "02-cas"

    @property
    def graph_dir(self) -> Path:
        return self.home / "03-graph"

    @property
    def embeddings_dir(self) -> Path:
        return self.home / "04-embeddings"

    @property
    def qdrant_path(self) -> Path:
        return self.home / "05-qdrant"

    @property
    def fts_path(self) -> Path:
        return self.home / "06-fts" / "fts.sqlite"

    @property
    def links_dir(self) -> Path:
        return self.home / "07-links"

    @property
    def manifest_dir(self) -> Path:
        return self.home / "08-manifest"

    @property
    def sdist_dir(self) -> Path:
        return self.home / "sdists"

    @property
    def neo4j_dir(self) -> Path:
        return self.home / "neo4j"

    @property
    def qdrant_url(self) -> str | None:
        return os.environ.get("QDRANT_URL") or None

    @property
    def qdrant_api_key(self) -> str | None:
        return os.environ.get("QDRANT_API_KEY") or None

    def ensure(self) -> "Settings":
        for d in (self.raw_dir, self.cas_dir, self.graph_dir, self.embeddings_dir, self.links_dir,
                  self.manifest_dir, self.fts_path.parent):
            d.mkdir(parents=True, exist_ok=True)
        return self
