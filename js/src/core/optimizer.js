// Optimizer (runs optimizer_model.onnx) and LinearLRScheduler
// (onnxtrain.api.Optimizer, onnxtrain.api.LinearLRScheduler).

import { ValueError, show } from './errors.js';
import { ARRAYS, sizeOf } from './dtypes.js';
import { createSession, loadArtifact, makeTensor } from './module.js';
import { OptimizerState } from './state.js';

export const OPTIMIZER_METADATA = 'onnxtrain.optimizer_model';

/**
 * `value` as a learning rate.
 * @throws {ValueError} unless a finite number >= 0 (0 is allowed: a warmup
 *   starts there)
 */
function checkRate(value, name) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new ValueError(`${name} must be a finite number >= 0, got ${show(value)}.`);
  }
  return value;
}

function checkStepCount(value, name) {
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new ValueError(`${name} must be an integer >= 0, got ${show(value)}.`);
  }
  return value;
}

/**
 * Updates the trainable parameters of a Module from their gradients by
 * running the optimizer model. Create with `await Optimizer.create(...)`.
 *
 * The optimizer state (step count, learning rate, per-parameter states such
 * as AdamW's exp_avg and exp_avg_sq) lives in the module's
 * CheckpointState (`optimizerState`): a state loaded from a checkpoint
 * saved with its optimizer state resumes where it stopped; a new one starts
 * at step 0 with learning rate 0.001 and zero states.
 */
export class Optimizer {
  /** Use `Optimizer.create`. */
  constructor(model, module, session) {
    this._model = model;
    this._layout = model.layout;
    this._module = module;
    this._session = session;
  }

  /**
   * @param {string|URL|Uint8Array|ArrayBuffer} optimizerModel
   *   optimizer_model.onnx (a path in Node, a URL in browsers, or bytes)
   * @param {import('./module.js').Module} module
   * @returns {Promise<Optimizer>}
   * @throws {ValueError} a model not written by generate_artifacts (or in
   *   onnxruntime's sequence layout), one updating a parameter the module
   *   does not train, or a saved optimizer state of another shape than its
   *   parameter (the state is left as it was)
   */
  static async create(optimizerModel, module) {
    const model = await loadArtifact(optimizerModel, OPTIMIZER_METADATA, 'optimizer model');
    const layout = model.layout;
    const trainable = new Set(module._models.train.layout.trainable);
    const extra = layout.parameters.filter((p) => !trainable.has(p));
    if (extra.length) {
      throw new ValueError(`The optimizer model ${model.label} updates ${JSON.stringify(extra)}, which the training model does not train (${JSON.stringify([...trainable].sort())}).`);
    }
    const state = module._state;
    const saved = state.optimizerState?.states ?? {};
    for (const name of layout.parameters) {
      const param = state.parameters.get(name);
      for (const key of layout.states) {
        const value = saved[name]?.[key];
        if (value && value.length !== sizeOf(param.shape)) {
          throw new ValueError(`Optimizer state ${JSON.stringify(key)} of ${JSON.stringify(name)} has ${value.length} elements; the parameter has shape ${JSON.stringify(param.shape)}.`);
        }
      }
    }
    const session = await createSession(model.bytes, module._sessionOptions);
    if (!state.optimizerState) state.optimizerState = new OptimizerState();
    const states = state.optimizerState.states;
    for (const name of layout.parameters) {
      const param = state.parameters.get(name);
      states[name] ??= {};
      for (const key of layout.states) states[name][key] ??= new ARRAYS[param.type](sizeOf(param.shape));
    }
    return new Optimizer(model, module, session);
  }

  get _state() {
    return this._module._state.optimizerState;
  }

  /**
   * Applies one update to every trainable parameter and increments the
   * step count (after the module's pending training calls).
   * @returns {Promise<void>}
   * @throws {Error} a parameter without a gradient (run the module in
   *   training mode first); a nominal state not loaded yet
   */
  step() {
    return this._module._serial(() => this._step());
  }

  async _step() {
    this._module._checkLoaded();
    const params = this._module._state.parameters;
    const opt = this._state;
    const layout = this._layout;
    const missing = layout.parameters.filter((n) => params.get(n)._grad === null);
    if (missing.length) {
      throw new Error(`Parameter ${JSON.stringify(missing[0])} has no gradient: run the module in training mode before step().`);
    }
    const feeds = {
      learning_rate: makeTensor('float64', Float64Array.of(opt.learningRate), []),
      step: makeTensor('int64', BigInt64Array.of(BigInt(opt.step + 1)), []),
    };
    const outputs = [];
    for (const name of layout.parameters) {
      const p = params.get(name);
      feeds[name] = makeTensor(p.type, p._value, p.shape);
      feeds[`${name}_grad`] = makeTensor(p.type, p._grad, p.shape);
      outputs.push(`${name}.updated`);
      for (const key of layout.states) {
        feeds[`${name}.${key}`] = makeTensor(p.type, opt.states[name][key], p.shape);
        outputs.push(`${name}.${key}.updated`);
      }
    }
    const out = await this._session.run(feeds, outputs);
    for (const name of layout.parameters) {
      params.get(name)._value = out[`${name}.updated`].data;
      for (const key of layout.states) opt.states[name][key] = out[`${name}.${key}.updated`].data;
    }
    opt.step += 1;
  }

  /**
   * Sets the learning rate of the next steps.
   * @param {number} learningRate finite and >= 0
   * @throws {ValueError} otherwise (the learning rate is left unchanged)
   */
  setLearningRate(learningRate) {
    this._state.learningRate = checkRate(learningRate, 'learningRate');
  }

  /** @returns {number} the current learning rate (0.001 by default) */
  getLearningRate() {
    return this._state.learningRate;
  }

  /** @returns {number} the number of steps taken */
  get stepCount() {
    return this._state.step;
  }

  /** Releases the onnxruntime session. */
  async release() {
    await this._session?.release?.();
  }
}

/**
 * Linear warmup then linear decay of the learning rate (HuggingFace's
 * get_linear_schedule_with_warmup): at optimizer step t the rate is
 * `initialLr * t / warmupStepCount` while t < warmupStepCount, then
 * `initialLr * max(0, (totalStepCount - t) / (totalStepCount - warmupStepCount))`.
 * The constructor sets the rate of the optimizer's current step; call
 * `step()` after each `optimizer.step()`.
 */
export class LinearLRScheduler {
  /**
   * @param {Optimizer} optimizer
   * @param {number} warmupStepCount integer >= 0
   * @param {number} totalStepCount integer >= warmupStepCount
   * @param {number} initialLr finite, >= 0
   * @throws {ValueError} for a step count that is not an integer >= 0,
   *   totalStepCount < warmupStepCount, or an initialLr that is not a
   *   finite number >= 0
   */
  constructor(optimizer, warmupStepCount, totalStepCount, initialLr) {
    const warmup = checkStepCount(warmupStepCount, 'warmupStepCount');
    const total = checkStepCount(totalStepCount, 'totalStepCount');
    checkRate(initialLr, 'initialLr');
    if (total < warmup) {
      throw new ValueError(`Expected 0 <= warmupStepCount <= totalStepCount, got warmupStepCount=${warmup}, totalStepCount=${total}.`);
    }
    this._optimizer = optimizer;
    this.warmupStepCount = warmup;
    this.totalStepCount = total;
    this.initialLr = initialLr;
    this.step();
  }

  /** @returns {number} the learning rate at optimizer step `step` */
  getLr(step) {
    if (step < this.warmupStepCount) return (this.initialLr * step) / this.warmupStepCount;
    const decay = this.totalStepCount - this.warmupStepCount;
    if (decay <= 0) return 0;
    return this.initialLr * Math.max(0, (this.totalStepCount - step) / decay);
  }

  /** Sets the optimizer's learning rate for its current step count. */
  step() {
    this._optimizer.setLearningRate(this.getLr(this._optimizer.stepCount));
  }
}
