// numpy dtype strings (the checkpoint's), onnxruntime tensor types (the
// runtime's) and the typed arrays holding them.

/** numpy dtype string -> onnxruntime tensor type. */
export const NUMPY_TO_ORT = {
  '|b1': 'bool', '|i1': 'int8', '|u1': 'uint8', '<i2': 'int16', '<u2': 'uint16',
  '<i4': 'int32', '<u4': 'uint32', '<i8': 'int64', '<u8': 'uint64',
  '<f2': 'float16', '<f4': 'float32', '<f8': 'float64',
};
/** onnxruntime tensor type -> numpy dtype string. */
export const ORT_TO_NUMPY = Object.fromEntries(
  Object.entries(NUMPY_TO_ORT).map(([k, v]) => [v, k]));

/** onnxruntime tensor type -> typed array class (bool and float16 as bytes
 * and 16-bit words, as onnxruntime-common holds them). */
export const ARRAYS = {
  bool: Uint8Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array,
  uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array,
  int64: BigInt64Array, uint64: BigUint64Array, float16: Uint16Array,
  float32: Float32Array, float64: Float64Array,
};

/** The kind of a tensor type, as numpy's: b, i, u or f. */
export function kindOf(type) {
  if (type === 'bool') return 'b';
  if (type.startsWith('float')) return 'f';
  if (type.startsWith('uint')) return 'u';
  return 'i';
}

/** Bytes per element. */
export function itemSize(type) {
  return ARRAYS[type].BYTES_PER_ELEMENT;
}

/** Elements of a shape (1 for rank 0). */
export function sizeOf(shape) {
  return shape.reduce((n, d) => n * d, 1);
}

/** The tensor type a typed array holds by default. */
export function typeOfArray(data) {
  const types = new Map([
    [Float32Array, 'float32'], [Float64Array, 'float64'], [Int32Array, 'int32'],
    [BigInt64Array, 'int64'], [BigUint64Array, 'uint64'], [Uint8Array, 'uint8'],
    [Int8Array, 'int8'], [Int16Array, 'int16'], [Uint16Array, 'uint16'],
    [Uint32Array, 'uint32']]);
  return types.get(data?.constructor) ?? null;
}

/**
 * Whether numpy's `can_cast(src, dst, 'same_kind')` holds: within a kind,
 * or to a wider kind (bool to anything, unsigned to signed or float, int
 * to float), never float to int.
 */
export function castsSameKind(src, dst) {
  if (src === dst) return true;
  const order = { b: 0, u: 1, i: 2, f: 3 };
  const a = kindOf(src);
  const b = kindOf(dst);
  if (a === b) return true;
  if (a === 'u' && b === 'i') return true;
  return order[a] < order[b] && !(a === 'i' && b === 'u');
}

/**
 * The values of `data` as a new typed array of `type` (numpy's astype).
 * @param {ArrayLike<number|bigint>} data
 * @param {string} type
 */
export function castArray(data, type, from = null) {
  const Out = ARRAYS[type];
  if (type === 'float16') throw new TypeError('Casting to float16 is not supported: pass a float16 tensor.');
  const big = Out === BigInt64Array || Out === BigUint64Array;
  const out = new Out(data.length);
  // float16 values are held as their 16-bit patterns: decoded, not copied
  const half = from === 'float16' && !(typeof Float16Array !== 'undefined' && data instanceof Float16Array);
  for (let i = 0; i < data.length; i++) {
    const v = half ? halfToNumber(data[i]) : data[i];
    out[i] = big ? BigInt(v) : (typeof v === 'bigint' ? Number(v) : v);
  }
  return out;
}

/** The number an IEEE 754 half-precision bit pattern encodes. */
export function halfToNumber(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24; // subnormal
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}
