// Steps/s of the same training recipe (make_artifacts.py) in Python's
// onnxtrain.api, in Node (onnxruntime-node, CPU) and in headless chromium
// (onnxruntime-web, wasm, through the demo page), on this machine.
// Usage: node bench/bench.js [repeats=5]   (after `npm run artifacts`)
import path from 'node:path';
import fs from 'node:fs';
import * as api from '../src/node.js';
import { replay } from '../demo/recipe.js';
import { ARTIFACTS, JS_ROOT, python } from '../scripts/artifacts.js';
import { launch } from '../scripts/chromium.js';
import { serve } from '../scripts/serve.js';

const repeats = Number(process.argv[2] ?? 5);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = [];

for (const model of ['mlp', 'cnn', 'digits']) {
  const dir = path.join(ARTIFACTS, model);
  const recipe = JSON.parse(fs.readFileSync(path.join(dir, 'reference.json'), 'utf8'));
  const data = new Uint8Array(fs.readFileSync(path.join(dir, 'data.bin'))).buffer;
  const files = {
    checkpoint: path.join(dir, 'checkpoint'),
    training: path.join(dir, 'training_model.onnx'),
    eval: path.join(dir, 'eval_model.onnx'),
    optimizer: path.join(dir, 'optimizer_model.onnx'),
  };
  const py = JSON.parse(python([path.join(JS_ROOT, 'bench', 'python_steps.py'), dir, String(repeats)]));
  const node = [];
  for (let i = 0; i < repeats; i++) {
    const run = await replay(api, files, recipe, data);
    node.push(run.seconds);
    await run.module.release();
    await run.optimizer.release();
  }
  rows.push({ model, steps: py.steps, python: py.steps / median(py.seconds), node: py.steps / median(node) });
}

// chromium: the demo page (digits), drawing off
const server = await serve();
const browser = await launch();
const chromium = [];
for (let i = 0; i < repeats; i++) {
  const page = await browser.context.newPage();
  await page.goto(`${server.url}/demo/index.html?auto=1&nodraw=1`);
  await page.waitForFunction(() => window.demoResult || window.demoError, null, { timeout: 300000 });
  chromium.push(await page.evaluate(() => window.demoResult?.stepsPerSecond ?? NaN));
  await page.close();
}
await browser.close();
server.server.close();
rows.find((r) => r.model === 'digits').chromium = median(chromium);

console.log(`median of ${repeats} runs, steps/s (a step: the recipe's training call(s) and one optimizer step)`);
console.log('model   steps  python-api  node(onnxruntime-node)  chromium(onnxruntime-web wasm)');
for (const r of rows) {
  console.log(`${r.model.padEnd(7)} ${String(r.steps).padStart(5)}  ${r.python.toFixed(0).padStart(10)}  ${r.node.toFixed(0).padStart(22)}  ${r.chromium ? r.chromium.toFixed(0).padStart(30) : '-'.padStart(30)}`);
}
