"""Where things live. Every path derives from MTRAG_HOME so a test or a bench gets a private tree."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mtrag_resources.core.layout import HomeLayout


@dataclass(frozen=True)
class Settings(HomeLayout):
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
    def qdrant_url(self) -> str | None:
        return os.environ.get("QDRANT_URL") or None

    @property
    def qdrant_api_key(self) -> str | None:
        return os.environ.get("QDRANT_API_KEY") or None

    def ensure(self) -> "Settings":
        for d in self.stage_dirs():
            d.mkdir(parents=True, exist_ok=True)
        return self
