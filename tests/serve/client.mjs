// An independent KServe v2 client for the serve tests: Node 20's built-in fetch, no packages.
// Usage: node client.mjs INFER_URL INPUT_FILE json|binary
//   INPUT_FILE: {"shape": [n, ...], "data": [flat fp32 values]}
// Prints one JSON line: {"status", "content_type", "shape", "data"} (the logits), or {"status", "error"}.
import { readFileSync } from 'node:fs';

const [url, inputFile, mode] = process.argv.slice(2);
const input = JSON.parse(readFileSync(inputFile, 'utf8'));

let response;
if (mode === 'json') {
  // Nested data, as a Python client's tensor.tolist() sends it.
  const nest = (flat, shape) => shape.length === 1 ? flat
      : Array.from({ length: shape[0] }, (_, i) => {
          const step = flat.length / shape[0];
          return nest(flat.slice(i * step, (i + 1) * step), shape.slice(1));
        });
  const body = { id: 'node-json', inputs: [{ name: 'input', shape: input.shape, datatype: 'FP32',
                                             data: nest(input.data, input.shape) }] };
  response = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                body: JSON.stringify(body) });
} else {
  // The binary tensor data extension both ways: raw little-endian floats after the JSON header.
  const values = new Float32Array(input.data);
  const header = Buffer.from(JSON.stringify({
    id: 'node-binary',
    inputs: [{ name: 'input', shape: input.shape, datatype: 'FP32',
               parameters: { binary_data_size: values.byteLength } }],
    outputs: [{ name: 'logits', parameters: { binary_data: true } }],
  }));
  response = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/octet-stream',
               'Inference-Header-Content-Length': String(header.length) },
    body: Buffer.concat([header, Buffer.from(values.buffer)]),
  });
}

const bytes = Buffer.from(await response.arrayBuffer());
if (!response.ok) {
  console.log(JSON.stringify({ status: response.status, error: JSON.parse(bytes.toString('utf8')).error }));
  process.exit(0);
}
const headerLength = response.headers.get('inference-header-content-length');
const jsonBytes = headerLength === null ? bytes.length : Number(headerLength);
const reply = JSON.parse(bytes.subarray(0, jsonBytes).toString('utf8'));
const output = reply.outputs[0];
let data = output.data;
if (data === undefined) {
  const raw = bytes.subarray(jsonBytes, jsonBytes + output.parameters.binary_data_size);
  data = Array.from(new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length)));
}
console.log(JSON.stringify({ status: response.status, id: reply.id, content_type: response.headers.get('content-type'),
                             shape: output.shape, data }));
