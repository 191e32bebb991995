// Bad input gets a clear error naming the culprit, before anything is
// written: parameters, gradients, optimizer state and files stay as they were.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, beforeEach, describe, it } from 'node:test';
import * as api from '../src/node.js';
import { tensorOf } from '../demo/recipe.js';
import { ARTIFACTS } from '../scripts/artifacts.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'onnxtrain-js-errors-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

const dir = (model) => path.join(ARTIFACTS, model);
const linear = (file) => path.join(dir('linear'), file);
const recipe = JSON.parse(fs.readFileSync(linear('reference.json'), 'utf8'));
const data = new Uint8Array(fs.readFileSync(linear('data.bin'))).buffer;
const [x, target] = recipe.batches[0].map((r) => tensorOf(r, data));

/** Every parameter value, gradient and optimizer state, copied. */
function snapshot(state) {
  return {
    params: [...state.parameters.values()].map((p) => [p.name, p.data, p.grad]),
    optimizer: state.optimizerState && JSON.stringify({
      step: state.optimizerState.step,
      lr: state.optimizerState.learningRate,
      states: Object.entries(state.optimizerState.states).map(([k, v]) => [k, Object.entries(v).map(([n, a]) => [n, [...a]])]),
    }),
  };
}

describe('a checkpoint that does not match the training model', () => {
  it('names the missing parameter', async () => {
    const state = await api.CheckpointState.loadCheckpoint(path.join(dir('mlp'), 'checkpoint'));
    await assert.rejects(api.Module.create(linear('training_model.onnx'), state),
      { name: 'ValueError', message: /checkpoint state has no parameter "W" needed by the train model .*training_model\.onnx/ });
  });

  it('names the parameter of another shape, with both shapes', async () => {
    const state = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    state.parameters.set('B', new api.Parameter('B', 'float32', [4], new Float32Array(4)));
    await assert.rejects(api.Module.create(linear('training_model.onnx'), state),
      { name: 'ValueError', message: /Parameter "B" of the state is float32 of shape \[4\]; the train model .* expects float32 of shape \[3\]/ });
  });

  it('names a model that generate_artifacts did not write', async () => {
    const state = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    await assert.rejects(api.Module.create(linear('eval_model.onnx'), state),
      { name: 'ValueError', message: /training model .*eval_model\.onnx has no 'onnxtrain.training_model' metadata/ });
  });

  it('names an optimizer state of another shape than its parameter', async () => {
    const state = await api.CheckpointState.loadCheckpoint(path.join(dir('mlp'), 'python_final.ckpt'));
    state.optimizerState.states['0.bias'].exp_avg = new Float32Array(3);
    const module = await api.Module.create(path.join(dir('mlp'), 'training_model.onnx'), state);
    const before = snapshot(state);
    await assert.rejects(api.Optimizer.create(path.join(dir('mlp'), 'optimizer_model.onnx'), module),
      { name: 'ValueError', message: /Optimizer state "exp_avg" of "0.bias" has 3 elements; the parameter has shape \[16\]/ });
    assert.deepEqual(snapshot(state), before);
  });
});

describe('wrong inputs', () => {
  let state;
  let module;
  let optimizer;
  beforeEach(async () => {
    state = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    module = await api.Module.create(linear('training_model.onnx'), state, linear('eval_model.onnx'));
    optimizer = await api.Optimizer.create(linear('optimizer_model.onnx'), module);
    await module.run(x, target); // a gradient to keep
  });

  const cases = {
    'an unknown input name': [() => [{ x, labels: target }], 'ValueError', /takes inputs \["x","target"\]; unknown input \["labels"\], missing input \["target"\]/],
    'a missing input': [() => [x], 'ValueError', /takes 2 inputs \["x","target"\]; got 1/],
    'a wrong shape': [() => [{ ...x, dims: [16, 2, 5], data: new Float32Array(160) }, target], 'ValueError', /Input "x" of the training model has shape \["N",5\]; got shape \[16,2,5\]/],
    'a wrong static dimension': [() => [{ ...x, dims: [10, 4], data: new Float32Array(40) }, target], 'ValueError', /Input "x" of the training model has shape \["N",5\]; got shape \[10,4\]/],
    'batches of different rows': [() => [x, { ...target, dims: [7, 3], data: target.data.subarray(0, 21) }], 'ValueError', /Inputs "x" and "target" of the training model share dimension "N"; got sizes 8 and 7/],
    'dims not holding the values': [() => [{ ...x, dims: [8, 6] }, target], 'ValueError', /Input "x" of the training model: dims \[8,6\] do not hold its 40 values/],
    'not a tensor': [() => [x, [1, 2, 3]], 'TypeError', /Input "target" of the training model: expected a tensor/],
    'float64 beyond float32': [() => [{ type: 'float64', dims: x.dims, data: Float64Array.from(x.data, (v, i) => (i ? v : 1e39)) }, target], 'ValueError', /Input "x" .* beyond the range of float32/],
  };
  for (const [what, [inputs, name, message]] of Object.entries(cases)) {
    it(`${what}: ${name}, nothing changed`, async () => {
      const before = snapshot(state);
      await assert.rejects(module.run(...inputs()), { name, message });
      assert.deepEqual(snapshot(state), before);
      // the next call still accumulates onto the kept gradient
      const grad = state.parameters.get('W').grad;
      await module.run(x, target);
      assert.deepEqual(state.parameters.get('W').grad, grad.map((v) => 2 * v));
    });
  }

  it('float64 and int32 inputs are cast as numpy casts them', async () => {
    module.lazyResetGrad();
    const loss = (await module.run(x, target)).data[0];
    module.lazyResetGrad();
    const x64 = { type: 'float64', dims: x.dims, data: Float64Array.from(x.data) };
    assert.equal((await module.run(x64, target)).data[0], loss);
    module.lazyResetGrad();
    const ints = { type: 'int32', dims: x.dims, data: Int32Array.from(x.data, Math.round) };
    const rounded = { ...x, data: Float32Array.from(x.data, Math.round) };
    const expected = (await module.run(rounded, target)).data[0];
    module.lazyResetGrad();
    assert.equal((await module.run(ints, target)).data[0], expected);
  });

  it('floats for int labels: TypeError naming the input', async () => {
    const mlpState = await api.CheckpointState.loadCheckpoint(path.join(dir('mlp'), 'checkpoint'));
    const mlp = await api.Module.create(path.join(dir('mlp'), 'training_model.onnx'), mlpState);
    const labels = { type: 'float32', dims: [2], data: new Float32Array(2) };
    await assert.rejects(mlp.run({ type: 'float32', dims: [2, 6], data: new Float32Array(12) }, labels),
      { name: 'TypeError', message: /Input "labels" of the training model is int64; got float32, which is not cast to it/ });
  });

  it('eval mode without an eval model', async () => {
    const bare = await api.Module.create(linear('training_model.onnx'), state);
    bare.eval();
    await assert.rejects(bare.run(x, target), { message: /Eval mode needs the eval model/ });
    await assert.rejects(bare.exportModelForInferencing(path.join(tmp, 'no.onnx'), ['y']), { message: /Exporting needs the eval model/ });
    assert.equal(fs.existsSync(path.join(tmp, 'no.onnx')), false);
  });

  it('a learning rate that is not a finite number >= 0: ValueError, rate unchanged', () => {
    optimizer.setLearningRate(0.05);
    for (const bad of [NaN, Infinity, -Infinity, -0.1, '0.1', null, undefined, 1n]) {
      assert.throws(() => optimizer.setLearningRate(bad), { name: 'ValueError', message: /learningRate must be a finite number >= 0/ });
    }
    assert.equal(optimizer.getLearningRate(), 0.05);
    assert.throws(() => new api.LinearLRScheduler(optimizer, 2, 10, NaN), { name: 'ValueError', message: /initialLr must be a finite number >= 0, got NaN/ });
    assert.throws(() => new api.LinearLRScheduler(optimizer, 5, 2, 0.1), { name: 'ValueError', message: /warmupStepCount=5, totalStepCount=2/ });
    assert.throws(() => new api.LinearLRScheduler(optimizer, 1.5, 2, 0.1), { name: 'ValueError', message: /warmupStepCount must be an integer >= 0, got 1.5/ });
    assert.equal(optimizer.getLearningRate(), 0.05);
  });

  it('the scheduler follows HuggingFace\'s linear schedule', async () => {
    const scheduler = new api.LinearLRScheduler(optimizer, 2, 6, 0.1);
    const rates = [];
    for (let i = 0; i < 7; i++) {
      rates.push(optimizer.getLearningRate());
      await optimizer.step();
      scheduler.step();
    }
    assert.deepEqual(rates, [0, 0.05, 0.1, 0.1 * (3 / 4), 0.1 * (2 / 4), 0.1 * (1 / 4), 0]);
    assert.equal(optimizer.stepCount, 7);
  });

  it('an unknown output name to export: ValueError, no file', async () => {
    const file = path.join(tmp, 'bad.onnx');
    await assert.rejects(module.exportModelForInferencing(file, ['y', 'nope']),
      { name: 'ValueError', message: /graphOutputNames \["nope"\] are not values of the eval model/ });
    assert.equal(fs.existsSync(file), false);
  });

  it('saving the optimizer state of a state without one: ValueError, the file as it was', async () => {
    const fresh = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    const file = path.join(tmp, 'keep.ckpt');
    fs.writeFileSync(file, 'previous');
    await assert.rejects(api.CheckpointState.saveCheckpoint(fresh, file, true),
      { name: 'ValueError', message: /The state has no optimizer state/ });
    assert.equal(fs.readFileSync(file, 'utf8'), 'previous');
    assert.deepEqual(fs.readdirSync(tmp).filter((f) => f.endsWith('.partial')), []);
    await assert.rejects(api.CheckpointState.saveCheckpoint(fresh, path.join(tmp, 'no-such-dir', 'c.ckpt')), { code: 'ENOENT' });
  });

  it('a step before any training call names the parameter without a gradient', async () => {
    const fresh = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    const m = await api.Module.create(linear('training_model.onnx'), fresh);
    const o = await api.Optimizer.create(linear('optimizer_model.onnx'), m);
    await assert.rejects(o.step(), { message: /Parameter "W" has no gradient: run the module in training mode before step\(\)/ });
    assert.equal(o.stepCount, 0);
  });
});

describe('nominal checkpoint', () => {
  it('refuses to run until copyBufferToParameters(buffer, false) loads the values', async () => {
    const nominal = await api.CheckpointState.loadCheckpoint(linear('nominal_checkpoint'));
    assert.equal(nominal.nominal, true);
    assert.deepEqual(nominal.parameters.get('W').shape, [5, 3]);
    assert.throws(() => nominal.parameters.get('W').data, { message: /Please load the parameter states first/ });
    const module = await api.Module.create(linear('training_model.onnx'), nominal);
    await assert.rejects(module.run(x, target), { message: /Please load the model parameters first/ });
    assert.throws(() => api.CheckpointState.toBytes(nominal), { message: /come from a nominal checkpoint/ });
    assert.throws(() => module.copyBufferToParameters(new Float32Array(3), false), { name: 'ValueError', message: /The buffer has 3 elements; the parameters have 18/ });
    const full = await api.CheckpointState.loadCheckpoint(linear('checkpoint'));
    const reference = await api.Module.create(linear('training_model.onnx'), full);
    module.copyBufferToParameters(reference.getContiguousParameters(), false);
    assert.deepEqual((await module.run(x, target)).data, (await reference.run(x, target)).data);
  });
});
