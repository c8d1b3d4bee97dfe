"""Python's and NumPy's global random generators, one per thread while ranks are threads.

Separate processes each have their own `random` and `numpy.random` global
generators; the threads of one process share them. Simulated ranks
(`tfdist.simulation.simulate_processes`) run the same script in P
threads: each seeds the global generators (`keras.utils.set_random_seed`)
and draws from them (Keras' default seeds, shuffles), and shared
generators would interleave those draws by the scheduler's whim, so rank
0's model would start from other weights than the same script in one
process. Inside `per_thread()`, the module-level functions of `random`
and `numpy.random` (`seed`, `randint`, `shuffle`, `get_state`, ...) use the
calling thread's own generator, which starts as a copy of the process's
at the time the thread first draws; the main thread keeps the process's.

Not covered: TensorFlow's global seed and its eager op-seed sequence live
in TensorFlow's process-wide context (`tf.random.set_seed`); ranks that set
the same seed agree on it, but eager random ops without an op seed draw
from one shared sequence. Cost: one thread-local lookup per draw.
"""

import contextlib
import random
import threading
from typing import Any, Callable, Dict, Iterator, Tuple

import numpy as np

_PYTHON_FUNCTIONS = tuple(sorted(name for name in dir(random)
                                 if getattr(getattr(random, name), "__self__", None)
                                 is random._inst))  # pylint: disable=protected-access
_NUMPY_FUNCTIONS = tuple(sorted(
    {name for name in dir(np.random)
     if getattr(getattr(np.random, name), "__self__", None) is np.random.mtrand._rand}
    | {"seed", "get_state", "set_state", "sample", "ranf", "random_sample"}))

_lock = threading.Lock()
_depth = [0]
_saved: Dict[Tuple[str, str], Callable[..., Any]] = {}
_local = threading.local()


def _thread_generator(module: str) -> Any:
    """This thread's global generator of `module` ("random" or "numpy"): the process's in
    the main thread, else the thread's own, first a copy of the process's."""
    process: Any = (random._inst if module == "random"  # pylint: disable=protected-access
                    else np.random.mtrand._rand)
    if threading.current_thread() is threading.main_thread():
        return process
    generator: Any = getattr(_local, module, None)
    if generator is None:
        if module == "random":
            generator = random.Random()
            generator.setstate(process.getstate())
        else:
            generator = np.random.RandomState()
            generator.set_state(process.get_state())
        setattr(_local, module, generator)
    return generator


def _proxy(module: str, name: str) -> Callable[..., Any]:
    def proxy(*args: Any, **kwargs: Any) -> Any:
        return getattr(_thread_generator(module), name)(*args, **kwargs)
    proxy.__name__ = name
    return proxy


@contextlib.contextmanager
def per_thread() -> Iterator[None]:
    """Within the block, every thread draws from its own Python and NumPy global generator.

    Re-entrant; the module functions are restored when the outermost block ends.
    """
    with _lock:
        if _depth[0] == 0:
            for name in _PYTHON_FUNCTIONS:
                _saved[("random", name)] = getattr(random, name)
                setattr(random, name, _proxy("random", name))
            for name in _NUMPY_FUNCTIONS:
                if hasattr(np.random, name):
                    _saved[("numpy", name)] = getattr(np.random, name)
                    setattr(np.random, name, _proxy("numpy", name))
        _depth[0] += 1
    try:
        yield
    finally:
        with _lock:
            _depth[0] -= 1
            if _depth[0] == 0:
                for (module, name), function in _saved.items():
                    setattr(random if module == "random" else np.random, name, function)
                _saved.clear()

