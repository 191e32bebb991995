"""How many threads a session's operators use (onnxruntime's intra-op
thread pool).

onnxruntime sizes each session's pool to every core by default. Inside a
joblib worker process (``GridSearchCV(n_jobs=...)``, ``cross_validate``...)
that oversubscribes the machine: each of ``n_jobs`` workers would run
sessions of ``cpu_count()`` threads. joblib gives its loky and
multiprocessing workers a thread budget, ``cpu_count() // n_jobs`` (or
``parallel_config(inner_max_num_threads=...)``), through the environment
variables it sets for the native thread pools it knows (``OMP_NUM_THREADS``
first, see ``joblib._parallel_backends.PoolManagerMixin._prepare_worker_env``);
onnxruntime reads none of them, so onnxtrain does:

- ``n_threads=None`` in a joblib worker process: that budget;
- ``n_threads=None`` elsewhere: onnxruntime's default (every core);
- an int: that many threads, on every session the estimator builds
  (the one-thread rule for small fused steps,
  :data:`~onnxtrain.runtime.fused.SMALL_STEP_FLOPS`, applies only when
  ``n_threads`` is None).

:func:`session_threads` sets the count for the sessions created in a block
(estimators wrap ``fit`` and ``predict`` with it);
:func:`~onnxtrain.runtime.sessions.default_session_options` reads it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import multiprocessing
import numbers
import os

__all__ = ["session_threads", "current_session_threads", "requested_session_threads",
           "joblib_thread_budget", "check_n_threads", "resolve_n_threads",
           "with_session_threads", "session_spinning", "current_session_spinning",
           "SPINNING_VARIABLE"]

_THREADS = contextvars.ContextVar("onnxtrain_session_threads", default=None)
_SPINNING = contextvars.ContextVar("onnxtrain_session_spinning", default=None)

#: Environment variable turning the intra-op threads' spinning off for
#: every session of the process (and of joblib's worker processes, which
#: inherit it): ``0``, ``false``, ``no`` or ``off``.
SPINNING_VARIABLE = "ONNXTRAIN_SPINNING"


def joblib_thread_budget():
    """The thread budget joblib gave this process, or None outside a joblib
    worker process (the main process, a thread of joblib's 'threading'
    backend, which shares the process and gets no budget).

    Returns
    -------
    int or None
        ``OMP_NUM_THREADS`` as joblib set it in its worker (>= 1).
    """
    if multiprocessing.parent_process() is None:
        return None
    value = os.environ.get("OMP_NUM_THREADS", "")
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count >= 1 else None


def check_n_threads(n_threads, name="n_threads"):
    """Validate an ``n_threads`` parameter.

    Raises
    ------
    ValueError
        Not None nor an int >= 1 (bools refused).
    """
    if n_threads is None:
        return None
    if not isinstance(n_threads, numbers.Integral) or isinstance(n_threads, bool) \
            or n_threads < 1:
        raise ValueError(f"{name} must be None or an int >= 1, got {n_threads!r}.")
    return int(n_threads)


def resolve_n_threads(n_threads):
    """Threads of the sessions for the parameter ``n_threads``: the int
    given, else joblib's budget in a joblib worker, else None
    (onnxruntime's default)."""
    n_threads = check_n_threads(n_threads)
    return n_threads if n_threads is not None else joblib_thread_budget()


def current_session_threads():
    """The intra-op thread count for a session created now (None:
    onnxruntime's default): the innermost :func:`session_threads` block's,
    else joblib's budget in a joblib worker."""
    value = _THREADS.get()
    return value if value is not None else joblib_thread_budget()


def requested_session_threads():
    """The intra-op thread count the innermost :func:`session_threads` block
    asks for (an estimator's explicit ``n_threads``), or None when no block
    sets one: unlike :func:`current_session_threads`, joblib's budget is not
    taken, so callers can tell an explicit count from a default one."""
    return _THREADS.get()


@contextlib.contextmanager
def session_threads(n_threads):
    """Sessions created in this block use ``n_threads`` intra-op threads
    (None: see :func:`current_session_threads`)."""
    token = _THREADS.set(check_n_threads(n_threads))
    try:
        yield
    finally:
        _THREADS.reset(token)


def with_session_threads(method):
    """Decorate an estimator method: the sessions it creates use the
    estimator's ``n_threads``."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with session_threads(getattr(self, "n_threads", None)):
            return method(self, *args, **kwargs)
    return wrapper


def current_session_spinning():
    """Whether a session created now lets its intra-op threads spin between
    the kernels of a run: the innermost :func:`session_spinning` block's
    choice, else False when the environment variable
    :data:`SPINNING_VARIABLE` is ``0``, ``false``, ``no`` or ``off``, else
    True (:func:`~onnxtrain.runtime.sessions.default_session_options`)."""
    value = _SPINNING.get()
    if value is not None:
        return value
    setting = os.environ.get(SPINNING_VARIABLE, "").strip().lower()
    return setting not in ("0", "false", "no", "off")


@contextlib.contextmanager
def session_spinning(enabled):
    """Sessions created in this block let their intra-op threads spin
    between kernels (``enabled=True``) or sleep (False).

    Spinning is the default: it keeps a training step's thousands of short
    kernels from waiting for sleeping threads, but costs a core another
    process may need. The threads stop spinning when a run
    returns in either case, and graphs of fewer than
    :data:`~onnxtrain.runtime.sessions.SPIN_MIN_NODES` nodes never spin.
    """
    token = _SPINNING.set(bool(enabled))
    try:
        yield
    finally:
        _SPINNING.reset(token)
