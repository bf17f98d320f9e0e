"""The house style, checked as CI runs the tests: ruff for the Python (pyproject's [tool.ruff]),
clang-format for the C (.clang-format), over every tracked source file, and a bound on a
module's length."""
import os
import subprocess

from tests.helpers import VENV_BIN, need

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A source module longer than this holds more than one concept: split it by concern.
MAX_MODULE_LINES = 700
SOURCE_TREES = ("shim", "cdi", "csrc", "cdi_shim_lab")     # (not tests/ or benchmarks/)


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", *patterns], cwd=TOP, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_python_passes_ruff():
    ruff = os.path.join(VENV_BIN, "ruff")
    assert os.access(ruff, os.X_OK), "ruff not installed: pip install -e '.[test]'"
    done = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", *tracked("*.py")],
                          cwd=TOP, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_c_is_formatted_by_clang_format():
    from shim.native_headers import HEADERS    # (generated: their generator's layout is checked instead)

    clang_format = need("clang-format-14", "clang-format-14")
    sources = [path for path in tracked("*.c", "*.h") if path not in HEADERS]
    assert len(sources) > 20
    done = subprocess.run([clang_format, "--dry-run", "-Werror", *sources], cwd=TOP, capture_output=True, text=True)
    assert done.returncode == 0, "run clang-format-14 -i on: " + " ".join(
        sorted({line.split(":")[0] for line in done.stderr.splitlines() if ": error:" in line}))


def test_no_source_module_over_the_line_bound():
    sources = [path for path in tracked(*SOURCE_TREES) if path.endswith((".py", ".c", ".h"))]
    assert len(sources) > 100
    over = []
    for path in sources:
        with open(os.path.join(TOP, path), "rb") as stream:
            lines = stream.read().count(b"\n")
        if lines > MAX_MODULE_LINES:
            over.append(f"{path} ({lines} lines)")
    assert not over, f"over {MAX_MODULE_LINES} lines, split by concern: " + ", ".join(sorted(over))


# A function longer than this does more than one thing: name its parts.
MAX_FUNCTION_LINES = 80
PRODUCT_TREES = ("shim", "cdi")     # (what users install; the lab and the tests are not bound)
# The memo and recipe machinery in Python: the recipes are written and read by C alone.
MEMO_FILES_MAX_LINES = 400


def test_no_product_function_over_the_bound():
    import ast

    over = []
    for path in tracked(*PRODUCT_TREES):
        if not path.endswith(".py"):
            continue
        with open(os.path.join(TOP, path), encoding="utf-8") as stream:
            tree = ast.parse(stream.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    assert not over, f"over {MAX_FUNCTION_LINES} lines, split into named parts: " + ", ".join(over)


def test_the_memo_and_recipe_python_is_small():
    names = [path for path in tracked(*PRODUCT_TREES) if path.endswith(".py")
             and any(word in os.path.basename(path) for word in ("memo", "recipe", "stepresult"))]
    assert names, "no memo or recipe module found: the test looks at nothing"
    lines = {}
    for path in names:
        with open(os.path.join(TOP, path), "rb") as stream:
            lines[path] = stream.read().count(b"\n")
    assert sum(lines.values()) <= MEMO_FILES_MAX_LINES, lines
