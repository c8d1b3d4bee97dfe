"""The registry of `TFDIST_*` variables (tfdist/env_vars.py): the only place the code names one."""

import ast
import os
import re

import pytest

from tfdist import env_vars

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
PACKAGE = os.path.join(ROOT, "tfdist")
NAME = re.compile(r"\bTFDIST_[A-Z0-9_]*[A-Z0-9]\b")


def _python_files():
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                yield body[0].value


def _code_strings_outside_the_registry():
    """("path:line", value) of every string constant in the package's code (docstrings and
    tfdist/env_vars.py aside)."""
    for path in _python_files():
        if os.path.basename(path) == "env_vars.py" and os.path.dirname(path) == PACKAGE:
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        docstrings = {id(node) for node in _docstrings(tree)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings):
                yield f"{os.path.relpath(path, ROOT)}:{node.lineno}", node.value


def test_no_module_but_the_registry_spells_a_variable_name_in_code():
    """Reading or setting a `TFDIST_*` variable goes through env_vars' declarations:
    a string in code (docstrings aside) that holds one fails here."""
    offenders = [f"{where}: {value!r}" for where, value in _code_strings_outside_the_registry()
                 if "TFDIST_" in value]
    assert not offenders, "use tfdist.env_vars instead:\n" + "\n".join(offenders)


def _mentions():
    sources = list(_python_files()) + [os.path.join(ROOT, p) for p in (
        "Makefile", "README.md", "scripts/install_horovod.sh", "scripts/install_mpi.sh",
        ".ci/run")]
    for folder in ("tests", "benchmarks", "examples", "scripts"):
        for path, _, files in os.walk(os.path.join(ROOT, folder)):
            if ".peer-venv" not in path:
                sources += [os.path.join(path, n) for n in files if n.endswith((".py", ".sh"))]
    docs = os.path.join(ROOT, "docs")
    for folder, _, files in os.walk(docs):
        sources += [os.path.join(folder, n) for n in files if n.endswith(".md")]
    for path in sources:
        if os.path.exists(path):
            with open(path) as f:
                for name in NAME.findall(f.read()):
                    yield name, os.path.relpath(path, ROOT)


def test_every_variable_mentioned_anywhere_is_declared():
    """A variable the library, a test, a benchmark, a script, the Makefile or a page names but
    the registry does not declare would be missing from the documentation's table."""
    undeclared = sorted({(name, where) for name, where in _mentions()
                         if name not in env_vars.BY_NAME})
    assert not undeclared, undeclared


def test_the_table_lists_every_variable_once_with_what_it_does():
    table = env_vars.markdown_table()
    for variable in env_vars.VARIABLES:
        assert table.count(f"| `{variable.name}` |") == 1, variable.name
        assert variable.meaning and variable.set_by and variable.type, variable
    assert len(env_vars.BY_NAME) == len(env_vars.VARIABLES)  # no name declared twice
    assert all(v.name.startswith(env_vars.PREFIX) for v in env_vars.VARIABLES)


@pytest.mark.parametrize("value, expected", [
    (None, False), ("", False), ("0", False), ("false", False), ("No", False), ("OFF", False),
    ("1", True), ("yes", True), ("true", True), ("2", True)])
def test_flags(value, expected):
    environ = {} if value is None else {env_vars.SHARE_GPUS.name: value}
    assert env_vars.SHARE_GPUS.flag(environ) is expected


def test_integers_name_the_variable_when_malformed():
    assert env_vars.NP.integer({}, default=1) == 1
    assert env_vars.NP.integer({"TFDIST_NP": " 4 "}) == 4
    with pytest.raises(ValueError, match="TFDIST_NP must be an integer. Got: 'four'"):
        env_vars.NP.integer({"TFDIST_NP": "four"})


def test_a_child_environment_without_tfdist_variables():
    assert env_vars.process_environment_without_tfdist(
        {"TFDIST_RANK": "1", "PATH": "/bin"}) == {"PATH": "/bin"}


# Prefixes of the variables other tools set that tfdist may read (launchers, TensorFlow, CUDA).
FOREIGN_NAME = re.compile(r"^(HOROVOD|SLURM|SLURMD|OMPI|PMI|PMIX|TF|CUDA|JOB|HOSTNAME|KUBERNETES)"
                          r"(_[A-Z0-9]+)*$")


def test_other_tools_variables_are_read_through_the_registry():
    """A launcher's or TensorFlow's variable (HOROVOD_RANK, SLURM_PROCID, TF_CONFIG, ...) is
    declared in `env_vars.Foreign` and spelled nowhere else in the library's code."""
    foreign = {variable.name for variable in env_vars.FOREIGN_VARIABLES}
    offenders = [f"{where}: {value!r}" for where, value in _code_strings_outside_the_registry()
                 if value in foreign or FOREIGN_NAME.match(value)]
    assert not offenders, "read through tfdist.env_vars.Foreign:\n" + "\n".join(offenders)
    assert all(not v.name.startswith(env_vars.PREFIX) for v in env_vars.FOREIGN_VARIABLES)
    assert len(foreign) == len(env_vars.FOREIGN_VARIABLES)
