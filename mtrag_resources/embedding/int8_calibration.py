"""Fixed activation ranges for the int8 embedder, so a text's vector does not depend on its batch.

onnxruntime's dynamic quantization (DynamicQuantizeLinear) takes each activation's int8 range from
the whole batch tensor, padding included: the same text embedded alone or beside others gave vectors
with cosine down to 0.969. For a content-addressed embedding cache that is wrong (a fresh and an
incremental build would store different vectors for one text, and a query embedded alone would be
encoded unlike the chunks). Here every DynamicQuantizeLinear of the dynamic graph becomes a
QuantizeLinear with a constant scale and zero point, measured once over the texts frozen in
`data/int8_calibration.json` (see scripts/calibration_texts.py): the int8 kernels stay the same,
rows become independent. Ranges are rounded outward to 1/64 of their magnitude, so machines whose
float arithmetic differs in the last bits still derive the same model.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

CALIBRATION_VERSION = 1  # bump when the texts or the range rule change: it is in the fingerprint
TEXTS_FILE = Path(__file__).with_name("data") / "int8_calibration.json"
BATCH = 16

Feeds = Callable[[list[str]], tuple[dict, "np.ndarray"]]  # texts -> (session feeds, attention mask)


def calibration_texts() -> list[str]:
    return [entry["text"] for entry in json.loads(TEXTS_FILE.read_text(encoding="utf-8"))]


def _outward(x: float, up: bool) -> float:
    if x == 0.0:
        return 0.0
    step = 2.0 ** (math.floor(math.log2(abs(x))) - 6)
    return (math.ceil(x / step) if up else math.floor(x / step)) * step


def measure_ranges(model, feeds_for: Feeds, run: Callable[[dict, list[str]], list], texts: list[str]) -> dict[str, tuple[float, float]]:
    """Min and max over the real (unpadded) tokens of each DynamicQuantizeLinear input."""
    names = [n.input[0] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"]
    lo = dict.fromkeys(names, math.inf)
    hi = dict.fromkeys(names, -math.inf)
    for start in range(0, len(texts), BATCH):
        feeds, mask = feeds_for(texts[start:start + BATCH])
        for name, value in zip(names, run(feeds, names)):
            real = value[mask.astype(bool)] if value.ndim == 3 else value
            lo[name] = min(lo[name], float(real.min()))
            hi[name] = max(hi[name], float(real.max()))
    return {n: (_outward(min(0.0, lo[n]), up=False), _outward(max(0.0, hi[n]), up=True)) for n in names}


def freeze_ranges(model, ranges: dict[str, tuple[float, float]]) -> None:
    """Replace each DynamicQuantizeLinear of `model` (in place) by a QuantizeLinear whose scale and
    zero point are constants with the names the dynamic node's outputs had."""
    import numpy as np
    from onnx import helper, numpy_helper

    nodes = []
    for node in model.graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        rmin, rmax = ranges[node.input[0]]
        scale = (rmax - rmin) / 255.0 or 1.0
        zero_point = int(np.clip(round(-rmin / scale), 0, 255))
        quantized, scale_name, zero_name = node.output
        model.graph.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), scale_name))
        model.graph.initializer.append(numpy_helper.from_array(np.array(zero_point, dtype=np.uint8), zero_name))
        nodes.append(helper.make_node("QuantizeLinear", [node.input[0], scale_name, zero_name], [quantized],
                                      name=f"{node.name}_fixed_range"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def with_probes(model):
    """A copy of `model` that also outputs every DynamicQuantizeLinear input (for measure_ranges)."""
    import copy

    from onnx import TensorProto, helper

    probe = copy.deepcopy(model)
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            probe.graph.output.append(helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None))
    return probe


def fuse_integer_matmuls(model) -> None:
    """MatMulInteger -> Cast -> Mul(a_scale * b_scale) becomes one MatMulIntegerToFloat (in place):
    onnxruntime fuses that chain only behind a DynamicQuantizeLinear. Same results bit for bit, two
    passes over each activation fewer, so more texts/s (docs/performance.md#embedding)."""
    from onnx import helper

    producers = {out: node for node in model.graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            continue
        chain = consumers.get(node.output[0], [])
        cast = chain[0] if len(chain) == 1 and chain[0].op_type == "Cast" else None
        after = consumers.get(cast.output[0], []) if cast else []
        mul = after[0] if len(after) == 1 and after[0].op_type == "Mul" else None
        scales = producers.get(next((i for i in mul.input if i != cast.output[0]), "")) if mul else None
        if scales is None or scales.op_type != "Mul":
            continue  # not the quantizer's pattern: leave it
        a_scale, b_scale = scales.input
        replaced[id(node)] = helper.make_node(
            "MatMulIntegerToFloat", [node.input[0], node.input[1], a_scale, b_scale, *node.input[2:4]],
            [mul.output[0]], name=f"{node.name}_to_float", domain="com.microsoft")
        dropped |= {id(cast), id(mul)}
        if len(consumers[scales.output[0]]) == 1:
            dropped.add(id(scales))
    nodes = [replaced.get(id(n), n) for n in model.graph.node if id(n) not in dropped]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
