// Entry point for browsers: onnxruntime-web (wasm; WebGPU where asked for
// and available) and fetch.
import * as ort from 'onnxruntime-web';
import { asBytes, setRuntime } from './core/runtime.js';

/** Fetches a URL, or takes bytes given as they are. */
async function read(source, what) {
  const bytes = asBytes(source);
  if (bytes) return { bytes, label: `(${what} bytes)` };
  if (typeof source !== 'string' && !(source instanceof URL)) {
    throw new TypeError(`The ${what} is a URL or bytes; got ${typeof source}.`);
  }
  const response = await fetch(source);
  if (!response.ok) throw new Error(`Cannot fetch the ${what} ${source}: HTTP ${response.status}.`);
  return { bytes: new Uint8Array(await response.arrayBuffer()), label: String(source) };
}

async function write(uri) {
  throw new Error(`A browser has no file system to write ${uri}: use the bytes (CheckpointState.toBytes, the value exportModelForInferencing(null, ...) returns).`);
}

const runtime = {
  ort,
  read,
  write,
  sessionOptions: { executionProviders: ['wasm'], graphOptimizationLevel: 'all' },
};
setRuntime(runtime);

/**
 * Chooses the execution providers of the sessions created from now on.
 * @param {string[]} providers e.g. ['webgpu', 'wasm'] (onnxruntime-web's
 *   names; WebGPU needs a build of onnxruntime-web that has it, such as the
 *   package's default import, not dist/ort.wasm.min.mjs)
 */
export function setExecutionProviders(providers) {
  runtime.sessionOptions = { ...runtime.sessionOptions, executionProviders: [...providers] };
}

export * from './core/index.js';
export { ort };
