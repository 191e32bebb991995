// CheckpointState: parameters, optimizer state and properties of a training
// (onnxtrain.api.CheckpointState).

import { ValueError } from './errors.js';
import { ARRAYS, sizeOf } from './dtypes.js';
import { checkpointToBytes, readCheckpoint } from './checkpoint.js';
import { runtime } from './runtime.js';

function copyOf(data) {
  return data.slice();
}

/**
 * One model parameter.
 *
 * `data` and `grad` are copies (typed arrays in C order of `shape`);
 * assigning `data` copies the new values in.
 */
export class Parameter {
  /**
   * @param {string} name
   * @param {string} type onnxruntime tensor type ('float32'...)
   * @param {number[]} shape
   * @param {ArrayBufferView|null} data `sizeOf(shape)` values (copied);
   *   null: a parameter of a nominal checkpoint, without a value yet
   * @param {boolean} [requiresGrad=true]
   */
  constructor(name, type, shape, data, requiresGrad = true) {
    this._name = String(name);
    this._type = type;
    this._shape = [...shape];
    /** @type {ArrayBufferView|null} */
    this._value = data === null ? null : copyOf(data);
    /** @type {ArrayBufferView|null} the accumulated gradient */
    this._grad = null;
    this._zeroGrad = false; // set by a Module that trains this parameter
    this._requiresGrad = Boolean(requiresGrad);
  }

  /** @returns {string} */
  get name() { return this._name; }

  /** @returns {string} onnxruntime tensor type ('float32', 'int64'...) */
  get type() { return this._type; }

  /** @returns {number[]} */
  get shape() { return [...this._shape]; }

  /** @returns {boolean} */
  get requiresGrad() { return this._requiresGrad; }

  /** @returns {boolean} whether the parameter holds a value (false for a
   * parameter of a nominal checkpoint until one is assigned) */
  get loaded() { return this._value !== null; }

  /**
   * A copy of the value.
   * @throws {Error} for a parameter of a nominal checkpoint not loaded yet
   */
  get data() {
    if (this._value === null) {
      throw new Error(`Parameter ${JSON.stringify(this._name)} comes from a nominal checkpoint: Please load the parameter states first.`);
    }
    return copyOf(this._value);
  }

  /**
   * Copies `value` in.
   * @param {ArrayLike<number|bigint>} value of `sizeOf(shape)` elements
   * @throws {ValueError} for another number of elements
   */
  set data(value) {
    const size = sizeOf(this._shape);
    if (!value || value.length !== size) {
      throw new ValueError(`Parameter ${JSON.stringify(this._name)} has shape ${JSON.stringify(this._shape)} (${size} elements); the new value has ${value?.length} elements.`);
    }
    this._value = ARRAYS[this._type].from(value);
  }

  /** A copy of the accumulated gradient; zeros before the first training
   * call of a Module training it, null for a parameter no module trains. */
  get grad() {
    if (this._grad === null) return this._zeroGrad ? new ARRAYS[this._type](sizeOf(this._shape)) : null;
    return copyOf(this._grad);
  }
}

/**
 * Properties of a state: string keys, values int, float or str. Types are
 * kept so that a checkpoint reads back as Python wrote it: `set` infers
 * 'int' for an integer number, 'float' for another number, 'str' for a
 * string, unless given.
 */
export class Properties {
  constructor(records = {}) {
    /** @type {Map<string,{type: string, value: number|string}>} */
    this._map = new Map(Object.entries(records));
  }

  /** @returns {number|string|undefined} */
  get(key) { return this._map.get(key)?.value; }

  /** @returns {'int'|'float'|'str'|undefined} */
  type(key) { return this._map.get(key)?.type; }

  has(key) { return this._map.has(key); }

  delete(key) { return this._map.delete(key); }

  keys() { return [...this._map.keys()]; }

  get size() { return this._map.size; }

  /**
   * @param {string} key
   * @param {number|string} value
   * @param {'int'|'float'|'str'} [type] default: inferred from the value
   * @throws {TypeError} a key that is not a string, a value of another
   *   type, an 'int' that is not a safe integer
   */
  set(key, value, type) {
    if (typeof key !== 'string') throw new TypeError(`Property names are strings, not ${typeof key}.`);
    const inferred = typeof value === 'string' ? 'str'
      : typeof value === 'number' ? (Number.isInteger(value) ? 'int' : 'float') : null;
    if (inferred === null) throw new TypeError(`Property ${JSON.stringify(key)}: values are numbers or strings, not ${typeof value}.`);
    const kind = type ?? inferred;
    if ((kind === 'str') !== (inferred === 'str') || !['int', 'float', 'str'].includes(kind)
        || (kind === 'int' && !Number.isSafeInteger(value))) {
      throw new TypeError(`Property ${JSON.stringify(key)}: ${JSON.stringify(value)} is not a valid ${kind}.`);
    }
    this._map.set(key, { type: kind, value });
    return this;
  }

  /** @returns {Object<string,{type: string, value: number|string}>} */
  records() { return Object.fromEntries(this._map); }
}

/** State of an Optimizer: step count, learning rate, per-parameter states
 * (`states[param][name]`: typed arrays of the parameter's shape). */
export class OptimizerState {
  constructor(step = 0, learningRate = 0.001, states = {}) {
    this.step = step;
    this.learningRate = learningRate;
    /** @type {Object<string, Object<string, ArrayBufferView>>} */
    this.states = Object.fromEntries(Object.entries(states).map(([p, s]) => [p, { ...s }]));
  }
}

/** Parameters (in checkpoint order), optimizer state and properties. */
export class CheckpointState {
  /**
   * @param {Parameter[]} parameters
   * @param {Properties} [properties]
   * @param {OptimizerState|null} [optimizerState]
   * @param {boolean} [nominal=false]
   */
  constructor(parameters, properties = new Properties(), optimizerState = null, nominal = false) {
    /** @type {Map<string, Parameter>} */
    this.parameters = new Map(parameters.map((p) => [p.name, p]));
    this.properties = properties;
    this.optimizerState = optimizerState;
    this.nominal = nominal;
  }

  /** Names of the parameters without a value (nominal checkpoint). */
  notLoaded() {
    return [...this.parameters.values()].filter((p) => !p.loaded).map((p) => p.name);
  }

  /**
   * Loads a checkpoint written by Python's `generate_artifacts` /
   * `save_checkpoint` or by `saveCheckpoint`.
   * @param {string|URL|Uint8Array|ArrayBuffer} source a path (Node), a URL
   *   (browser: fetched), or the file's bytes
   * @returns {Promise<CheckpointState>}
   * @throws {ValueError} if it is not a valid checkpoint (the message names
   *   the file and the field); the runtime's error if it cannot be read
   */
  static async loadCheckpoint(source) {
    const { bytes, label } = await runtime().read(source, 'checkpoint');
    return CheckpointState.fromBytes(bytes, label);
  }

  /**
   * A state from a checkpoint's bytes (see loadCheckpoint).
   * @param {Uint8Array} bytes
   * @param {string} [label='checkpoint'] names the file in errors
   */
  static fromBytes(bytes, label = 'checkpoint') {
    const content = readCheckpoint(bytes, label);
    const params = content.parameters.map((p) => new Parameter(p.name, p.value.type, p.value.shape,
      p.value.data, p.requiresGrad));
    let optimizer = null;
    if (content.optimizer) {
      const states = {};
      for (const [p, st] of Object.entries(content.optimizer.states)) {
        states[p] = Object.fromEntries(Object.entries(st).map(([k, v]) => [k, v.data]));
      }
      optimizer = new OptimizerState(content.optimizer.step, content.optimizer.learningRate, states);
    }
    return new CheckpointState(params, new Properties(content.properties), optimizer, content.nominal);
  }

  /**
   * The checkpoint file's bytes.
   * @param {CheckpointState} state
   * @param {boolean} [includeOptimizerState=false]
   * @returns {Uint8Array}
   * @throws {ValueError} includeOptimizerState without an optimizer state
   * @throws {Error} parameters of a nominal checkpoint not loaded yet
   */
  static toBytes(state, includeOptimizerState = false) {
    const missing = state.notLoaded();
    if (missing.length) {
      throw new Error(`Parameters ${JSON.stringify(missing.slice(0, 5))} come from a nominal checkpoint: Please load the parameter states first.`);
    }
    let optimizer = null;
    if (includeOptimizerState) {
      const opt = state.optimizerState;
      if (!opt) throw new ValueError('The state has no optimizer state: create an Optimizer for a Module of this state first.');
      const states = {};
      for (const [p, st] of Object.entries(opt.states)) {
        const param = state.parameters.get(p);
        states[p] = Object.fromEntries(Object.entries(st).map(([k, v]) => [k, { type: param.type, shape: param.shape, data: v }]));
      }
      optimizer = { step: opt.step, learningRate: opt.learningRate, states };
    }
    return checkpointToBytes({
      nominal: false,
      parameters: [...state.parameters.values()].map((p) => ({
        name: p.name, requiresGrad: p.requiresGrad, value: { type: p.type, shape: p.shape, data: p._value },
      })),
      properties: state.properties.records(),
      optimizer,
    });
  }

  /**
   * Writes `state` to a file (Node: a path, written to a new file beside it
   * then renamed over it, so a failing write leaves an existing checkpoint
   * as it was). In a browser, use `toBytes`.
   * @param {CheckpointState} state
   * @param {string|URL} uri
   * @param {boolean} [includeOptimizerState=false]
   * @returns {Promise<void>}
   * @throws as `toBytes`, before anything is written
   */
  static async saveCheckpoint(state, uri, includeOptimizerState = false) {
    const bytes = CheckpointState.toBytes(state, includeOptimizerState);
    await runtime().write(uri, bytes);
  }
}
