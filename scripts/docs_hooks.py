"""MkDocs hooks for tfdist's site (mkdocs.yml `hooks:`): pages made from the code, plots from the benchmarks.

* `{{ environment_variables }}` in a page becomes `tfdist.env_vars.markdown_table()`:
  the registry the code reads every `TFDIST_*` variable through;
* `{{ error_messages }}` becomes the catalog of every message tfdist raises, read
  from the package's source (`error_catalog`): each `raise SomeError("...")` whose
  message is a string or f-string, grouped by module, placeholders as `{expression}`;
* every PNG of `benchmarks/results/` and `experiments/results/` is published as
  `results/<name>.png`, so the Performance page shows the committed plots without
  copying them into `docs/`.

Nothing here imports TensorFlow: `make docs` takes seconds.
"""

import ast
import glob
import os

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tfdist")
RESULTS = (os.path.join(ROOT, "benchmarks", "results"),
           os.path.join(ROOT, "experiments", "results"))


def _message(node):
    """The message template of a raise's first argument: text, with {expression} for each
    formatted value; None when it is not a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _message(node.left), _message(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def raised_messages(package=PACKAGE):
    """[(module, function, exception, message)] for every literal message raised in `package`."""
    found = []
    for path in sorted(glob.glob(os.path.join(package, "**", "*.py"), recursive=True)):
        module = os.path.relpath(path, os.path.dirname(package))[:-3].replace(os.sep, ".")
        module = module.removesuffix(".__init__")
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        functions = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for child in ast.walk(node):
                    functions[id(child)] = node.name  # ast.walk goes outside in: innermost wins
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                    and node.exc.args):
                continue
            message = _message(node.exc.args[0])
            if message is None or not message.strip():
                continue
            exception = ast.unparse(node.exc.func)
            found.append((module, functions.get(id(node), "(module)"), exception,
                          " ".join(message.split())))
    return found


def error_catalog(package=PACKAGE):
    """Markdown: every raised message, grouped by module."""
    lines, current = [], None
    for module, function, exception, message in raised_messages(package):
        if module != current:
            current = module
            lines += ["", f"### `{module}`", ""]
        text = message.replace("`", "'")
        lines.append(f"- **{exception}** in `{function}`: `{text}`")
    return "\n".join(lines[1:]) + "\n"


def on_page_markdown(markdown, page, config, files):  # pylint: disable=unused-argument
    if "{{ environment_variables }}" in markdown:
        from tfdist import env_vars  # pylint: disable=import-outside-toplevel

        markdown = markdown.replace("{{ environment_variables }}", env_vars.markdown_table())
    if "{{ error_messages }}" in markdown:
        markdown = markdown.replace("{{ error_messages }}", error_catalog())
    return markdown


def on_files(files, config):
    for path in sorted(p for folder in RESULTS for p in glob.glob(os.path.join(folder, "*.png"))):
        files.append(File.generated(config, f"results/{os.path.basename(path)}",
                                    abs_src_path=path))
    return files
