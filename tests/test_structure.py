"""The package's structure: layers point down, importing patches nothing, Keras is checked."""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfdist"

# Lowest first. A module may import from its own layer and the layers below it. A module's
# layer is that of the longest prefix naming it, so a package may span layers (profiling:
# its TF-free names at the bottom, each other module beside the layer that uses it).
LAYERS = [
    ("tfdist._tf", "tfdist.private_surface", "tfdist.errors", "tfdist.chief_log",
     "tfdist.env_vars", "tfdist.versions",
     "tfdist.process_setup", "tfdist.fault_tolerance.restarts", "tfdist.cluster",
     "tfdist.profiling", "tfdist.profiling.names"),
    ("tfdist.comm",),
    ("tfdist.aggregation", "tfdist.compression", "tfdist.profiling.counters"),
    ("tfdist.fault_tolerance",),  # its collectives and the job's state injected (BackupJob)
    ("tfdist.runtime", "tfdist.simulation"),
    # tfdist.strategies, bottom to top: what reads Keras and the input's datasets; the step
    # and the state; the modes; the core; the Keras adapter (what patches Keras) on top of
    # them; the public strategies. An import upward between them fails here.
    ("tfdist.strategies.keras_surface", "tfdist.strategies.inputs"),
    ("tfdist.strategies.step", "tfdist.strategies.state"),
    ("tfdist.strategies.modes",),
    ("tfdist.strategies.core",),
    ("tfdist.strategies.keras_patches", "tfdist.profiling.report",
     "tfdist.profiling.rank_profiler"),
    ("tfdist.strategies", "tfdist.optimizers"),
    ("tfdist.callbacks",),
    ("tfdist.horovod",),
    ("tfdist.launch", "tfdist.server", "tfdist.profiling.timeline"),
]

# Modules that must import without TensorFlow (the launcher and the timeline's parsing use them).
TENSORFLOW_FREE = ("tfdist", "tfdist.cluster", "tfdist.process_setup.cluster",
                   "tfdist.comm.engines", "tfdist.env_vars",
                   "tfdist.process_setup.quiet_output", "tfdist.process_setup.startup_notices",
                   "tfdist.process_setup.slurm_hostlist", "tfdist.fault_tolerance.restarts",
                   "tfdist.profiling", "tfdist.profiling.names", "tfdist.profiling.timeline",
                   "tfdist.launch.cli", "tfdist.versions", "tfdist.private_surface")


def _layer(module):
    if module == "tfdist":
        return 0  # the package's lazy __init__ (it imports only quiet_output, TF-free)
    named = [(len(p), level) for level, prefixes in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    if not named:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it there")
    return max(named)[1]


def _is_module(name):
    parts = name.split(".")[1:]
    return (PACKAGE.joinpath(*parts).with_suffix(".py").is_file()
            or PACKAGE.joinpath(*parts, "__init__.py").is_file())


def _tfdist_imports(path):
    """Every tfdist module `path` imports, at the top or inside functions."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("tfdist"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdist"):
            # from tfdist import runtime, _tf / from tfdist.profiling import names: the modules
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if _is_module(submodule):
                    yield submodule
                elif node.module != "tfdist":  # not tfdist.__version__
                    yield node.module


def _imported_modules(path, modules):
    """The tfdist modules `path` imports: `from package import module` names the module."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdist"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in modules else node.module


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for imported in _tfdist_imports(path):
            if _layer(imported) > _layer(module):
                upward.append(f"{module} imports {imported}")
    assert not upward, "imports that point up: " + "; ".join(upward)


def test_no_module_imports_itself_through_others():
    """No import cycle anywhere in the package (function-local imports count too)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {module: {m for m in _imported_modules(path, modules) if m != module}
             for module, path in modules.items()}
    cycles = []
    for start in sorted(graph):  # a path back to `start`, depth first
        pending, seen = [(start, [start])], set()
        while pending:
            module, path = pending.pop()
            for imported in sorted(graph[module]):
                if imported == start:
                    cycles.append(" -> ".join(path + [start]))
                elif imported not in seen:
                    seen.add(imported)
                    pending.append((imported, path + [imported]))
    assert not cycles, "import cycles: " + "; ".join(sorted(set(cycles)))


@pytest.mark.launches  # a Python process (no training)
def test_importing_tfdist_patches_nothing_in_keras():
    """`import tfdist.callbacks` (and the strategies module) leave Keras untouched; `fit`
    replaces no `Layer.__call__` (a multi-rank custom loop's first step does: the empty-slice
    cases of test_keras_in_process.py need it), and a plain model's callback list is Keras'."""
    code = """
import keras
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TFEpochIterator
from keras.src.optimizers.base_optimizer import BaseOptimizer
before = (keras.callbacks.CallbackList.__init__, TFEpochIterator.__init__, BaseOptimizer.apply,
          keras.Model.save, keras.metrics.Mean.update_state)
import tfdist.callbacks, tfdist.strategies
after = (keras.callbacks.CallbackList.__init__, TFEpochIterator.__init__, BaseOptimizer.apply,
         keras.Model.save, keras.metrics.Mean.update_state)
assert before == after, "importing tfdist patched Keras"
tfdist.callbacks.LearningRateWarmup(warmup_epochs=1)
assert TFEpochIterator.__init__ is not before[1], "a tfdist LR callback records the data"
assert keras.callbacks.CallbackList.__init__ is before[0], "and patches nothing else"
layer_call = keras.layers.Layer.__call__
strategy = tfdist.strategies.RingAllReduceStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(tf.zeros((4, 2)), tf.zeros((4, 1)), epochs=1, verbose=0)
assert keras.layers.Layer.__call__ is layer_call, "fit needs no process-wide Layer.__call__"
plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
callbacks = keras.callbacks.CallbackList([], model=plain)
assert type(callbacks) is keras.callbacks.CallbackList, "a plain model's list is Keras' own"
strategy.run(tf.function(lambda x: model(x)), args=(tf.zeros((2, 2)),))
assert keras.layers.Layer.__call__ is layer_call, "one process: no slice is ever empty"
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0 and result.stdout.splitlines()[-1:] == ["ok"], \
        result.stderr[-3000:]


def test_a_changed_keras_internal_is_a_loud_error(monkeypatch):
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    from tfdist.strategies.keras_surface import compat

    assert compat._keras_changes() == []  # pylint: disable=protected-access

    def scale_loss(self, loss, extra):  # a signature Keras might change to
        return loss

    monkeypatch.setattr(BaseOptimizer, "scale_loss", scale_loss)
    monkeypatch.delattr(compat.GeneratorDataAdapter, "get_tf_dataset")
    with pytest.raises(ImportError, match=r"Keras 3\.\d+\.\S+ is installed and has changed what "
                       r"tfdist patches: BaseOptimizer\.scale_loss\(loss\); "
                       r"GeneratorDataAdapter\.get_tf_dataset"):
        compat.check_keras()


@pytest.mark.launches  # a Python process (no training)
@pytest.mark.parametrize("module", TENSORFLOW_FREE)
def test_light_modules_import_without_tensorflow(module):
    code = (f"import sys, {module}\n"
            "heavy = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
            "assert not heavy, heavy\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


# --- what the layers above use of strategy.extended (extended_interface) ----------------
_OWN_MODULES = ("strategies/data_parallel.py", "strategies/core/extended.py")


def _extended_members_used():
    """(path, member) of every `<...>.extended.<member>` read outside the strategy's modules."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path).endswith(_OWN_MODULES):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "extended"):
                yield path.relative_to(PACKAGE.parent), node.attr


def test_layers_above_use_only_the_declared_members_of_strategy_extended():
    from tfdist.strategies.core.extended_interface import MEMBERS  # pylint: disable=C0415

    used = set(_extended_members_used())
    assert {member for _, member in used} >= {"communicator", "aggregator", "updates",
                                              "input_mode", "placement"}
    undeclared = sorted((str(path), member) for path, member in used if member not in MEMBERS)
    assert not undeclared, ("strategy.extended members used but not declared in "
                            f"tfdist/strategies/core/extended_interface.py: {undeclared}")


def test_the_strategy_implementation_provides_the_declared_members():
    from tfdist.strategies.data_parallel import DataParallelExtended  # pylint: disable=C0415
    from tfdist.strategies.core.extended_interface import MEMBERS  # pylint: disable=C0415

    annotated = set().union(*(getattr(c, "__annotations__", {})
                              for c in DataParallelExtended.__mro__))
    assigned = {target.attr for node in ast.walk(ast.parse(
        (PACKAGE / "strategies" / "core" / "extended.py").read_text()))
        if isinstance(node, ast.Assign) for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
        and target.value.id == "self"}
    missing = [m for m in MEMBERS
               if not hasattr(DataParallelExtended, m) and m not in annotated | assigned]
    assert not missing, f"DataParallelExtended lacks {missing}"


# --- the modes: each one object behind a declared interface (strategies/modes) -----------
MODE_FLAGS = ("shard_optimizer_state", "per_rank_input", "asynchronous", "remote_updates")
# Where a flag may be named as code: the mode implementations, and the public constructors
# that take it (and the Horovod API's call of one); the cost model names the ring's option.
_MAY_NAME_A_FLAG = ("strategies/modes/", "strategies/ring.py", "strategies/tree.py",
                    "strategies/parameter_server.py", "strategies/data_parallel.py",
                    "horovod/process.py", "aggregation/recommend.py", "aggregation/ring.py")


def _flags_named(tree):
    """Line numbers where a mode flag is code: a name, an attribute, an argument, a keyword
    or a string subscript/key (not in docstrings or messages)."""
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else
                node.attr if isinstance(node, ast.Attribute) else
                node.arg if isinstance(node, (ast.arg, ast.keyword)) else None)
        if name in MODE_FLAGS:
            yield node.lineno, name
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and any(
                isinstance(a, ast.Constant) and a.value in MODE_FLAGS for a in node.args):
            yield node.lineno, "getattr"


def test_no_module_outside_a_mode_branches_on_its_flag():
    """A mode is an object chosen at construction (`strategies/modes`): nothing else reads a
    mode's flag."""
    found = [f"{path.relative_to(PACKAGE)}:{line} ({name})"
             for path in sorted(PACKAGE.rglob("*.py"))
             if not any(part in str(path.relative_to(PACKAGE)) for part in _MAY_NAME_A_FLAG)
             for line, name in _flags_named(ast.parse(path.read_text()))]
    assert not found, f"mode flags named outside their modes: {found}"


def test_the_flag_check_finds_a_branch():
    tree = ast.parse("if strategy.extended.per_rank_input:\n    pass\n"
                     "x = getattr(e, 'shard_optimizer_state', False)\n")
    assert [name for _, name in _flags_named(tree)] == ["per_rank_input", "getattr"]


def test_every_mode_provides_its_declared_interface():
    from tfdist.strategies import modes  # pylint: disable=C0415
    from tfdist.strategies.modes import interfaces  # pylint: disable=C0415

    implementations = {
        interfaces.InputMode: (modes.GlobalBatchInput, modes.PerRankInput),
        interfaces.Placement: (modes.ReplicatedOptimizerState,
                                        modes.ShardedOptimizerState),
        interfaces.UpdateMode: (modes.SynchronousUpdates, modes.AsynchronousUpdates),
    }
    assert set(implementations) == set(interfaces.INTERFACES)
    for interface, classes in implementations.items():
        for implementation in classes:
            missing = [m for m in interfaces.members(interface) if not hasattr(implementation, m)]
            assert not missing, f"{implementation.__name__} lacks {missing}"


def test_fault_tolerance_imports_nothing_above_it():
    above = [f"{_module_name(path)} imports {imported}"
             for path in sorted((PACKAGE / "fault_tolerance").rglob("*.py"))
             for imported in _tfdist_imports(path)
             if imported.startswith(("tfdist.strategies", "tfdist.runtime", "tfdist.callbacks",
                                     "tfdist.horovod", "tfdist.launch"))]
    assert not above, above


# --- the Keras surface (keras_surface/patch_points.py) ------------------------------------
_LIBRARY_MODULES = ("keras", "tf", "tensorflow", "keras_internals", "checkpoint_module")


def _class_or_module_assignments(path):
    """`Owner.attr = ...` and `setattr(Owner, ...)` where Owner is a class (a capitalized name
    anywhere in the dotted owner) or a Keras / TensorFlow module: what only
    `patch_points.replace` (Keras) and `_tf.replace` (TensorFlow) may do."""
    def dotted(node):
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        return names + [node.id] if isinstance(node, ast.Name) else []

    def is_owner(names):
        return bool(names) and (any(name[:1].isupper() for name in names)
                                or names[-1] in _LIBRARY_MODULES)

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and is_owner(dotted(target.value)):
                found.append(f"{path.name}:{node.lineno}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "setattr" and node.args and is_owner(dotted(node.args[0]))):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_keras_and_tensorflow_are_patched_only_at_the_declared_points():
    """Every replacement goes through patch_points (Keras) or _tf.replace (TensorFlow), both
    declared with the reason the library has no hook there; installing applies exactly the
    declared class-level Keras points, and the TensorFlow points replaced are declared."""
    from tfdist import _tf, private_surface
    from tfdist.strategies import keras_patches
    from tfdist.strategies.keras_surface import patch_points

    allowed = {PACKAGE / "strategies" / "keras_surface" / "patch_points.py", PACKAGE / "_tf.py"}
    stray = [where for path in sorted(PACKAGE.rglob("*.py")) if path not in allowed
             for where in _class_or_module_assignments(path)]
    assert not stray, f"Keras or TensorFlow attributes set outside the declared points: {stray}"
    keras_patches.install()
    assert patch_points.applied() - patch_points.on_demand() == patch_points.class_level()
    assert all(point.why for point in patch_points.POINTS + patch_points.OVERRIDES)
    declared = {(p.owner, p.name) for p in private_surface.TF_REPLACEMENTS}
    assert _tf.replaced() <= declared and all(p.why for p in private_surface.TF_REPLACEMENTS)
    calls = [(node.args[0].value, node.args[1].value)
             for path in sorted(PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "replace"
             and getattr(node.func.value, "id", None) == "_tf"]
    assert calls and set(calls) <= declared, calls


def test_a_stray_patch_is_found():
    path = PACKAGE.parent / "tests" / "scratch_stray_patch.py"
    try:
        path.write_text("import tensorflow as tf\ntf.nn.relu = abs\n"
                        "from keras.src import backend\nbackend.Variable.assign = None\n")
        assert len(_class_or_module_assignments(path)) == 2
    finally:
        path.unlink()


def _defined_in_tfdist():
    """Names tfdist itself defines: functions, classes, arguments, variables, self.<attrs>."""
    defined = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for part in ast.walk(target):
                        if isinstance(part, ast.Name):
                            defined.add(part.id)
                        elif (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                              and part.value.id in ("self", "cls")):
                            defined.add(part.attr)
    return defined


def _private_attributes_used(source, defined):
    """`obj._name` and `getattr(obj, "_name")` (hasattr, setattr) of names tfdist does not
    define: another library's private attributes."""
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Attribute):
            names = [node.attr]
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in
              ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names = [node.args[1].value]
        for name in names:
            if name.startswith("_") and not name.startswith("__") and name not in defined:
                yield node.lineno, name


def test_every_private_attribute_of_another_library_is_declared():
    from tfdist.private_surface import PRIVATE_ATTRIBUTES  # pylint: disable=C0415

    defined = _defined_in_tfdist()
    undeclared = sorted({f"{path.relative_to(PACKAGE)}:{line} {name}"
                         for path in PACKAGE.rglob("*.py")
                         for line, name in _private_attributes_used(path.read_text(), defined)
                         if name not in PRIVATE_ATTRIBUTES})
    assert not undeclared, ("private attributes of other libraries used but not declared in "
                            f"tfdist/private_surface.py: {undeclared}")
    assert all(use.why and use.access for use in PRIVATE_ATTRIBUTES.values())


def test_an_undeclared_private_attribute_is_found():
    found = list(_private_attributes_used(
        "model._compiled_trainable_state = 1\ngetattr(x, '_jit_compile')\n", set()))
    assert [name for _, name in found] == ["_compiled_trainable_state", "_jit_compile"]


def test_overrides_are_declared_and_keep_keras_signatures():
    """The subclasses tfdist gives a tfdist model's callback list and the user's
    BackupAndRestore override only declared Keras methods, with Keras' parameters."""
    import inspect  # pylint: disable=import-outside-toplevel

    from tfdist.strategies.keras_patches import backup, callback_list
    from tfdist.strategies.keras_surface import patch_points

    for owner, overrides in (("CallbackList", callback_list.MultiProcessHooks),
                             ("BackupAndRestore", backup.DistributedBackup)):
        point = next(p for p in patch_points.OVERRIDES if p.owner == owner)
        defined = {name for name, value in vars(overrides).items()
                   if callable(value) and not name.startswith("__")}
        assert defined == set(point.names), (owner, defined ^ set(point.names))
        keras_class = patch_points.owner_class(owner)
        for name in defined:
            assert (inspect.signature(getattr(overrides, name)).parameters.keys()
                    == inspect.signature(getattr(keras_class, name)).parameters.keys()), name


def test_a_keras_object_adopted_keeps_its_class_name_and_is_adopted_once():
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.strategies.keras_patches import backup
    from tfdist.strategies.keras_surface import patch_points

    class UsersBackup(keras.callbacks.BackupAndRestore):
        pass

    first, second = UsersBackup("/tmp/unused-a"), UsersBackup("/tmp/unused-b")
    for callback in (first, second, first):
        patch_points.adopt(callback, "BackupAndRestore", backup.DistributedBackup)
    assert type(first) is type(second) and type(first).__name__ == "UsersBackup"
    assert type(first).__mro__[1:3] == (backup.DistributedBackup, UsersBackup)
    assert patch_points.keras_class(first) is UsersBackup
    with pytest.raises(TypeError, match="is not a BackupAndRestore"):
        patch_points.adopt(keras.callbacks.History(), "BackupAndRestore",
                           backup.DistributedBackup)


def test_only_keras_internals_imports_private_keras_modules():
    """A renamed Keras internal is absorbed in one module (keras_surface/keras_internals.py)."""
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "keras_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(name == "keras.src" or name.startswith("keras.src.") for name in names):
                importers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not importers, f"keras.src imported outside keras_internals: {importers}"


def test_a_keras_internal_under_another_name_is_found_and_a_missing_one_named(monkeypatch):
    """Keras 3.16 renamed TensorFlowTrainer to Trainer: either spelling is taken; a name this
    Keras has under no spelling is check_keras's ImportError, not an AttributeError."""
    import types

    from tfdist.strategies.keras_surface import compat, keras_internals

    old = types.SimpleNamespace(TensorFlowTrainer="the 3.15 class")
    new = types.SimpleNamespace(Trainer="the 3.16 class", TensorFlowTrainer="an alias")
    monkeypatch.setattr(keras_internals, "_missing", [])
    assert keras_internals._attribute(old, "m", "Trainer", "TensorFlowTrainer") == "the 3.15 class"
    assert keras_internals._attribute(new, "m", "Trainer", "TensorFlowTrainer") == "the 3.16 class"
    assert keras_internals._attribute(types.SimpleNamespace(), "keras.src.x", "Gone") is None
    with pytest.raises(ImportError, match=r"has changed what tfdist patches: keras\.src\.x\.Gone"):
        compat.check_keras()
