// The checkpoint format in JS: what Python writes reads back exactly
// (parameters, optimizer state, typed properties), and a checkpoint that
// breaks a rule of docs/checkpoint_format.md is refused naming the field.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { strToU8, unzipSync, zipSync } from 'fflate';
import * as api from '../src/node.js';
import { fromHex, toHex } from '../src/core/hexfloat.js';
import { ARTIFACTS, python } from '../scripts/artifacts.js';

const pyFinal = path.join(ARTIFACTS, 'mlp', 'python_final.ckpt');

describe('checkpoints Python wrote', () => {
  it('read with typed properties, optimizer state and parameter order', async () => {
    const state = await api.CheckpointState.loadCheckpoint(pyFinal);
    assert.deepEqual([...state.parameters.keys()], ['0.weight', '0.bias', '2.weight', '2.bias']);
    assert.deepEqual(state.parameters.get('0.weight').shape, [16, 6]);
    assert.equal(state.parameters.get('0.weight').type, 'float32');
    assert.equal(state.properties.get('epoch'), 7);
    assert.equal(state.properties.type('epoch'), 'int');
    assert.equal(state.properties.get('best'), 0.1);
    assert.equal(state.properties.type('best'), 'float');
    assert.ok(Number.isNaN(state.properties.get('missing')));
    assert.equal(state.properties.get('name'), 'python');
    assert.equal(state.optimizerState.step, 18);
    assert.deepEqual(Object.keys(state.optimizerState.states['0.bias']), ['exp_avg', 'exp_avg_sq']);
    // the values Python holds, printed by Python
    const sums = JSON.parse(python(['-c', `
import json, sys
from onnxtrain import api
s = api.CheckpointState.load_checkpoint(sys.argv[1])
print(json.dumps({n: [float(p.data.astype('float64').sum()), p.data.ravel()[:3].tolist()] for n, p in s.parameters}))
`, pyFinal]));
    for (const [name, [sum, head]] of Object.entries(sums)) {
      const data = state.parameters.get(name).data;
      assert.deepEqual([...data.subarray(0, 3)], head, name);
      assert.ok(Math.abs(data.reduce((a, v) => a + v, 0) - sum) <= 1e-6 * Math.max(1, Math.abs(sum)), name);
    }
  });

  it('write back byte-identical values and header fields', async () => {
    const state = await api.CheckpointState.loadCheckpoint(pyFinal);
    const bytes = api.CheckpointState.toBytes(state, true);
    const entries = unzipSync(bytes);
    const header = JSON.parse(new TextDecoder().decode(entries['header.json']));
    const original = JSON.parse(new TextDecoder().decode(unzipSync(new Uint8Array(fs.readFileSync(pyFinal)))['header.json']));
    assert.deepEqual(header.properties, original.properties);
    assert.equal(header.optimizer.learning_rate, original.optimizer.learning_rate);
    assert.deepEqual(header.parameters.map(({ data, ...r }) => r), original.parameters.map(({ data, ...r }) => r));
    const back = api.CheckpointState.fromBytes(bytes);
    for (const [name, p] of state.parameters) assert.deepEqual(back.parameters.get(name).data, p.data);
  });
});

describe('float.hex', () => {
  it('formats and parses as Python does', () => {
    const cases = { 0.1: '0x1.999999999999ap-4', 1: '0x1.0000000000000p+0', 5e-324: '0x0.0000000000001p-1022', '-2.5': '-0x1.4000000000000p+1' };
    for (const [value, hex] of Object.entries(cases)) {
      assert.equal(toHex(Number(value)), hex);
      assert.equal(fromHex(hex), Number(value));
    }
    assert.equal(toHex(-0), '-0x0.0p+0');
    assert.ok(Object.is(fromHex('-0x0.0p+0'), -0));
    assert.equal(fromHex('inf'), Infinity);
    assert.equal(fromHex('0x1.00000000000008p+0'), 1); // a tie rounds to even
    assert.equal(fromHex('0x1.00000000000018p+0'), 1 + 2 ** -51);
    assert.equal(fromHex('0x1.8'), 1.5);
    assert.equal(fromHex('1e5'), 485); // hex digits, as in Python
    assert.equal(fromHex('0x1.0q3'), null);
  });
});

/** A checkpoint archive from header changes and entries (stored). */
function archive(change, entries = {}, level = 0) {
  const header = {
    format: 'onnxtrain.checkpoint', version: 1, nominal: false,
    parameters: [{ name: 'w', dtype: '<f4', shape: [2, 2], requires_grad: true, data: 'arrays/0.bin' }],
    properties: {},
    optimizer: null,
  };
  change(header);
  const files = { 'arrays/0.bin': [new Uint8Array(16), { level }], ...entries };
  files['header.json'] = [strToU8(JSON.stringify(header)), { level: 0 }];
  return zipSync(files, { level: 0 });
}

describe('checkpoints breaking the format', () => {
  const cases = {
    'not a ZIP archive': [() => strToU8('hello'), /bad\.ckpt is not an onnxtrain checkpoint \(not a ZIP archive/],
    'no header': [() => zipSync({ 'a.bin': new Uint8Array(2) }, { level: 0 }), /bad\.ckpt has no header\.json/],
    'a compressed entry': [() => archive(() => {}, {}, 6), /field archive entry "arrays\/0\.bin": is compressed/],
    'another format': [() => archive((h) => { h.format = 'x'; }), /field format: "x" is not "onnxtrain\.checkpoint"/],
    'another version': [() => archive((h) => { h.version = 2; }), /field version: 2: this onnxtrain reads version 1/],
    'a missing field': [() => archive((h) => { delete h.properties; }), /field properties: is missing/],
    'requires_grad not a boolean': [() => archive((h) => { h.parameters[0].requires_grad = 'false'; }), /field parameters\[0\]\.requires_grad: "false" is not a JSON boolean/],
    'an object dtype': [() => archive((h) => { h.parameters[0].dtype = '|O'; }), /field parameters\[0\]\.dtype: "\|O" is not one of/],
    'a big-endian dtype': [() => archive((h) => { h.parameters[0].dtype = '>f4'; }), /field parameters\[0\]\.dtype: ">f4" is not one of/],
    'a negative dimension': [() => archive((h) => { h.parameters[0].shape = [-1, 2]; }), /field parameters\[0\]\.shape: \[-1,2\] is not a list of non-negative integers/],
    'an entry of another size': [() => archive((h) => { h.parameters[0].shape = [3, 2]; }), /field parameters\[0\]\.data: entry "arrays\/0\.bin" has 16 bytes; shape \[3,2\] of <f4 needs 24/],
    'a missing entry': [() => archive((h) => { h.parameters[0].data = 'arrays/9.bin'; }), /field parameters\[0\]\.data: no archive entry "arrays\/9\.bin"/],
    'a huge nominal shape': [() => archive((h) => { h.nominal = true; h.parameters[0].data = null; h.parameters[0].shape = [1e6, 1e6]; }), /field parameters\[0\]\.shape: \[1000000,1000000\]: the arrays would take 4000000000000 bytes, more than 1099511627776/],
    'a duplicated name': [() => archive((h) => { h.parameters.push({ ...h.parameters[0] }); }), /field parameters\[1\]\.name: "w" appears twice/],
    'a negative learning rate': [() => archive((h) => { h.optimizer = { step: 1, learning_rate: '-0x1.0p+0', states: {} }; }), /field optimizer\.learning_rate: -1 is not a finite non-negative number/],
    'a learning rate not in float.hex': [() => archive((h) => { h.optimizer = { step: 1, learning_rate: 0.1, states: {} }; }), /field optimizer\.learning_rate: 0\.1 is not a JSON string/],
    'a state of no parameter': [() => archive((h) => { h.optimizer = { step: 1, learning_rate: '0x0p+0', states: { v: {} } }; }), /field optimizer\.states\["v"\]: "v" is not a parameter/],
    'an unknown property type': [() => archive((h) => { h.properties.k = { type: 'list', value: [] }; }), /field properties\["k"\]\.type: "list" is not 'int', 'float' or 'str'/],
  };
  for (const [what, [make, message]] of Object.entries(cases)) {
    it(`${what}: ValueError naming the file and the field`, () => {
      assert.throws(() => api.CheckpointState.fromBytes(make(), 'bad.ckpt'), { name: 'ValueError', message });
    });
  }

  it('Python refuses the same archives (one sample)', () => {
    const file = path.join(ARTIFACTS, 'bad-dtype.ckpt');
    fs.writeFileSync(file, archive((h) => { h.parameters[0].dtype = '|O'; }));
    const out = python(['-c', `
import sys
from onnxtrain import api
try:
    api.CheckpointState.load_checkpoint(sys.argv[1])
except ValueError as e:
    print(e)
`, file]);
    fs.rmSync(file);
    assert.match(out, /checkpoint field parameters\[0\]\.dtype: '\|O' is not one of/);
  });
});
