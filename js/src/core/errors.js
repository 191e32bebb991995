/**
 * A value that is not what it should be: a checkpoint breaking the format,
 * a state not matching a model, an input of the wrong shape, a learning
 * rate that is not a finite number >= 0. The counterpart of Python's
 * ValueError in `onnxtrain.api`; wrong types raise the built-in TypeError.
 */
export class ValueError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ValueError';
  }
}

/** A short readable rendering of any value for error messages. */
export function show(value) {
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'number' || value === undefined) return String(value);
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
