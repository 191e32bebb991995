// Entry point for Node.js: onnxruntime-node (CPU) and the file system.
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as ort from 'onnxruntime-node';
import { asBytes, setRuntime } from './core/runtime.js';

/** Reads a path, a file: URL, or bytes given as they are. */
async function read(source, what) {
  const bytes = asBytes(source);
  if (bytes) return { bytes, label: `(${what} bytes)` };
  const file = source instanceof URL ? fileURLToPath(source) : source;
  if (typeof file !== 'string') {
    throw new TypeError(`The ${what} is a path, a file: URL or bytes; got ${typeof source}.`);
  }
  return { bytes: new Uint8Array(await fs.readFile(file)), label: file };
}

/** Writes a new file beside the target (through a symbolic link: its
 * target) and renames it over the target once complete, so a failing write
 * leaves the previous file as it was. */
async function write(uri, bytes) {
  const file = uri instanceof URL ? fileURLToPath(uri) : uri;
  if (typeof file !== 'string') throw new TypeError(`Expected a path or a file: URL; got ${typeof uri}.`);
  let target = path.resolve(file);
  try {
    target = await fs.realpath(target);
  } catch {
    // a new file
  }
  let mode = null; // a replaced file keeps its permissions
  try {
    mode = (await fs.stat(target)).mode & 0o7777;
  } catch {
    // a new file: the process's umask applies
  }
  const partial = path.join(path.dirname(target), `.checkpoint-${randomBytes(6).toString('hex')}.partial`);
  try {
    await fs.writeFile(partial, bytes, { flag: 'wx' });
    if (mode !== null) await fs.chmod(partial, mode);
    await fs.rename(partial, target);
  } catch (err) {
    await fs.rm(partial, { force: true });
    throw err;
  }
}

setRuntime({
  ort,
  read,
  write,
  // threads that do not spin between kernels: a training step runs many
  // short sessions, and the JS thread needs a core between them
  sessionOptions: {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    extra: { session: { intra_op: { allow_spinning: '0' } } },
  },
});

export * from './core/index.js';
export { ort };
