// Python's float.hex / float.fromhex for JS numbers (the checkpoint writes
// its floats so that they read back bit for bit).

const view = new DataView(new ArrayBuffer(8));

/**
 * `x` as Python's `float.hex(x)` writes it ('0x1.999999999999ap-4',
 * 'inf', '-0x0.0p+0').
 * @param {number} x
 * @returns {string}
 */
export function toHex(x) {
  if (Number.isNaN(x)) return 'nan';
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const sign = hi >>> 31 ? '-' : '';
  const biased = (hi >>> 20) & 0x7ff;
  const mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  if (biased === 0 && mantissa === 0n) return `${sign}0x0.0p+0`;
  const digits = mantissa.toString(16).padStart(13, '0');
  const lead = biased === 0 ? 0 : 1;
  const exp = biased === 0 ? -1022 : biased - 1023;
  return `${sign}0x${lead}.${digits}p${exp >= 0 ? '+' : ''}${exp}`;
}

const HEX = /^([+-])?(?:0x)?([0-9a-f]*)(?:\.([0-9a-f]*))?(?:p([+-]?\d+))?$/i;

/**
 * The number Python's `float.fromhex(text)` gives (rounded to nearest,
 * ties to even), or null when `text` is not in its syntax.
 * @param {string} text
 * @returns {number|null}
 */
export function fromHex(text) {
  const s = text.trim();
  const special = /^([+-])?(inf|infinity|nan)$/i.exec(s);
  if (special) {
    const value = special[2].toLowerCase() === 'nan' ? NaN : Infinity;
    return special[1] === '-' ? -value : value;
  }
  const m = HEX.exec(s);
  if (!m || (!m[2] && !m[3])) return null;
  const sign = m[1] === '-' ? -1 : 1;
  const frac = m[3] ?? '';
  let mant = BigInt(`0x${(m[2] || '') + frac || '0'}`);
  let exp = (m[4] ? Number(m[4]) : 0) - 4 * frac.length;
  if (mant === 0n) return sign * 0;
  // normalize to 54 bits (53 kept plus a rounding bit) with a sticky bit
  const bits = mant.toString(2).length;
  const top = exp + bits - 1; // exponent of the leading bit
  if (top > 1023) return sign * Infinity;
  const keep = top < -1022 ? 53 - (-1022 - top) : 53; // subnormals keep fewer
  if (keep <= 0) {
    // below half the smallest subnormal rounds to 0; above it rounds up
    const half = keep === 0 && mant > (1n << BigInt(bits - 1)) ? 1 : 0;
    return sign * half * 2 ** -1074;
  }
  const shift = bits - keep;
  if (shift > 0) {
    const rest = mant & ((1n << BigInt(shift)) - 1n);
    mant >>= BigInt(shift);
    exp += shift;
    const halfway = 1n << BigInt(shift - 1);
    if (rest > halfway || (rest === halfway && (mant & 1n))) mant += 1n;
  }
  // mant has at most 54 bits: exact as a Number; the scaling by 2**exp is
  // exact in two steps as long as the result is representable
  return sign * Number(mant) * 2 ** Math.max(exp, -1022) * 2 ** Math.min(0, exp + 1022);
}
