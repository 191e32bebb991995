// Replays a training recipe of scripts/make_artifacts.py (batches, learning
// rates, accumulation) with the JS API: the same code in the Node tests and
// on the demo page, so both check the loss curve against Python's.

/**
 * The arrays of a recipe record, views of `data`.
 * @param {{dtype: string, shape: number[], offset: number, nbytes: number}} record
 * @param {ArrayBuffer} data the content of data.bin
 * @returns {{type: string, dims: number[], data: Float32Array|BigInt64Array}}
 */
export function tensorOf(record, data) {
  const Array = record.dtype === 'float32' ? Float32Array : BigInt64Array;
  return {
    type: record.dtype,
    dims: record.shape,
    data: new Array(data, record.offset, record.nbytes / Array.BYTES_PER_ELEMENT),
  };
}

/**
 * Accuracy of the inference model's logits (rows x classes) on int64 labels.
 * @returns {Promise<number>}
 */
export async function accuracy(ort, modelBytes, x, labels) {
  const session = await ort.InferenceSession.create(modelBytes);
  const out = await session.run({ [session.inputNames[0]]: new ort.Tensor(x.type, x.data, x.dims) });
  const logits = out[session.outputNames[0]];
  await session.release?.();
  const [rows, classes] = logits.dims;
  let right = 0;
  for (let r = 0; r < rows; r++) {
    let best = 0;
    for (let c = 1; c < classes; c++) if (logits.data[r * classes + c] > logits.data[r * classes + best]) best = c;
    if (BigInt(best) === labels.data[r]) right++;
  }
  return right / rows;
}

/**
 * Trains as the recipe says.
 * @param {object} api the package's exports (src/node.js or src/web.js)
 * @param {object} files `{checkpoint, training, eval, optimizer}`: paths,
 *   URLs or bytes of the artifacts
 * @param {object} recipe reference.json
 * @param {ArrayBuffer} data data.bin
 * @param {object} [options]
 * @param {(call: number, loss: number) => (void|Promise<void>)} [options.onCall]
 *   awaited after each training call
 * @param {(accuracyBefore: number|null) => (void|Promise<void>)} [options.onStart]
 *   awaited once the accuracy before training is known
 * @param {string} [options.outputName] the model output whose accuracy is
 *   measured (none: no accuracy)
 * @returns {Promise<object>} `{losses, learningRates, evalLoss, state,
 *   module, optimizer, seconds, accuracyBefore, accuracyAfter}`
 */
export async function replay(api, files, recipe, data, options = {}) {
  const state = await api.CheckpointState.loadCheckpoint(files.checkpoint);
  const module = await api.Module.create(files.training, state, files.eval);
  const optimizer = await api.Optimizer.create(files.optimizer, module);
  const evalX = tensorOf(recipe.eval[0], data);
  const evalY = tensorOf(recipe.eval[1], data);
  const measure = async () => (options.outputName
    ? accuracy(api.ort, await module.exportModelForInferencing(null, [options.outputName]), evalX, evalY)
    : null);
  const accuracyBefore = await measure();
  await options.onStart?.(accuracyBefore);
  optimizer.setLearningRate(recipe.learning_rate);
  const scheduler = recipe.schedule
    ? new api.LinearLRScheduler(optimizer, recipe.schedule[0], recipe.schedule[1], recipe.learning_rate)
    : null;
  const losses = [];
  const learningRates = [];
  const steps = recipe.batches.length / recipe.accumulate;
  const start = performance.now();
  let call = 0;
  for (let s = 0; s < steps; s++) {
    for (let a = 0; a < recipe.accumulate; a++) {
      const [x, y] = recipe.batches[call++];
      const loss = await module.run(tensorOf(x, data), tensorOf(y, data));
      losses.push(Number(loss.data[0]));
      await options.onCall?.(losses.length - 1, losses[losses.length - 1]);
    }
    learningRates.push(optimizer.getLearningRate());
    await optimizer.step();
    module.lazyResetGrad();
    scheduler?.step();
  }
  const seconds = (performance.now() - start) / 1000;
  module.eval();
  const evalLoss = Number((await module.run(evalX, evalY)).data[0]);
  module.train();
  const accuracyAfter = await measure();
  return { losses, learningRates, evalLoss, state, module, optimizer, seconds, steps, accuracyBefore, accuracyAfter };
}

/** The largest relative difference |a - b| / max(|b|, tiny) of two lists. */
export function maxRelDiff(a, b) {
  let worst = 0;
  for (let i = 0; i < b.length; i++) {
    const d = Math.abs(Number(a[i]) - Number(b[i])) / Math.max(Math.abs(Number(b[i])), 1e-30);
    worst = Math.max(worst, d);
  }
  return a.length === b.length ? worst : Infinity;
}
