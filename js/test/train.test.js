// Training in Node from Python-generated artifacts matches Python's
// onnxtrain.api run on the same batches: per-call losses, learning rates,
// final weights, optimizer state and running statistics; what JS writes
// (checkpoint, inference model) reads back in Python.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import * as api from '../src/node.js';
import { maxRelDiff, replay } from '../demo/recipe.js';
import { ARTIFACTS, JS_ROOT, python } from '../scripts/artifacts.js';

const RTOL = 1e-5;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'onnxtrain-js-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function files(model) {
  const dir = path.join(ARTIFACTS, model);
  return {
    dir,
    checkpoint: path.join(dir, 'checkpoint'),
    training: path.join(dir, 'training_model.onnx'),
    eval: path.join(dir, 'eval_model.onnx'),
    optimizer: path.join(dir, 'optimizer_model.onnx'),
    recipe: JSON.parse(fs.readFileSync(path.join(dir, 'reference.json'), 'utf8')),
    data: new Uint8Array(fs.readFileSync(path.join(dir, 'data.bin'))).buffer,
  };
}

/** Largest |a - b| / max|b| of two arrays (bigint arrays compared exactly). */
function relToMax(a, b) {
  let scale = 1e-30;
  for (const v of b) scale = Math.max(scale, Math.abs(Number(v)));
  let worst = 0;
  for (let i = 0; i < b.length; i++) worst = Math.max(worst, Math.abs(Number(a[i]) - Number(b[i])) / scale);
  return worst;
}

const MODELS = {
  linear: { output: 'y', what: 'MSE, SGD, 2 batches accumulated per step' },
  mlp: { output: 'logits', what: 'cross-entropy, AdamW (weight decay), linear LR schedule' },
  cnn: { output: 'logits', what: 'Conv + BatchNorm in training mode, SGD' },
};

for (const [model, { output, what }] of Object.entries(MODELS)) {
  describe(`${model} (${what}) against Python's onnxtrain.api`, () => {
    const f = files(model);
    let run;
    const trained = async () => {
      run ??= await replay(api, f, f.recipe, f.data);
      return run;
    };

    it(`per-call losses within rel ${RTOL}`, async (t) => {
      const { losses, learningRates } = await trained();
      const rel = maxRelDiff(losses, f.recipe.losses);
      t.diagnostic(`${model}: ${losses.length} training calls, max rel loss diff vs Python ${rel.toExponential(2)}`);
      assert.equal(losses.length, f.recipe.losses.length);
      assert.ok(rel <= RTOL, `max rel diff ${rel}`);
      assert.deepEqual(learningRates, f.recipe.learning_rates);
    });

    it(`final weights, running statistics and optimizer state within rel ${RTOL}`, async (t) => {
      const { state, evalLoss } = await trained();
      const py = await api.CheckpointState.loadCheckpoint(path.join(f.dir, 'python_final.ckpt'));
      assert.deepEqual([...state.parameters.keys()], [...py.parameters.keys()]);
      let worst = 0;
      for (const [name, p] of py.parameters) {
        const mine = state.parameters.get(name);
        assert.deepEqual([mine.type, mine.shape], [p.type, p.shape], name);
        const rel = relToMax(mine.data, p.data);
        worst = Math.max(worst, rel);
        assert.ok(rel <= RTOL, `${name}: ${rel}`);
      }
      t.diagnostic(`${model}: max |js - python| / max|python| over the final parameters ${worst.toExponential(2)}`);
      const [jo, po] = [state.optimizerState, py.optimizerState];
      assert.equal(jo.step, po.step);
      assert.equal(jo.learningRate, po.learningRate);
      for (const [name, states] of Object.entries(po.states)) {
        for (const [key, value] of Object.entries(states)) {
          assert.ok(relToMax(jo.states[name][key], value) <= RTOL, `${name}.${key}`);
        }
      }
      assert.ok(maxRelDiff([evalLoss], [f.recipe.eval_loss]) <= RTOL, `eval loss ${evalLoss} vs ${f.recipe.eval_loss}`);
    });

    it('writes a checkpoint and an inference model that Python reads', async () => {
      const { state, module } = await trained();
      state.properties.set('epoch', 3).set('best', 0.25).set('whole', 2, 'float').set('tag', 'js-run');
      const ckpt = path.join(tmp, `${model}.ckpt`);
      const onnxPath = path.join(tmp, `${model}.onnx`);
      await api.CheckpointState.saveCheckpoint(state, ckpt, true);
      await module.exportModelForInferencing(onnxPath, [output]);
      const report = JSON.parse(python([path.join(JS_ROOT, 'scripts', 'crosscheck.py'), f.dir, ckpt, onnxPath]));
      for (const [name, rel] of Object.entries(report.parameters)) assert.ok(rel <= RTOL, `${name}: ${rel}`);
      for (const [name, rel] of Object.entries(report.states)) assert.ok(rel <= RTOL, `${name}: ${rel}`);
      assert.deepEqual(report.parameter_names, [...state.parameters.keys()]);
      assert.equal(report.step[0], report.step[1]);
      assert.equal(report.learning_rate[0], report.learning_rate[1]);
      assert.deepEqual(report.properties, {
        epoch: ['int', 3], best: ['float', 0.25], whole: ['float', 2], tag: ['str', 'js-run'],
      });
      assert.ok(report.logits <= RTOL, `logits ${report.logits}`);
      assert.deepEqual(report.inference_inputs, ['x']);
      assert.equal(report.inference_outputs[0][0], output);
      assert.equal(report.inference_outputs[0][1], 'tensor(float)');
      // and JS reads its own checkpoint back bit for bit
      const back = await api.CheckpointState.loadCheckpoint(ckpt);
      for (const [name, p] of state.parameters) assert.deepEqual(back.parameters.get(name).data, p.data);
      assert.equal(back.properties.type('whole'), 'float');
      assert.equal(back.optimizerState.learningRate, state.optimizerState.learningRate);
    });
  });
}

describe('gradient accumulation and lazy reset (linear)', () => {
  it('a second call adds to the gradient; after lazyResetGrad it overwrites', async () => {
    const f = files('linear');
    const { tensorOf } = await import('../demo/recipe.js');
    const state = await api.CheckpointState.loadCheckpoint(f.checkpoint);
    const module = await api.Module.create(f.training, state, f.eval);
    const [b0, b1] = f.recipe.batches.map((b) => b.map((r) => tensorOf(r, f.data)));
    assert.deepEqual(state.parameters.get('W').grad, new Float32Array(15));
    await module.run(...b0);
    const g0 = state.parameters.get('W').grad;
    await module.run(...b1);
    const g01 = state.parameters.get('W').grad;
    module.lazyResetGrad();
    await module.run(...b1);
    const g1 = state.parameters.get('W').grad;
    const sum = g0.map((v, i) => v + g1[i]);
    assert.ok(relToMax(g01, sum) <= 1e-6);
    assert.ok(relToMax(g1, g01) > 1e-3);
    // the same batch in eval mode: the loss of the same weights
    const trainLoss = (await module.run(...b1)).data[0];
    module.eval();
    assert.equal(module.training, false);
    assert.deepEqual(module.inputNames(), ['x', 'target']);
    const evalLoss = (await module.run({ x: b1[0], target: b1[1] })).data[0];
    assert.ok(Math.abs(evalLoss - trainLoss) <= 1e-6 * Math.abs(trainLoss));
    // the flat parameter buffer round trip
    const flat = module.getContiguousParameters();
    assert.equal(flat.dims[0], module.getParametersSize(false));
    module.copyBufferToParameters(flat.data.map((v) => v * 2));
    assert.deepEqual(state.parameters.get('B').data, flat.data.subarray(15).map((v) => v * 2));
  });
});

describe('calls in order, awaited or not (linear)', () => {
  it('runs, steps, lazy resets and eval runs keep their call order', async () => {
    const f = files('linear');
    const { tensorOf } = await import('../demo/recipe.js');
    const [b0] = f.recipe.batches.map((b) => b.map((r) => tensorOf(r, f.data)));
    const results = [];
    for (const awaited of [true, false]) {
      const state = await api.CheckpointState.loadCheckpoint(f.checkpoint);
      const module = await api.Module.create(f.training, state, f.eval);
      const optimizer = await api.Optimizer.create(f.optimizer, module);
      optimizer.setLearningRate(0.05);
      const calls = [];
      for (let k = 0; k < 3; k++) {
        for (const call of [() => module.run(...b0), () => optimizer.step(), () => module.lazyResetGrad()]) {
          if (awaited) await call(); else calls.push(call());
        }
      }
      module.eval();
      const loss = module.run(...b0);
      await Promise.all(calls);
      results.push({ loss: (await loss).data[0], W: state.parameters.get('W').data });
      await module.release();
      await assert.rejects(module.run(...b0), { name: 'Error', message: /released/ });
    }
    assert.equal(results[1].loss, results[0].loss);
    assert.deepEqual(results[1].W, results[0].W);
  });

  it('float16 inputs are cast by value, not by bit pattern', async () => {
    const f = files('linear');
    const { tensorOf } = await import('../demo/recipe.js');
    const [[x, target]] = f.recipe.batches.map((b) => b.map((r) => tensorOf(r, f.data)));
    const state = await api.CheckpointState.loadCheckpoint(f.checkpoint);
    const module = await api.Module.create(f.training, state, f.eval);
    module.eval();
    // values float16 holds exactly: 1.5, -0.25, 0, 2^-20 (subnormal), 3
    const exact = Float32Array.from(x.data, (_, i) => [1.5, -0.25, 0, 2 ** -20, 3][i % 5]);
    const bits = Uint16Array.from(exact, (v) => {
      if (v === 0) return 0;
      const sign = v < 0 ? 0x8000 : 0;
      const a = Math.abs(v);
      const e = Math.floor(Math.log2(a));
      if (e < -14) return sign | Math.round(a / 2 ** -24);
      return sign | ((e + 15) << 10) | Math.round((a / 2 ** e - 1) * 1024);
    });
    const asFloat32 = (await module.run({ type: 'float32', data: exact, dims: x.dims }, target)).data[0];
    const asHalf = (await module.run({ type: 'float16', data: bits, dims: x.dims }, target)).data[0];
    assert.equal(asHalf, asFloat32);
  });
});
