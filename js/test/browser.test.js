// The demo page trains the digits CNN in headless chromium (onnxruntime-web,
// wasm) and its loss curve matches Python's onnxtrain.api on the same batches.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, it } from 'node:test';
import { maxRelDiff } from '../demo/recipe.js';
import { ARTIFACTS, JS_ROOT } from '../scripts/artifacts.js';
import { launch } from '../scripts/chromium.js';
import { serve } from '../scripts/serve.js';

const RTOL = 1e-5;
let server;
let browser;

before(async () => {
  server = await serve();
  browser = await launch();
});

after(async () => {
  await browser?.close();
  server?.server.close();
});

it('the demo page trains in chromium and matches Python\'s loss curve', async (t) => {
  const page = await browser.context.newPage();
  const errors = [];
  page.on('pageerror', (err) => errors.push(String(err)));
  await page.goto(`${server.url}/demo/index.html?auto=1`);
  await page.waitForFunction(() => window.demoResult || window.demoError, null, { timeout: 180000 });
  const error = await page.evaluate(() => window.demoError);
  assert.equal(error, undefined);
  assert.deepEqual(errors, []);
  const result = await page.evaluate(() => window.demoResult);
  const recipe = JSON.parse(fs.readFileSync(path.join(ARTIFACTS, 'digits', 'reference.json'), 'utf8'));
  const rel = maxRelDiff(result.losses, recipe.losses);
  t.diagnostic(`chromium (wasm): ${result.losses.length} training calls, max rel loss diff vs Python ${rel.toExponential(2)}, `
    + `accuracy ${result.accuracyBefore} -> ${result.accuracyAfter} (Python ${recipe.accuracy_before} -> ${recipe.accuracy_after}), ${result.stepsPerSecond.toFixed(1)} steps/s`);
  assert.equal(result.losses.length, recipe.losses.length);
  assert.ok(rel <= RTOL, `max rel diff ${rel}`);
  assert.ok(Math.abs(result.accuracyBefore - recipe.accuracy_before) <= 1 / 297);
  assert.ok(Math.abs(result.accuracyAfter - recipe.accuracy_after) <= 2 / 297);
  assert.ok(result.accuracyAfter > 0.9);
  const shot = path.join(JS_ROOT, 'build', 'demo.png');
  await page.screenshot({ path: shot, fullPage: true });
  await page.close();
});
