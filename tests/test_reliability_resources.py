"""Reliability: resources stay flat over many fits (issue 32, class 1).

An onnxruntime session owns a thread pool and memory; a reference cycle
holding one keeps them until a full collection of the cyclic garbage
collector, which a process may not run for hundreds of fits. So no
onnxtrain object may sit in a cycle (first test, every workload), and a
process running a workload 1,000 times keeps its threads, resident memory
and open files (second test, in a subprocess, without ``gc.collect()``).
"""
import gc
import json
import os
import subprocess
import sys

import pytest

import resource_scenarios as scenarios

HERE = os.path.dirname(os.path.abspath(__file__))


def _cyclic_garbage(run):
    """The objects made by ``run()`` that the cyclic collector finds after
    it (cycles only: reference counting frees everything else). Objects
    that existed before are left out: an earlier test's may become garbage
    meanwhile (caches, other threads)."""
    gc.unfreeze()  # an earlier test's frozen objects: counted as existing
    gc.collect()
    existing = {id(obj) for obj in gc.get_objects()}
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        found = [obj for obj in gc.garbage if id(obj) not in existing]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    return found


def _described(objects):
    names = set()
    for obj in objects:
        kind = type(obj)
        if kind.__module__.split(".")[0] in ("onnxtrain", "onnxruntime"):
            names.add(f"{kind.__module__}.{kind.__qualname__}")
        elif kind.__name__ == "function" and obj.__module__.startswith("onnxtrain"):
            names.add(f"function {obj.__module__}.{obj.__qualname__}")
    return sorted(names)


@pytest.mark.parametrize("kind", sorted(scenarios.SCENARIOS))
def test_no_reference_cycle(kind):
    scenario = scenarios.SCENARIOS[kind]
    scenario()  # the first run builds caches that live on (imports, artifacts)
    assert _described(_cyclic_garbage(scenario)) == []


@pytest.mark.parametrize("kind", sorted(scenarios.SCENARIOS))
def test_resources_flat_over_1000_runs(kind):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "resource_scenarios.py"), kind, "1000"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    before, after = usage["before"], usage["after"]
    assert after["threads"] <= before["threads"] + 8, usage
    assert after["fds"] <= before["fds"] + 8, usage
    assert after["rss"] <= 1.2 * before["rss"], usage
