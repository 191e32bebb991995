// The onnxtrain checkpoint file (docs/checkpoint_format.md): a ZIP archive,
// entries stored uncompressed, of a JSON header and raw little-endian arrays.

import { unzipSync, zipSync } from 'fflate';
import { ValueError } from './errors.js';
import { ARRAYS, NUMPY_TO_ORT, ORT_TO_NUMPY, itemSize, sizeOf } from './dtypes.js';
import { fromHex, toHex } from './hexfloat.js';

export const FORMAT = 'onnxtrain.checkpoint';
export const VERSION = 1;
const HEADER = 'header.json';
/** A bound on the bytes of all the arrays of one checkpoint (1 TiB). */
export const MAX_BYTES = 2 ** 40;
/** The most dimensions an array record may have (numpy 2's limit). */
export const MAX_DIMS = 64;

/**
 * @typedef {object} ArrayValue
 * @property {string} type onnxruntime tensor type ('float32', 'int64'...)
 * @property {number[]} shape
 * @property {ArrayBufferView} data C order, a typed array of `ARRAYS[type]`
 */

/**
 * @typedef {object} CheckpointContent
 * @property {boolean} nominal
 * @property {Array<{name: string, value: ArrayValue, requiresGrad: boolean}>} parameters
 *   `value.data` is null in a nominal checkpoint
 * @property {Object<string,{type: 'int'|'float'|'str', value: number|string}>} properties
 * @property {{step: number, learningRate: number,
 *   states: Object<string, Object<string, ArrayValue>>}|null} optimizer
 */

function short(value, limit = 80) {
  let text;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length <= limit ? text : `${text.slice(0, limit - 3)}...`;
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const TYPE_CHECKS = {
  integer: (v) => typeof v === 'number' && Number.isInteger(v),
  'boolean (true or false)': (v) => typeof v === 'boolean',
  string: (v) => typeof v === 'string',
  array: Array.isArray,
  object: isObject,
};

class Reader {
  constructor(label, bytes) {
    this.label = label;
    this.bytes = bytes;
    this.infos = new Map();
    this.used = new Set();
    this.totalBytes = 0;
  }

  fail(field, message) {
    throw new ValueError(`${this.label}: checkpoint field ${field}: ${message}`);
  }

  entries() {
    const seen = new Map();
    let header = null;
    try {
      header = unzipSync(this.bytes, {
        filter: (info) => {
          seen.set(info.name, (seen.get(info.name) ?? 0) + 1);
          this.infos.set(info.name, info);
          return info.name === HEADER && seen.get(info.name) === 1;
        },
      })[HEADER];
    } catch (err) {
      throw new ValueError(`${this.label} is not an onnxtrain checkpoint (not a ZIP archive it can read: ${err.message}).`);
    }
    const twice = [...seen].filter(([, n]) => n > 1).map(([name]) => name).sort();
    if (twice.length) this.fail('archive', `entries ${short(twice)} appear more than once.`);
    for (const info of this.infos.values()) {
      const field = `archive entry ${JSON.stringify(info.name)}`;
      if (info.compression !== 0) {
        this.fail(field, 'is compressed; checkpoint entries are stored uncompressed.');
      }
      if (info.size !== info.originalSize || info.size > this.bytes.length) {
        this.fail(field, `declares ${info.originalSize} bytes, more than the file's ${this.bytes.length}.`);
      }
    }
    if (header === undefined) {
      throw new ValueError(`${this.label} has no ${HEADER}: not an onnxtrain checkpoint.`);
    }
    if (header.length !== this.infos.get(HEADER).size) {
      this.fail(HEADER, 'is truncated.');
    }
    return header;
  }

  header() {
    const bytes = this.entries();
    let header;
    try {
      header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
    } catch (err) {
      this.fail(HEADER, `is not valid JSON (${err.message}).`);
    }
    if (!isObject(header)) this.fail(HEADER, `is a JSON ${Array.isArray(header) ? 'array' : typeof header}, not an object.`);
    for (const key of ['format', 'version', 'nominal', 'parameters', 'properties']) {
      if (!(key in header)) this.fail(key, 'is missing.');
    }
    if (header.format !== FORMAT) {
      this.fail('format', `${short(header.format)} is not "${FORMAT}": not an onnxtrain checkpoint.`);
    }
    if (header.version !== VERSION) {
      this.fail('version', `${short(header.version)}: this onnxtrain reads version ${VERSION}.`);
    }
    return header;
  }

  typed(field, value, kind) {
    if (!TYPE_CHECKS[kind](value)) this.fail(field, `${short(value)} is not a JSON ${kind}.`);
    return value;
  }

  record(field, record, keys) {
    this.typed(field, record, 'object');
    for (const key of keys) if (!(key in record)) this.fail(`${field}.${key}`, 'is missing.');
    return record;
  }

  dtypeShape(field, record) {
    const dtype = this.typed(`${field}.dtype`, record.dtype, 'string');
    if (!Object.hasOwn(NUMPY_TO_ORT, dtype)) {
      this.fail(`${field}.dtype`, `${short(dtype)} is not one of ${short(Object.keys(NUMPY_TO_ORT).sort(), 200)}.`);
    }
    const shape = this.typed(`${field}.shape`, record.shape, 'array');
    if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      this.fail(`${field}.shape`, `${short(shape)} is not a list of non-negative integers.`);
    }
    if (shape.length > MAX_DIMS) {
      this.fail(`${field}.shape`, `${short(shape)} has ${shape.length} dimensions; numpy arrays have at most ${MAX_DIMS}.`);
    }
    const type = NUMPY_TO_ORT[dtype];
    const nbytes = itemSize(type) * sizeOf(shape);
    this.totalBytes += nbytes;
    if (this.totalBytes > MAX_BYTES) {
      this.fail(`${field}.shape`, `${short(shape)}: the arrays would take ${this.totalBytes} bytes, more than ${MAX_BYTES}.`);
    }
    return { type, shape: [...shape], nbytes };
  }

  array(field, record) {
    this.record(field, record, ['dtype', 'shape', 'data']);
    const { type, shape, nbytes } = this.dtypeShape(field, record);
    const name = this.typed(`${field}.data`, record.data, 'string');
    const info = this.infos.get(name);
    if (!info) this.fail(`${field}.data`, `no archive entry ${short(name)}.`);
    if (this.used.has(name) || name === HEADER) this.fail(`${field}.data`, `entry ${JSON.stringify(name)} is used twice.`);
    this.used.add(name);
    if (info.originalSize !== nbytes) {
      this.fail(`${field}.data`, `entry ${JSON.stringify(name)} has ${info.originalSize} bytes; shape ${JSON.stringify(shape)} of ${record.dtype} needs ${nbytes}.`);
    }
    return { type, shape, data: null, entry: name, field: `${field}.data`, nbytes };
  }

  hexFloat(field, value) {
    this.typed(field, value, 'string');
    const number = fromHex(value);
    if (number === null) this.fail(field, `${short(value)} is not a float written by float.hex.`);
    return number;
  }

  properties(header) {
    const records = this.typed('properties', header.properties, 'object');
    const out = {};
    for (const [key, rec] of Object.entries(records)) {
      const field = `properties[${JSON.stringify(key)}]`;
      this.record(field, rec, ['type', 'value']);
      const kinds = { int: 'integer', float: 'string', str: 'string' };
      if (typeof rec.type !== 'string' || !Object.hasOwn(kinds, rec.type)) {
        this.fail(`${field}.type`, `${short(rec.type)} is not 'int', 'float' or 'str'.`);
      }
      const value = this.typed(`${field}.value`, rec.value, kinds[rec.type]);
      if (rec.type === 'int' && !Number.isSafeInteger(value)) {
        this.fail(`${field}.value`, `${value} is beyond the integers JS numbers hold exactly (2^53).`);
      }
      out[key] = { type: rec.type, value: rec.type === 'float' ? this.hexFloat(`${field}.value`, value) : value };
    }
    return out;
  }

  parameters(header) {
    const nominal = this.typed('nominal', header.nominal, 'boolean (true or false)');
    const records = this.typed('parameters', header.parameters, 'array');
    const names = new Set();
    const parameters = records.map((rec, i) => {
      const field = `parameters[${i}]`;
      this.record(field, rec, ['name', 'dtype', 'shape', 'requires_grad', 'data']);
      const name = this.typed(`${field}.name`, rec.name, 'string');
      if (names.has(name)) this.fail(`${field}.name`, `${JSON.stringify(name)} appears twice.`);
      names.add(name);
      const requiresGrad = this.typed(`${field}.requires_grad`, rec.requires_grad, 'boolean (true or false)');
      let value;
      if (nominal) {
        if (rec.data !== null) this.fail(`${field}.data`, 'is not null in a nominal checkpoint.');
        const { type, shape } = this.dtypeShape(field, rec);
        value = { type, shape, data: null };
      } else {
        value = this.array(field, rec);
      }
      return { name, value, requiresGrad };
    });
    return { nominal, parameters };
  }

  optimizer(header, parameters, nominal) {
    const optimizer = header.optimizer ?? null;
    if (optimizer === null) return null;
    if (nominal) this.fail('optimizer', 'is not null in a nominal checkpoint.');
    this.record('optimizer', optimizer, ['step', 'learning_rate', 'states']);
    const step = this.typed('optimizer.step', optimizer.step, 'integer');
    if (step < 0) this.fail('optimizer.step', `${step} is negative.`);
    if (!Number.isSafeInteger(step)) this.fail('optimizer.step', `${step} is beyond the integers JS numbers hold exactly (2^53).`);
    const rate = this.hexFloat('optimizer.learning_rate', optimizer.learning_rate);
    if (!(Number.isFinite(rate) && rate >= 0)) {
      this.fail('optimizer.learning_rate', `${rate} is not a finite non-negative number.`);
    }
    const names = new Set(parameters.map((p) => p.name));
    const states = {};
    for (const [param, records] of Object.entries(this.typed('optimizer.states', optimizer.states, 'object'))) {
      const field = `optimizer.states[${JSON.stringify(param)}]`;
      if (!names.has(param)) this.fail(field, `${JSON.stringify(param)} is not a parameter.`);
      states[param] = {};
      for (const [state, rec] of Object.entries(this.typed(field, records, 'object'))) {
        states[param][state] = this.array(`${field}[${JSON.stringify(state)}]`, rec);
      }
    }
    return { step, learningRate: rate, states };
  }

  /** Reads every pending array (after the whole header was checked). */
  load(pending) {
    if (!pending.length) return;
    const wanted = new Set(pending.map((p) => p.entry));
    const files = unzipSync(this.bytes, { filter: (info) => wanted.has(info.name) });
    for (const p of pending) {
      const bytes = files[p.entry];
      if (!bytes || bytes.length !== p.nbytes) this.fail(p.field, `entry ${JSON.stringify(p.entry)} cannot be read (truncated).`);
      // fflate copies a stored entry into a buffer of its own (aligned);
      // anything else is copied so that the typed array can view it
      const copy = bytes.byteOffset % 8 === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes : bytes.slice();
      p.data = new ARRAYS[p.type](copy.buffer, copy.byteOffset, sizeOf(p.shape));
      delete p.entry;
      delete p.field;
      delete p.nbytes;
    }
  }
}

/**
 * Reads and validates a checkpoint (the rules of docs/checkpoint_format.md,
 * "What reading validates"; the whole header is checked before any array
 * is read).
 * @param {Uint8Array} bytes the file's content
 * @param {string} label names the file in errors
 * @returns {CheckpointContent}
 * @throws {ValueError} naming the file and the field
 */
export function readCheckpoint(bytes, label) {
  const reader = new Reader(label, bytes);
  const header = reader.header();
  const properties = reader.properties(header);
  const { nominal, parameters } = reader.parameters(header);
  const optimizer = reader.optimizer(header, parameters, nominal);
  const pending = nominal ? [] : parameters.map((p) => p.value);
  if (optimizer) for (const st of Object.values(optimizer.states)) pending.push(...Object.values(st));
  reader.load(pending);
  return { nominal, parameters, properties, optimizer };
}

/**
 * Serializes a checkpoint (the format Python's
 * `onnxtrain.api.CheckpointState.load_checkpoint` reads).
 * @param {CheckpointContent} content
 * @returns {Uint8Array}
 * @throws {TypeError} for an array of a type the format does not hold or a
 *   property that is not a finite int, a float or a string
 */
export function checkpointToBytes(content) {
  const files = {};
  let count = 0;
  const array = (value) => {
    if (!Object.hasOwn(ORT_TO_NUMPY, value.type)) {
      throw new TypeError(`A checkpoint stores bool, int and float arrays, not ${value.type}.`);
    }
    const entry = `arrays/${count++}.bin`;
    const d = value.data;
    files[entry] = [new Uint8Array(d.buffer, d.byteOffset, d.byteLength), { level: 0 }];
    return { dtype: ORT_TO_NUMPY[value.type], shape: [...value.shape], data: entry };
  };
  const parameters = content.parameters.map((p) => {
    const record = content.nominal
      ? { dtype: ORT_TO_NUMPY[p.value.type], shape: [...p.value.shape], data: null }
      : array(p.value);
    return { name: p.name, requires_grad: Boolean(p.requiresGrad), ...record };
  });
  const properties = {};
  for (const [key, { type, value }] of Object.entries(content.properties ?? {})) {
    if (type === 'int' && !Number.isSafeInteger(value)) {
      throw new TypeError(`Property ${JSON.stringify(key)}: ${value} is not an integer JS numbers hold exactly.`);
    }
    properties[key] = { type, value: type === 'float' ? toHex(value) : value };
  }
  let optimizer = null;
  if (content.optimizer && !content.nominal) {
    const opt = content.optimizer;
    optimizer = {
      step: opt.step,
      learning_rate: toHex(opt.learningRate),
      states: Object.fromEntries(Object.entries(opt.states).map(([p, st]) => [
        p, Object.fromEntries(Object.entries(st).map(([k, v]) => [k, array(v)]))])),
    };
  }
  const header = { format: FORMAT, version: VERSION, nominal: Boolean(content.nominal), parameters, properties, optimizer };
  files[HEADER] = [new TextEncoder().encode(JSON.stringify(header)), { level: 0 }];
  return zipSync(files, { level: 0 });
}
