// ONNX Runtime's side of bench/inference.sh: per-batch latency of an exported model in
// onnxruntime-node (tests/export/node_modules, installed by scripts/bootstrap --test).
// Usage: node bench/inference_ort.js MODEL.onnx C,H,W BATCH THREADS BATCHES [WARMUP=2]
// Prints one JSON line: p50/p90/p99/mean latency per batch (ms, nearest rank) and samples/s, the
// same figures `lockstep predict --json` gives for LibTorch.
'use strict';
const path = require('path');
const ort = require(path.join(__dirname, '../tests/export/node_modules/onnxruntime-node'));

function percentile(sorted, q) {
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(rank, 1) - 1)];
}

async function main() {
  const [modelPath, shapeText, batchText, threadsText, batchesText, warmupText] = process.argv.slice(2);
  if (!batchesText) throw new Error('usage: node bench/inference_ort.js MODEL.onnx C,H,W BATCH THREADS BATCHES [WARMUP]');
  const [batch, threads, batches, warmup] = [batchText, threadsText, batchesText, warmupText || '2'].map(Number);
  const dims = [batch, ...shapeText.split(',').map(Number)];
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  });
  const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
  for (let i = 0; i < data.length; ++i) data[i] = Math.random() * 2 - 1;
  const feeds = {[session.inputNames[0]]: new ort.Tensor('float32', data, dims)};
  const latencies = [];
  for (let i = 0; i < warmup + batches; ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    if (i >= warmup) latencies.push(ms);
  }
  const total = latencies.reduce((a, b) => a + b, 0);
  latencies.sort((a, b) => a - b);
  console.log(JSON.stringify({
    latency_ms: {p50: percentile(latencies, 0.5), p90: percentile(latencies, 0.9), p99: percentile(latencies, 0.99),
                 mean: total / latencies.length, timed_batches: latencies.length},
    throughput_samples_per_s: (latencies.length * batch * 1000) / total,
  }));
}

main().catch((e) => {
  console.error(`inference_ort.js: ${e.message}`);
  process.exit(1);
});
