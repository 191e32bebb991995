// The onnxruntime package and the file access of the platform, set once by
// the entry point (src/node.js or src/web.js): the core never imports a
// runtime itself, so the same code runs in Node and in browsers.

/**
 * @typedef {object} Runtime
 * @property {object} ort the onnxruntime module (onnxruntime-node or -web)
 * @property {(source: string|URL|Uint8Array|ArrayBuffer, what: string) =>
 *   Promise<{bytes: Uint8Array, label: string}>} read a file's bytes (a
 *   path or a URL), or bytes given as they are
 * @property {(uri: string|URL, bytes: Uint8Array) => Promise<void>} write
 *   replaces a file by `bytes` (throws where there is no file system)
 * @property {object} sessionOptions options of every InferenceSession
 */

let current = null;

/** @param {Runtime} value */
export function setRuntime(value) {
  current = value;
}

/** @returns {Runtime} */
export function runtime() {
  if (!current) {
    throw new Error('No onnxruntime: import the package through its entry point '
      + "('onnxtrain-js' resolves to src/node.js in Node, src/web.js in browsers).");
  }
  return current;
}

/** Bytes given directly (Uint8Array, ArrayBuffer), or null. */
export function asBytes(source) {
  if (source instanceof Uint8Array) return source;
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (ArrayBuffer.isView(source)) return new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
  return null;
}
