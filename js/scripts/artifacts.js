// Generates the artifacts, data and Python reference runs the tests, the
// demo and the benchmark use (scripts/make_artifacts.py, run by $PYTHON,
// default `python`, with this checkout's onnxtrain) into build/artifacts.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const JS_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_ROOT = path.resolve(JS_ROOT, '..');
export const ARTIFACTS = path.join(JS_ROOT, 'build', 'artifacts');
export const PYTHON = process.env.PYTHON || 'python';

/**
 * Runs a Python script of this checkout with its onnxtrain first on the path.
 * @param {string[]} args the script and its arguments
 * @returns {string} its standard output
 * @throws {Error} with its standard error when it fails
 */
export function python(args) {
  const env = { ...process.env, PYTHONPATH: [REPO_ROOT, process.env.PYTHONPATH].filter(Boolean).join(path.delimiter) };
  const result = spawnSync(PYTHON, args, { cwd: REPO_ROOT, env, encoding: 'utf8', maxBuffer: 1 << 26 });
  if (result.error) throw new Error(`Cannot run ${PYTHON} (set $PYTHON): ${result.error.message}`);
  if (result.status !== 0) throw new Error(`${PYTHON} ${args.join(' ')} failed:\n${result.stderr}`);
  return result.stdout;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const models = process.argv.slice(2);
  python([path.join(JS_ROOT, 'scripts', 'make_artifacts.py'), ARTIFACTS, ...models]);
  console.log(`artifacts written to ${ARTIFACTS}`);
}
