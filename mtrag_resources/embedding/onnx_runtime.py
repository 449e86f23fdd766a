"""The ONNX backends: the transformer exported once per weights, quantized to int8 once per CPU
kind (with calibrated activation ranges, see int8_calibration), and run by onnxruntime without
importing torch (`OnnxLiteModel`). Exports are cached under `<cache>/onnx/<weights sha>/`."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from mtrag_resources.embedding.model_files import (_POOLING_FLAGS, _cache_root, _cpu_count, _load_json,
                                                   weights_sha256)

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
    attention scores and ran at half torch's speed. The TorchScript exporter (dynamo=False) needs no onnxscript."""
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
    activation ranges fixed by calibration (int8_calibration). Per channel, because per-tensor
    weights drifted too far from torch's vectors (docs/performance.md#embedding). Activation x
    activation MatMuls stay fp32."""
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
    or transformers (most of a small incremental build, and much of a serving process's memory)."""

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
