"""Runs an ONNX file in ONNX Runtime (PyPI's onnxruntime), the independent check of lockstep export.

Usage: python run_onnx.py MODEL.onnx INPUT.bin D0,D1,... OUTPUT.bin
  INPUT.bin: float32 little-endian values of the model's one input, shape D0,D1,...
  OUTPUT.bin: written with the float32 values of the model's one output.
Prints one JSON line: the session's input and output names and the output's dims.
"""
import json
import sys

import numpy as np
import onnxruntime as ort


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: python run_onnx.py MODEL.onnx INPUT.bin D0,D1,... OUTPUT.bin")
    model_path, input_path, dims_text, output_path = sys.argv[1:]
    dims = [int(d) for d in dims_text.split(",")]
    values = np.fromfile(input_path, dtype="<f4").reshape(dims)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    if len(inputs) != 1 or len(outputs) != 1:
        sys.exit(f"run_onnx.py: expected one input and one output, got {inputs} -> {outputs}")
    (out,) = session.run(None, {inputs[0]: values})
    np.ascontiguousarray(out, dtype="<f4").tofile(output_path)
    print(json.dumps({"inputs": inputs, "outputs": outputs, "dims": list(out.shape)}))


if __name__ == "__main__":
    main()
