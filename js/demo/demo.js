// The demo page: trains the digits CNN with onnxtrain-js on onnxruntime-web
// and draws the loss curve as it goes, against Python's reference curve.
import * as api from '../src/web.js';
import { maxRelDiff, replay } from './recipe.js';

const BASE = '../build/artifacts/digits/';
const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);

function draw(losses, reference) {
  const canvas = $('chart');
  const ctx = canvas.getContext('2d');
  const { width, height } = canvas;
  const pad = 80;
  ctx.clearRect(0, 0, width, height);
  ctx.font = '24px system-ui, sans-serif';
  ctx.fillStyle = '#555';
  const top = Math.max(...reference, ...losses) * 1.05;
  const x = (i) => pad + (i / (reference.length - 1)) * (width - 2 * pad);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  ctx.strokeStyle = '#999';
  ctx.lineWidth = 2;
  ctx.beginPath();
  ctx.moveTo(pad, pad / 2);
  ctx.lineTo(pad, height - pad);
  ctx.lineTo(width - pad / 2, height - pad);
  ctx.stroke();
  for (let t = 0; t <= top; t += 0.5) {
    ctx.fillText(t.toFixed(1), 16, y(t) + 8);
  }
  ctx.fillText('training call', width / 2 - 60, height - 8);
  for (let i = 0; i < reference.length; i += 25) ctx.fillText(String(i), x(i) - 10, height - pad + 30);
  const line = (values, color, width) => {
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.beginPath();
    values.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
    ctx.stroke();
  };
  // Python's curve wide and pale under the browser's, so both stay visible
  line(reference, '#ffbb78', 12);
  line(losses, '#1f77b4', 3);
}

async function main() {
  const recipe = await (await fetch(`${BASE}reference.json`)).json();
  const data = await (await fetch(`${BASE}data.bin`)).arrayBuffer();
  const files = {
    checkpoint: `${BASE}checkpoint`,
    training: `${BASE}training_model.onnx`,
    eval: `${BASE}eval_model.onnx`,
    optimizer: `${BASE}optimizer_model.onnx`,
  };
  draw([], recipe.losses);
  $('status').textContent = `Ready: ${recipe.batches.length} batches, learning rate ${recipe.learning_rate}.`;
  const train = async () => {
    $('train').disabled = true;
    $('status').textContent = 'Training…';
    const live = [];
    const result = await replay(api, files, recipe, data, {
      outputName: 'logits',
      onStart: (before) => {
        $('before').textContent = `${(100 * before).toFixed(1)}%`;
      },
      onCall: async (call, loss) => {
        live.push(loss);
        if (call % 10 === 9 && !params.has('nodraw')) {
          draw(live, recipe.losses);
          await new Promise((resolve) => setTimeout(resolve, 0)); // let the page paint
        }
      },
    });
    draw(result.losses, recipe.losses);
    const diff = maxRelDiff(result.losses, recipe.losses);
    $('before').textContent = `${(100 * result.accuracyBefore).toFixed(1)}%`;
    $('after').textContent = `${(100 * result.accuracyAfter).toFixed(1)}%`;
    $('speed').textContent = (result.steps / result.seconds).toFixed(0);
    $('diff').textContent = diff.toExponential(1);
    $('status').textContent = `Done: final loss ${result.losses.at(-1).toFixed(4)} (Python ${recipe.losses.at(-1).toFixed(4)}), eval loss ${result.evalLoss.toFixed(4)} on ${recipe.eval[0].shape[0]} held-out digits.`;
    $('train').disabled = false;
    window.demoResult = {
      losses: result.losses,
      reference: recipe.losses,
      maxRelDiff: diff,
      evalLoss: result.evalLoss,
      accuracyBefore: result.accuracyBefore,
      accuracyAfter: result.accuracyAfter,
      stepsPerSecond: result.steps / result.seconds,
      backend: 'wasm',
    };
  };
  $('train').disabled = false;
  $('train').onclick = () => train().catch(fail);
  if (params.has('auto')) await train();
}

function fail(err) {
  $('status').textContent = `Error: ${err.message}`;
  window.demoError = String(err.stack || err);
}

main().catch(fail);
