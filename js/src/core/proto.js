// The few fields of ONNX's protobuf messages this package reads and writes:
// a model's metadata and graph inputs, and the inference model cut from an
// eval model. Fields it does not touch are carried over as their raw bytes,
// so nothing of the original model is lost or reinterpreted.

import { ValueError } from './errors.js';

const textDecoder = new TextDecoder();
const textEncoder = new TextEncoder();

/**
 * @typedef {object} Field
 * @property {number} no field number
 * @property {number} wire wire type (0 varint, 1 fixed64, 2 bytes, 5 fixed32)
 * @property {number} value the varint's value (wire 0; exact below 2^53)
 * @property {Uint8Array} bytes payload (wire 2), a view of the message
 * @property {Uint8Array} raw the whole field (tag included), a view
 */

/**
 * The fields of one protobuf message, in order.
 * @param {Uint8Array} buf
 * @param {string} what names the message in errors
 * @returns {Field[]}
 * @throws {ValueError} on a truncated or malformed message
 */
export function parseMessage(buf, what) {
  const fields = [];
  let pos = 0;
  const varint = () => {
    let result = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (pos >= buf.length) throw new ValueError(`${what}: truncated protobuf message.`);
      const byte = buf[pos++];
      result += (byte & 0x7f) * scale;
      scale *= 128;
      if (byte < 0x80) return result;
    }
    throw new ValueError(`${what}: malformed varint.`);
  };
  while (pos < buf.length) {
    const start = pos;
    const tag = varint();
    const no = Math.floor(tag / 8);
    const wire = tag % 8;
    const field = { no, wire, value: 0, bytes: null, raw: null };
    if (wire === 0) field.value = varint();
    else if (wire === 1) pos += 8;
    else if (wire === 5) pos += 4;
    else if (wire === 2) {
      const length = varint();
      if (pos + length > buf.length) throw new ValueError(`${what}: truncated protobuf message.`);
      field.bytes = buf.subarray(pos, pos + length);
      pos += length;
    } else throw new ValueError(`${what}: unsupported protobuf wire type ${wire}.`);
    if (pos > buf.length) throw new ValueError(`${what}: truncated protobuf message.`);
    field.raw = buf.subarray(start, pos);
    fields.push(field);
  }
  return fields;
}

const str = (field) => textDecoder.decode(field.bytes);
const first = (fields, no) => fields.find((f) => f.no === no);
const all = (fields, no) => fields.filter((f) => f.no === no);

/** Encodes protobuf fields (a tiny writer: varints, bytes, strings, raw). */
class Writer {
  constructor() {
    /** @type {Uint8Array[]} */
    this.parts = [];
  }

  varintBytes(value) {
    const out = [];
    let v = value;
    while (v >= 128) {
      out.push((v % 128) | 128);
      v = Math.floor(v / 128);
    }
    out.push(v);
    return Uint8Array.from(out);
  }

  varint(no, value) {
    this.parts.push(this.varintBytes(no * 8), this.varintBytes(value));
    return this;
  }

  bytes(no, data) {
    this.parts.push(this.varintBytes(no * 8 + 2), this.varintBytes(data.length), data);
    return this;
  }

  string(no, text) {
    return this.bytes(no, textEncoder.encode(text));
  }

  raw(data) {
    this.parts.push(data);
    return this;
  }

  finish() {
    const total = this.parts.reduce((n, p) => n + p.length, 0);
    const out = new Uint8Array(total);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

/** ONNX TensorProto.DataType -> onnxruntime-common tensor type. */
export const ELEM_TYPES = {
  1: 'float32', 2: 'uint8', 3: 'int8', 4: 'uint16', 5: 'int16', 6: 'int32',
  7: 'int64', 8: 'string', 9: 'bool', 10: 'float16', 11: 'float64',
  12: 'uint32', 13: 'uint64',
};
const ELEM_CODES = Object.fromEntries(Object.entries(ELEM_TYPES).map(([k, v]) => [v, Number(k)]));

/**
 * @typedef {object} ValueInfo
 * @property {string} name
 * @property {string|null} type onnxruntime tensor type ('float32'...), null
 *   for a non-tensor or an unknown element type
 * @property {Array<number|string|null>|null} shape null when undeclared;
 *   a number per static dim, a string per symbolic dim, null per unknown dim
 * @property {Uint8Array} raw the ValueInfoProto's bytes
 */

function valueInfo(bytes, what) {
  const fields = parseMessage(bytes, what);
  const name = first(fields, 1);
  const info = { name: name ? str(name) : '', type: null, shape: null, raw: bytes };
  const typeProto = first(fields, 2);
  const tensor = typeProto && first(parseMessage(typeProto.bytes, what), 1);
  if (!tensor) return info;
  const tfields = parseMessage(tensor.bytes, what);
  const elem = first(tfields, 1);
  info.type = elem ? ELEM_TYPES[elem.value] ?? null : null;
  const shape = first(tfields, 2);
  if (shape) {
    info.shape = all(parseMessage(shape.bytes, what), 1).map((dim) => {
      const d = parseMessage(dim.bytes, what);
      const value = first(d, 1);
      if (value && value.value > 0) return value.value;
      const param = first(d, 2);
      return param && param.bytes.length ? str(param) : null;
    });
  }
  return info;
}

/**
 * @typedef {object} ModelInfo
 * @property {Object<string,string>} metadata metadata_props
 * @property {ValueInfo[]} inputs graph inputs
 * @property {ValueInfo[]} outputs graph outputs
 * @property {Field[]} fields the ModelProto's fields
 * @property {Field[]} graph the GraphProto's fields
 */

/**
 * Metadata and graph inputs/outputs of an ONNX model.
 * @param {Uint8Array} bytes a serialized ModelProto
 * @param {string} what names the model in errors
 * @returns {ModelInfo}
 * @throws {ValueError} if the bytes are not an ONNX model with a graph
 */
export function readModel(bytes, what) {
  const fields = parseMessage(bytes, what);
  const graphField = first(fields, 7);
  if (!graphField || graphField.wire !== 2) {
    throw new ValueError(`${what} is not an ONNX model (no graph).`);
  }
  const graph = parseMessage(graphField.bytes, what);
  const metadata = {};
  for (const f of all(fields, 14)) {
    const entry = parseMessage(f.bytes, what);
    const key = first(entry, 1);
    const value = first(entry, 2);
    if (key) metadata[str(key)] = value ? str(value) : '';
  }
  return {
    metadata,
    inputs: all(graph, 11).map((f) => valueInfo(f.bytes, what)),
    outputs: all(graph, 12).map((f) => valueInfo(f.bytes, what)),
    fields,
    graph,
  };
}

/** Names a node reads: its inputs, and every name read inside its subgraphs
 * (a superset of their outer reads, enough to keep what they need). */
function nodeReads(fields, what) {
  const reads = new Set(all(fields, 1).map(str).filter((n) => n));
  for (const attr of all(fields, 5)) {
    const afields = parseMessage(attr.bytes, what);
    for (const g of [...all(afields, 6), ...all(afields, 11)]) {
      for (const node of all(parseMessage(g.bytes, what), 1)) {
        for (const name of nodeReads(parseMessage(node.bytes, what), what)) reads.add(name);
      }
    }
  }
  return reads;
}

/**
 * A TensorProto.
 * @param {string} name
 * @param {string} type onnxruntime tensor type
 * @param {number[]} dims
 * @param {ArrayBufferView} data values in C order (little-endian host)
 * @returns {Uint8Array}
 */
export function tensorProto(name, type, dims, data) {
  const w = new Writer();
  for (const d of dims) w.varint(1, d);
  w.varint(2, ELEM_CODES[type]);
  w.string(8, name);
  w.bytes(9, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  return w.finish();
}

/** A ValueInfoProto of a tensor. */
export function valueInfoProto(name, type, shape) {
  const tensor = new Writer().varint(1, ELEM_CODES[type]);
  if (shape) {
    const dims = new Writer();
    for (const d of shape) {
      const dim = new Writer();
      if (typeof d === 'number' && d >= 0) dim.varint(1, d);
      else if (typeof d === 'string' && d) dim.string(2, d);
      dims.bytes(1, dim.finish());
    }
    tensor.bytes(2, dims.finish());
  }
  const typeProto = new Writer().bytes(1, tensor.finish()).finish();
  return new Writer().string(1, name).bytes(2, typeProto).finish();
}

/**
 * The eval model's graph cut at `outputNames`, with `parameters` as
 * initializers (the semantics of Python's
 * `Module.export_model_for_inferencing`): the nodes the outputs need, the
 * graph inputs they read (parameters excluded), the original initializers
 * they read; ir_version, opset imports and functions kept; metadata dropped.
 * @param {ModelInfo} model the eval model
 * @param {string[]} paramNames the eval model's parameter inputs
 * @param {string[]} outputNames
 * @param {(name: string) => Uint8Array} initializer TensorProto of a parameter
 * @param {Object<string,Uint8Array>} outputInfos ValueInfoProto per output
 *   name not declared in the eval graph (as inferred by onnxruntime)
 * @returns {Uint8Array} the serialized ModelProto
 * @throws {ValueError} if an output name is not a value of the eval model
 */
export function inferenceModel(model, paramNames, outputNames, initializer, outputInfos = {}) {
  const what = 'eval model';
  const graph = model.graph;
  const nodes = all(graph, 1).map((f) => {
    const fields = parseMessage(f.bytes, what);
    return { raw: f.raw, outputs: all(fields, 2).map(str), fields };
  });
  const inits = all(graph, 5).map((f) => {
    const name = first(parseMessage(f.bytes, what), 8);
    return { raw: f.raw, name: name ? str(name) : '' };
  });
  const available = new Set([
    ...nodes.flatMap((n) => n.outputs), ...model.inputs.map((i) => i.name),
    ...inits.map((i) => i.name)]);
  const unknown = outputNames.filter((n) => !available.has(n));
  if (unknown.length) {
    throw new ValueError(`graphOutputNames ${JSON.stringify(unknown)} are not values of the eval model.`);
  }
  const needed = new Set(outputNames);
  const kept = [];
  for (let i = nodes.length - 1; i >= 0; i--) {
    if (nodes[i].outputs.some((o) => needed.has(o))) {
      kept.push(nodes[i]);
      for (const name of nodeReads(nodes[i].fields, what)) needed.add(name);
    }
  }
  kept.reverse();
  const params = new Set(paramNames);
  const nameField = first(graph, 2);
  const name = (nameField ? str(nameField) : '').replace('_eval', '') || 'inference';
  const g = new Writer();
  for (const node of kept) g.raw(node.raw);
  g.string(2, name);
  for (const init of inits) if (needed.has(init.name)) g.raw(init.raw);
  for (const p of paramNames) if (needed.has(p)) g.bytes(5, initializer(p));
  for (const f of all(graph, 11)) {
    const info = valueInfo(f.bytes, what);
    if (needed.has(info.name) && !params.has(info.name)) g.raw(f.raw);
  }
  const declared = new Map();
  for (const f of [...all(graph, 13), ...all(graph, 12), ...all(graph, 11)]) {
    const info = valueInfo(f.bytes, what);
    if (info.type && !declared.has(info.name)) declared.set(info.name, f.bytes);
  }
  for (const out of outputNames) {
    const bytes = declared.get(out) ?? outputInfos[out];
    g.bytes(12, bytes ?? new Writer().string(1, out).finish());
  }
  const m = new Writer();
  for (const f of model.fields) {
    if (f.no === 1 || f.no === 8 || f.no === 25) m.raw(f.raw);
  }
  m.string(2, 'onnxtrain');
  m.bytes(7, g.finish());
  return m.finish();
}

/** Names of the outputs of `inferenceModel`'s graph lacking a declared type. */
export function undeclaredOutputs(model, outputNames) {
  const graph = model.graph;
  const typed = new Set();
  for (const f of [...all(graph, 13), ...all(graph, 12), ...all(graph, 11)]) {
    const info = valueInfo(f.bytes, 'eval model');
    if (info.type) typed.add(info.name);
  }
  return outputNames.filter((n) => !typed.has(n));
}
