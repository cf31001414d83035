// Runs an ONNX file in ONNX Runtime (onnxruntime-node), the independent check of lockstep export.
// Usage: node run_onnx.js MODEL.onnx INPUT.bin D0,D1,... OUTPUT.bin
//   INPUT.bin: float32 little-endian values of the model's one input, shape D0,D1,...
//   OUTPUT.bin: written with the float32 values of the model's one output.
// Prints one JSON line: the session's input and output names and the output's dims.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [modelPath, inputPath, dimsText, outputPath] = process.argv.slice(2);
  if (!outputPath) throw new Error('usage: node run_onnx.js MODEL.onnx INPUT.bin D0,D1,... OUTPUT.bin');
  const dims = dimsText.split(',').map(Number);
  const bytes = fs.readFileSync(inputPath);
  const input = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: 1,
    interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
  });
  if (session.inputNames.length !== 1 || session.outputNames.length !== 1)
    throw new Error(`expected one input and one output, got ${session.inputNames} -> ${session.outputNames}`);
  const feeds = {[session.inputNames[0]]: new ort.Tensor('float32', input, dims)};
  const results = await session.run(feeds);
  const out = results[session.outputNames[0]];
  fs.writeFileSync(outputPath, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
  console.log(JSON.stringify({inputs: session.inputNames, outputs: session.outputNames, dims: out.dims}));
}

main().catch((e) => {
  console.error(`run_onnx.js: ${e.message}`);
  process.exit(1);
});
