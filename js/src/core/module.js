// Module: runs the training and eval models of generate_artifacts
// (onnxtrain.api.Module).

import { ValueError } from './errors.js';
import { ARRAYS, castArray, castsSameKind, kindOf, sizeOf, typeOfArray } from './dtypes.js';
import { inferenceModel, readModel, tensorProto, undeclaredOutputs, valueInfoProto } from './proto.js';
import { asBytes, runtime } from './runtime.js';

export const TRAINING_METADATA = 'onnxtrain.training_model';
export const EVAL_METADATA = 'onnxtrain.eval_model';

/**
 * A model's bytes and parsed layout.
 * @param {string|URL|Uint8Array|ArrayBuffer} source
 * @param {string} key metadata key of its layout
 * @param {string} what names the model in errors
 */
export async function loadArtifact(source, key, what) {
  const { bytes, label } = await runtime().read(source, what);
  const info = readModel(bytes, `${what} ${label}`);
  const text = info.metadata[key];
  if (text === undefined) {
    throw new ValueError(`The ${what} ${label} has no '${key}' metadata: it was not written by onnxtrain.artifacts.generate_artifacts.`);
  }
  return { bytes, label, info, layout: JSON.parse(text) };
}

/**
 * @param {Uint8Array} bytes
 * @param {object} [overrides] onnxruntime session options over the runtime's
 * @returns {Promise<object>} an onnxruntime InferenceSession
 */
export function createSession(bytes, overrides = {}) {
  const { ort, sessionOptions } = runtime();
  return ort.InferenceSession.create(bytes, { ...sessionOptions, ...overrides });
}

/** An onnxruntime Tensor of `type` over `data` (not copied). */
export function makeTensor(type, data, dims) {
  return new (runtime().ort.Tensor)(type, data, dims);
}

const FLOAT32_MAX = 3.4028234663852886e38;

/**
 * Checks user inputs against the model's declared inputs and makes them
 * onnxruntime tensors; every check runs before anything is run.
 * @returns {object[]} tensors, in `names` order
 */
function checkInputs(specs, names, values, what) {
  const sizes = new Map();
  const checked = names.map((name, i) => {
    const value = values[i];
    const data = value?.data;
    const dims = value?.dims;
    if (!value || !ArrayBuffer.isView(data) || !(Array.isArray(dims) || typeof dims?.length === 'number')) {
      throw new TypeError(`Input ${JSON.stringify(name)} of the ${what}: expected a tensor ({type, data: typed array, dims} or an onnxruntime Tensor); got ${value === null ? 'null' : typeof value}.`);
    }
    const shape = Array.from(dims);
    if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0) || sizeOf(shape) !== data.length) {
      throw new ValueError(`Input ${JSON.stringify(name)} of the ${what}: dims ${JSON.stringify(shape)} do not hold its ${data.length} values.`);
    }
    let type = value.type ?? typeOfArray(data);
    const spec = specs.get(name);
    let array = data;
    if (spec && spec.type && type !== spec.type) {
      if (!type || !castsSameKind(type, spec.type) || spec.type === 'float16') {
        throw new TypeError(`Input ${JSON.stringify(name)} of the ${what} is ${spec.type}; got ${type}, which is not cast to it (arrays are cast between floats, between ints, and from bool or int to float).`);
      }
      if (spec.type === 'float32' && kindOf(type) === 'f') {
        for (let k = 0; k < data.length; k++) {
          if (Number.isFinite(data[k]) && Math.abs(data[k]) > FLOAT32_MAX) {
            throw new ValueError(`Input ${JSON.stringify(name)} of the ${what} has values beyond the range of float32 (${data[k]}), which the cast to that input's type would turn into infinity.`);
          }
        }
      }
      array = castArray(data, spec.type, type);
      type = spec.type;
    }
    if (spec && spec.shape) {
      const expected = spec.shape;
      if (expected.length !== shape.length || expected.some((e, k) => typeof e === 'number' && e !== shape[k])) {
        throw new ValueError(`Input ${JSON.stringify(name)} of the ${what} has shape ${JSON.stringify(expected)}; got shape ${JSON.stringify(shape)}.`);
      }
      expected.forEach((dim, k) => {
        if (typeof dim !== 'string') return;
        const seen = sizes.get(dim);
        if (!seen) sizes.set(dim, [name, shape[k]]);
        else if (seen[1] !== shape[k]) {
          throw new ValueError(`Inputs ${JSON.stringify(seen[0])} and ${JSON.stringify(name)} of the ${what} share dimension ${JSON.stringify(dim)}; got sizes ${seen[1]} and ${shape[k]}.`);
        }
      });
    }
    return { name, type, array, shape };
  });
  checkBatch(specs, checked, what);
  return checked.map((c) => makeTensor(c.type, c.array, c.shape));
}

/** Inputs whose first dimension is not fixed agree on their rows (as
 * Python's check_batch), and no batch is empty. */
function checkBatch(specs, checked, what) {
  const seen = [];
  for (const { name, shape } of checked) {
    const expected = specs.get(name)?.shape;
    if (!expected || !expected.length || typeof expected[0] === 'number') continue;
    const rows = shape[0];
    if (rows === 0) throw new ValueError(`Input ${JSON.stringify(name)} of the ${what} has 0 rows: the loss of an empty batch is not defined.`);
    for (const [other, otherDim, otherRows] of seen) {
      const apart = typeof expected[0] === 'string' && typeof otherDim === 'string' && expected[0] !== otherDim;
      if (rows !== otherRows && !apart) {
        throw new ValueError(`Inputs ${JSON.stringify(other)} and ${JSON.stringify(name)} of the ${what} are batches of ${otherRows} and ${rows} rows: inputs whose first dimension is not fixed need the same number of rows (nothing is broadcast) unless the model names their first dimensions apart.`);
      }
    }
    seen.push([name, expected[0], rows]);
  }
}

/**
 * Trains and evaluates the model of a set of training artifacts.
 * Create with `await Module.create(...)`.
 */
export class Module {
  /** Use `Module.create`. */
  constructor(models, state, sessionOptions) {
    this._models = models; // mode -> {bytes, label, info, layout, session}
    this._state = state;
    this._sessionOptions = sessionOptions;
    this._training = true;
    this._resetGrad = true;
    this._queue = Promise.resolve(); // training calls and steps, one at a time
  }

  /**
   * @param {string|URL|Uint8Array|ArrayBuffer} trainModel training_model.onnx
   *   (a path in Node, a URL in browsers, or the file's bytes)
   * @param {import('./state.js').CheckpointState} state holds the
   *   parameters; the module reads and updates them
   * @param {string|URL|Uint8Array|ArrayBuffer|null} [evalModel=null]
   *   eval_model.onnx: needed by eval mode and exportModelForInferencing
   * @param {object} [options]
   * @param {object} [options.sessionOptions] onnxruntime session options
   *   (`intraOpNumThreads`, `executionProviders`...) over the entry
   *   point's defaults, for this module's sessions and its Optimizer's
   * @returns {Promise<Module>}
   * @throws {ValueError} if a model was not written by generate_artifacts,
   *   or the state lacks a parameter of a model or holds one of another
   *   shape or type (checked before any session is created)
   */
  static async create(trainModel, state, evalModel = null, { sessionOptions = {} } = {}) {
    const models = { train: await loadArtifact(trainModel, TRAINING_METADATA, 'training model') };
    if (evalModel !== null && evalModel !== undefined) {
      models.eval = await loadArtifact(evalModel, EVAL_METADATA, 'eval model');
    }
    for (const [mode, model] of Object.entries(models)) {
      model.specs = new Map(model.info.inputs.map((i) => [i.name, i]));
      checkParameters(state, mode, model);
    }
    for (const model of Object.values(models)) model.session = await createSession(model.bytes, sessionOptions);
    for (const name of models.train.layout.trainable) state.parameters.get(name)._zeroGrad = true;
    return new Module(models, state, sessionOptions);
  }

  /** Sets training mode (calls run the training model); returns this. */
  train(mode = true) {
    this._training = Boolean(mode);
    return this;
  }

  /** Sets eval mode (calls run the eval model); returns this. */
  eval() {
    return this.train(false);
  }

  /** @returns {boolean} whether the module is in training mode */
  get training() {
    return this._training;
  }

  /** @returns {import('./state.js').CheckpointState} */
  get state() {
    return this._state;
  }

  _mode() {
    if (this._training) return 'train';
    if (!this._models.eval) throw new Error('Eval mode needs the eval model: pass evalModel to Module.create.');
    return 'eval';
  }

  /** Names of the user inputs of the current mode's model (model inputs,
   * then the loss targets), in call order. */
  inputNames() {
    return [...this._models[this._mode()].layout.user_inputs];
  }

  /** Names of the outputs a call returns (the loss first). */
  outputNames() {
    return [...this._models[this._mode()].layout.user_outputs];
  }

  _parameters(trainableOnly) {
    const layout = this._models.train.layout;
    return (trainableOnly ? layout.trainable : layout.parameters).map((n) => this._state.parameters.get(n));
  }

  _checkLoaded() {
    const missing = this._state.notLoaded();
    if (missing.length) {
      throw new Error(`Please load the model parameters first. The checkpoint state is nominal: parameters ${JSON.stringify(missing.slice(0, 5))} have no values yet (copyBufferToParameters(buffer, false) loads them).`);
    }
  }

  /** Number of parameter elements. */
  getParametersSize(trainableOnly = true) {
    return this._parameters(trainableOnly).reduce((n, p) => n + sizeOf(p.shape), 0);
  }

  /**
   * All parameters flattened and concatenated in model order.
   * @param {boolean} [trainableOnly=false]
   * @returns {object} a 1-D onnxruntime Tensor (a copy)
   * @throws {TypeError} if the parameters have different types
   */
  getContiguousParameters(trainableOnly = false) {
    this._checkLoaded();
    const params = this._parameters(trainableOnly);
    const types = [...new Set(params.map((p) => p.type))];
    if (types.length > 1) throw new TypeError(`Parameters have several types ${JSON.stringify(types)}; they cannot share one buffer.`);
    const type = types[0] ?? 'float32';
    const out = new ARRAYS[type](this.getParametersSize(trainableOnly));
    let at = 0;
    for (const p of params) {
      out.set(p._value, at);
      at += p._value.length;
    }
    return makeTensor(type, out, [out.length]);
  }

  /**
   * Copies a flat buffer (as from getContiguousParameters) into the
   * parameters, in model order.
   * @param {object|ArrayBufferView} buffer a Tensor or a typed array
   * @param {boolean} [trainableOnly=true] false also loads the values of a
   *   state from a nominal checkpoint
   * @throws {ValueError} if the sizes differ (nothing is copied)
   */
  copyBufferToParameters(buffer, trainableOnly = true) {
    const flat = ArrayBuffer.isView(buffer) ? buffer : buffer?.data;
    const expected = this.getParametersSize(trainableOnly);
    if (!ArrayBuffer.isView(flat) || flat.length !== expected) {
      throw new ValueError(`The buffer has ${flat?.length} elements; the parameters have ${expected}.`);
    }
    let at = 0;
    for (const p of this._parameters(trainableOnly)) {
      const size = sizeOf(p.shape);
      p._value = ARRAYS[p.type].from(flat.subarray(at, at + size));
      at += size;
    }
  }

  /** The next training call overwrites the gradients instead of adding to
   * them (they are reset lazily, inside that call). Ordered after the
   * calls and steps already made, awaited or not.
   * @returns {Promise<void>} */
  lazyResetGrad() {
    return this._serial(() => { this._resetGrad = true; });
  }

  _serial(fn) {
    const result = this._queue.then(fn);
    this._queue = result.catch(() => {});
    return result;
  }

  /**
   * Runs the training model (train mode) or the eval model.
   *
   * Inputs are given in inputNames() order, or as one object
   * `{inputName: tensor}`. A tensor is an onnxruntime Tensor or
   * `{type, data, dims}` (type defaults to the typed array's); arrays are
   * cast to the input's type within their kind or to a wider one (float64
   * to float32, int to float; not float to int).
   *
   * In train mode each trainable parameter's gradient receives this call's
   * gradient, added to the previous one unless lazyResetGrad() was called;
   * BatchNormalization running statistics are updated in the state.
   *
   * @param {...object} inputs
   * @returns {Promise<object|object[]>} the outputs of outputNames()
   *   (onnxruntime Tensors; the loss first): one Tensor when there is one
   * @throws {ValueError} unknown or missing input names, a wrong number of
   *   inputs, a rank or static dimension other than the model's, inputs
   *   sharing a symbolic dimension with different sizes, batches of
   *   different rows or of 0 rows, float64 values beyond float32's range;
   *   shapes onnxruntime refuses while running
   * @throws {TypeError} a value that is not a tensor, or of a type not
   *   cast to the input's
   * @throws {Error} eval mode without an eval model; a nominal state
   * Every check runs before the model runs: the parameters and gradients
   * are left as they were when one fails.
   */
  async run(...inputs) {
    const mode = this._mode();
    this._checkLoaded();
    const model = this._models[mode];
    const names = model.layout.user_inputs;
    const what = mode === 'train' ? 'training model' : 'eval model';
    let values = inputs;
    if (inputs.length === 1 && names.length >= 1 && isNamedInputs(inputs[0])) {
      const given = Object.keys(inputs[0]);
      const unknown = given.filter((n) => !names.includes(n));
      const missing = names.filter((n) => !given.includes(n));
      if (unknown.length || missing.length) {
        throw new ValueError(`The ${what} takes inputs ${JSON.stringify(names)}; `
          + `${unknown.length ? `unknown input ${JSON.stringify(unknown)}` : ''}${unknown.length && missing.length ? ', ' : ''}`
          + `${missing.length ? `missing input ${JSON.stringify(missing)}` : ''}.`);
      }
      values = names.map((n) => inputs[0][n]);
    } else if (inputs.length !== names.length) {
      throw new ValueError(`The ${mode} model takes ${names.length} inputs ${JSON.stringify(names)}; got ${inputs.length}.`);
    }
    const tensors = checkInputs(model.specs, names, values, what);
    // in call order, awaited or not: an eval call reads the parameters the
    // steps made before it write
    return this._serial(() => (mode === 'train'
      ? this._runTraining(model, names, tensors, what)
      : this._runEval(model, names, tensors, what)));
  }

  async _runSession(model, feeds, outputs, names, tensors, mode) {
    if (this._released) throw new Error(`The module was released: create another to run the ${mode} model.`);
    try {
      return await model.session.run(feeds, outputs);
    } catch (err) {
      const shapes = names.map((n, i) => `${n} ${JSON.stringify(tensors[i].dims)}`).join(', ');
      throw new ValueError(`onnxruntime could not run the ${mode} model on inputs ${shapes}: ${String(err.message).split('\n')[0]}. The shapes of the inputs do not go together (e.g. a target whose columns differ from the prediction's) or an index is out of range (e.g. a class label >= the number of classes); parameters and gradients are unchanged.`);
    }
  }

  _paramFeeds(layout, feeds) {
    for (const name of layout.parameters) {
      const p = this._state.parameters.get(name);
      feeds[name] = makeTensor(p.type, p._value, p.shape);
    }
  }

  async _runEval(model, names, tensors, what) {
    const layout = model.layout;
    const feeds = Object.fromEntries(names.map((n, i) => [n, tensors[i]]));
    this._paramFeeds(layout, feeds);
    const out = await this._runSession(model, feeds, layout.user_outputs, names, tensors, 'eval');
    const results = layout.user_outputs.map((n) => out[n]);
    return results.length === 1 ? results[0] : results;
  }

  async _runTraining(model, names, tensors) {
    this._checkLoaded();
    const layout = model.layout;
    const feeds = Object.fromEntries(names.map((n, i) => [n, tensors[i]]));
    this._paramFeeds(layout, feeds);
    let reset = this._resetGrad;
    layout.trainable.forEach((name, i) => {
      const p = this._state.parameters.get(name);
      if (p._grad === null) reset = true;
      const grad = p._grad ?? new ARRAYS[p.type](sizeOf(p.shape));
      feeds[layout.buffers[i]] = makeTensor(p.type, grad, p.shape);
    });
    (layout.input_gradients ?? []).forEach((name, i) => {
      const input = feeds[name];
      feeds[layout.input_gradient_buffers[i]] = makeTensor(input.type, new ARRAYS[input.type](input.data.length), input.dims);
    });
    feeds[layout.lazy_reset_grad] = makeTensor('bool', Uint8Array.of(reset ? 1 : 0), []);
    const stats = Object.entries(layout.running_statistics ?? {});
    const outputs = [...layout.user_outputs, ...layout.gradients, ...stats.map(([, out]) => out)];
    const out = await this._runSession(model, feeds, outputs, names, tensors, 'train');
    layout.trainable.forEach((name, i) => {
      this._state.parameters.get(name)._grad = out[layout.gradients[i]].data;
    });
    for (const [name, output] of stats) this._state.parameters.get(name)._value = out[output].data;
    this._resetGrad = false;
    const results = layout.user_outputs.map((n) => out[n]);
    return results.length === 1 ? results[0] : results;
  }

  /**
   * An inference model: the eval model's graph cut at `graphOutputNames`,
   * with the current parameters as initializers.
   * @param {string|URL|null} uri where to write it (Node: a path); null:
   *   write nothing (in a browser, save the returned bytes yourself)
   * @param {string[]} graphOutputNames values of the eval model (typically
   *   the original model's outputs)
   * @returns {Promise<Uint8Array>} the serialized ModelProto
   * @throws {Error} without an eval model; a nominal state
   * @throws {ValueError} a name that is not a value of the eval model
   *   (nothing is written)
   */
  async exportModelForInferencing(uri, graphOutputNames) {
    const model = this._models.eval;
    if (!model) throw new Error('Exporting needs the eval model: pass evalModel to Module.create.');
    this._checkLoaded();
    const names = [...graphOutputNames];
    const params = model.layout.parameters;
    const initializer = (name) => {
      const p = this._state.parameters.get(name);
      return tensorProto(name, p.type, p.shape, p._value);
    };
    let bytes = inferenceModel(model.info, params, names, initializer);
    const untyped = undeclaredOutputs(model.info, names);
    if (untyped.length) {
      // the types onnxruntime infers for them, declared in the graph
      const session = await createSession(bytes);
      const infos = {};
      for (const meta of session.outputMetadata ?? []) {
        if (meta.isTensor && untyped.includes(meta.name)) {
          infos[meta.name] = valueInfoProto(meta.name, meta.type, meta.shape.map((d) => (typeof d === 'number' && d < 0 ? null : d)));
        }
      }
      await session.release?.();
      bytes = inferenceModel(model.info, params, names, initializer, infos);
    }
    if (uri !== null && uri !== undefined) await runtime().write(uri, bytes);
    return bytes;
  }

  /** Releases the onnxruntime sessions (after the pending calls); a later
   * call throws an Error. */
  async release() {
    return this._serial(async () => {
      this._released = true;
      for (const model of Object.values(this._models)) await model.session?.release?.();
    });
  }
}

function isNamedInputs(value) {
  return value !== null && typeof value === 'object' && !ArrayBuffer.isView(value.data)
    && !Array.isArray(value);
}

function checkParameters(state, mode, model) {
  for (const name of model.layout.parameters) {
    const param = state.parameters.get(name);
    if (!param) {
      throw new ValueError(`The checkpoint state has no parameter ${JSON.stringify(name)} needed by the ${mode} model ${model.label}.`);
    }
    const spec = model.specs.get(name);
    const shape = (spec?.shape ?? []).map((d) => d ?? 0);
    if (param.type !== spec?.type || shape.length !== param.shape.length || shape.some((d, i) => d !== param.shape[i])) {
      throw new ValueError(`Parameter ${JSON.stringify(name)} of the state is ${param.type} of shape ${JSON.stringify(param.shape)}; the ${mode} model ${model.label} expects ${spec?.type} of shape ${JSON.stringify(shape)}.`);
    }
  }
}

export { asBytes };
