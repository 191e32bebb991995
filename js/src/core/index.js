// The runtime-independent API; src/node.js and src/web.js bind a runtime.
export { ValueError } from './errors.js';
export { CheckpointState, OptimizerState, Parameter, Properties } from './state.js';
export { Module } from './module.js';
export { LinearLRScheduler, Optimizer } from './optimizer.js';
export { readCheckpoint, checkpointToBytes } from './checkpoint.js';
export { setRuntime } from './runtime.js';
