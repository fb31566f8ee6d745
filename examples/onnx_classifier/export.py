"""Writes the classifier the app serves, ``shapes.onnx``: 8x8 grey images in, one of four shapes out.

    python examples/onnx_classifier/export.py /tmp/shapes            # writes /tmp/shapes/shapes.onnx
    ember volume put shapes-onnx /tmp/shapes/shapes.onnx

The weights are not trained: each class's row is its shape's template (zero-mean, unit norm), so the model is a
template matcher, tiny and the same every time. Your own model goes the same way: ``torch.onnx.export(...)`` into
a file, ``ember volume put`` it, and the app reads it from the mount.
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 8
LABELS = ["vertical", "horizontal", "diagonal", "square"]


def template(label: str) -> np.ndarray:
    """An 8x8 picture of a shape: ones on it, zeros elsewhere."""
    x = np.zeros((SIZE, SIZE), dtype=np.float32)
    if label == "vertical":
        x[:, 3:5] = 1
    elif label == "horizontal":
        x[3:5, :] = 1
    elif label == "diagonal":
        np.fill_diagonal(x, 1)
    else:
        x[1, 1:7] = x[6, 1:7] = x[1:7, 1] = x[1:7, 6] = 1
    return x


def build() -> onnx.ModelProto:
    """images [N, 8, 8] -> Flatten -> Gemm(templates) -> Softmax -> probs [N, 4]."""
    rows = []
    for label in LABELS:
        t = template(label).ravel()
        t = t - t.mean()
        rows.append(t / np.linalg.norm(t))
    weights = np.stack(rows).astype(np.float32) * 8.0  # a sharper softmax
    nodes = [helper.make_node("Flatten", ["images"], ["flat"], axis=1),
             helper.make_node("Gemm", ["flat", "weights"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(
        nodes, "shapes",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", SIZE, SIZE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", len(LABELS)])],
        [numpy_helper.from_array(weights, "weights")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ember-example")
    model.ir_version = 8  # readable by older ONNX Runtimes too
    onnx.checker.check_model(model)
    return model


def export(folder: Path) -> Path:
    """Writes ``shapes.onnx`` into ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "shapes.onnx"
    onnx.save(build(), path)
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sample"]:  # a picture to try: `--sample vertical` prints its pixels as JSON
        print(json.dumps(template(sys.argv[2]).tolist()))
    else:
        print(export(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
