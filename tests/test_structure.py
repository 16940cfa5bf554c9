"""The package's structure holds (issue #11): layers only point down, no module imports
another's private names, no import cycle between files, and compiling a template loads
neither torch nor transformers. Checked on the source itself, so a refactor that breaks a rule
fails here with the file and line."""

from __future__ import annotations

import ast
import functools
import gc
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qrun"

# Packages that must not import the runtime (they sit below it).
BELOW_RUNTIME = ("qrun.lang", "qrun.constraint", "qrun.regex", "qrun.backends")
# CPython's private regex parser: read in one module only.
SRE_READER = "qrun.regex.syntax"


@dataclass(frozen=True)
class Import:
    """One import statement's target: `module` (absolute) and, for `from m import x`, `name`."""

    source: str  # the importing module
    module: str
    name: str | None
    line: int


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def parse(path: Path) -> ast.Module:
    """The file's AST, parsed once per test process (the tests here walk the same files again
    and again, and only read the trees), with the cycle collector paused: CPython 3.11
    (before 3.11.9, gh-106905) keeps the AST constructor's recursion depth in state shared by
    every parse, so a collection run inside one (the finalizers of a previous test's garbage)
    can fail it with "AST constructor recursion depth mismatch" (seen after tests/runtime and
    tests/serve)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        if was_enabled:
            gc.enable()


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


@functools.cache
def imports(path: Path) -> tuple[Import, ...]:
    """Every import in the file, at any depth (inside functions and TYPE_CHECKING too)."""
    return tuple(_walk_imports(path))


def _walk_imports(path: Path) -> Iterator[Import]:
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(source, base, alias.name, node.lineno)


def test_layers_below_the_runtime_do_not_import_it() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun") for i in imports(path)
           if i.source.startswith(BELOW_RUNTIME) and i.module.startswith("qrun.runtime")]
    assert bad == []


# Modules a llama.cpp run goes through: the runtime works on numpy arrays (logits, masks,
# the random generator), so `--backend llamacpp` starts without importing torch.
TORCH_FREE = ("qrun.runtime", "qrun.api", "qrun.cli", "qrun.backends.base",
              "qrun.backends.prefix_cache", "qrun.backends.kv_cache", "qrun.constraint",
              "qrun.backends.llamacpp", "qrun.backends.llamacpp_api",
              "qrun.backends.llama_threads")


def test_the_runtime_and_the_llamacpp_path_do_not_import_torch() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun") for i in imports(path)
           if i.source.startswith(TORCH_FREE) and i.module.split(".")[0] == "torch"]
    assert bad == []


def test_the_regex_engine_imports_nothing_else_of_qrun() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun/regex") for i in imports(path)
           if i.module.startswith("qrun") and not i.module.startswith("qrun.regex")]
    assert bad == []


# The constraint core (issue #24) sits below the language, the runtime and the backends: what
# a constraint is and how its masks are computed knows nothing of templates or models.
CONSTRAINT_MAY_IMPORT = ("qrun.constraint", "qrun.regex", "qrun.source", "qrun.errors",
                         "qrun.collector")


def test_the_collector_module_imports_nothing_of_qrun() -> None:
    assert [i.module for i in imports(ROOT / "qrun" / "collector.py")
            if i.module.startswith("qrun")] == []


def test_the_constraint_core_imports_only_regex_and_base_modules() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun/constraint") for i in imports(path)
           if (i.module.startswith("qrun") and not i.module.startswith(CONSTRAINT_MAY_IMPORT))
           or i.module.split(".")[0] in ("torch", "transformers")]
    assert bad == []


def test_the_grammar_package_imports_nothing_else_of_qrun() -> None:
    # qrun.collector (the cycle collector's pause) imports nothing of qrun itself.
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun/constraint/grammar") for i in imports(path)
           if i.module.startswith("qrun")
           and not i.module.startswith(("qrun.constraint.grammar", "qrun.collector"))]
    assert bad == []


def test_backends_do_not_import_the_language() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun/backends") for i in imports(path)
           if i.module.startswith(("qrun.lang", "qrun.api", "qrun.cli"))]
    assert bad == []


def test_tests_and_benchmarks_do_not_import_each_other() -> None:
    """Tests stand alone, and bench/ is tooling beside them (issue #36 item 5): what they share
    lives in corpus/, which imports neither."""
    bad = [f"{path.relative_to(ROOT)}:{i.line} imports {i.module}"
           for path in python_files("tests", "corpus") for i in imports(path)
           if i.module == "bench" or i.module.startswith("bench.")]
    bad += [f"{path.relative_to(ROOT)}:{i.line} imports {i.module}"
            for path in python_files("bench", "corpus") for i in imports(path)
            if i.module == "tests" or i.module.startswith("tests.")]
    assert bad == []


# bench/old_json_schema.py is a frozen copy of the JSON-Schema -> regex engine json= holes had
# before llguidance, kept for the "old engine" column of bench/RESULTS.md; these read it.
FROZEN_BASELINE = "bench.old_json_schema"
BASELINE_READERS = ("bench.llg_check", "bench.masks")


def test_the_frozen_json_baseline_is_read_by_the_engine_comparisons_alone() -> None:
    """The product never imports its tooling, and nothing outside the two comparisons imports
    the frozen baseline (issue #36 item 5)."""
    bad = [f"{path.relative_to(ROOT)}:{i.line} imports {i.module}"
           for path in python_files("qrun") for i in imports(path)
           if i.module == "bench" or i.module.startswith("bench.")]
    bad += [f"{path.relative_to(ROOT)}:{i.line} imports {FROZEN_BASELINE}"
            for path in python_files("tests", "corpus", "bench") for i in imports(path)
            if FROZEN_BASELINE in (i.module, f"{i.module}.{i.name}")
            and module_name(path) not in BASELINE_READERS]
    assert bad == []


# The package faces bench/ takes names from (issue #36 item 5: "a public way to find model
# files"): what such a face offers, bench imports from it, not from the module behind it; and
# these modules bench does not import at all.
BENCH_FACES = ("qrun.backends",)
NOT_FOR_BENCH = ("qrun.backends.loading",)


def face_names(package: str) -> set[str]:
    """The names a package's __init__.py offers: those it imports from qrun at the top level
    (under `if TYPE_CHECKING:` too, as a lazy face lists them; not inside a function) and
    those in its __all__."""
    names: set[str] = set()
    body = parse(ROOT.joinpath(*package.split("."), "__init__.py")).body
    for node in [*body, *(n for block in body if isinstance(block, ast.If) for n in block.body)]:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qrun"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names.update(ast.literal_eval(node.value))
    return names


def test_bench_takes_model_files_and_backends_from_the_package_face() -> None:
    offered = {face: face_names(face) for face in BENCH_FACES}
    bad = []
    for path in python_files("bench"):
        for i in imports(path):
            face = next((f for f in BENCH_FACES if i.module.startswith(f + ".")), None)
            if i.module in NOT_FOR_BENCH or (
                    face is not None and i.name is not None and i.name in offered[face]):
                bad.append(f"{path.relative_to(ROOT)}:{i.line} imports {i.name or i.module} "
                           f"from {i.module}, not from {face}")
    assert bad == []


def test_no_private_name_crosses_a_module() -> None:
    """No `from m import _x` and no `m._x` for another module m of the project (tests and bench
    included); CPython's private regex parser is read in one module only."""
    bad = []
    for path in python_files("qrun", "tests", "bench"):
        tree = parse(path)
        aliases: set[str] = set()
        for i in imports(path):
            private = i.name is not None and i.name.startswith("_") and i.name != "__future__"
            if i.module == "re" and i.name in ("_parser", "_constants"):
                if i.source != SRE_READER:
                    bad.append(f"{path}:{i.line} reads re.{i.name}")
            elif private and not i.name.startswith("__"):
                bad.append(f"{path}:{i.line} imports {i.module}.{i.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    ("qrun", "bench")):
                aliases.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                aliases.update((a.asname or a.name).split(".")[0] for a in node.names
                               if a.name.startswith(("qrun", "bench")))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                bad.append(f"{path}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert bad == []


def test_no_private_member_is_reached_from_another_module() -> None:
    """`x._name` on any receiver but self/cls reaches only a private name its own module
    defines (issue #36): a Protocol listing another class's private methods let the
    executor's `_eval`, `_emit`... be called from four modules."""
    defined: dict[str, set[str]] = {}
    uses: list[tuple[str, int, str]] = []
    for path in python_files("qrun"):
        module = module_name(path)
        for node in ast.walk(parse(path)):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif isinstance(node, ast.Attribute):
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if own and isinstance(node.ctx, ast.Store):
                    name = node.attr
                elif not own and node.attr.startswith("_") and not node.attr.startswith("__"):
                    uses.append((module, node.lineno, node.attr))
            if name is not None and name.startswith("_") and not name.startswith("__"):
                defined.setdefault(name, set()).add(module)
    # A name no module of qrun defines is a library's (os._exit, torch.ops.mkldnn's).
    bad = [f"{module}:{line} uses .{name}, private to {', '.join(sorted(defined[name]))}"
           for module, line, name in uses if name in defined and module not in defined[name]]
    assert bad == []


def test_no_import_cycle_between_files() -> None:
    graph: dict[str, set[str]] = {}
    modules = {module_name(p) for p in python_files("qrun")}
    for path in python_files("qrun"):
        source = module_name(path)
        targets = graph.setdefault(source, set())
        for i in imports(path):
            for candidate in (f"{i.module}.{i.name}" if i.name else "", i.module):
                if candidate in modules and candidate != source:
                    targets.add(candidate)
                    break
    cycles = [cycle for cycle in _cycles(graph)]
    assert cycles == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def runtime_imports(path: Path) -> Iterator[Import]:
    """As `imports`, less those under `if TYPE_CHECKING:` (type-only arrows, never run)."""
    tree = parse(path)
    typing_only = {node.lineno for block in ast.walk(tree)
                   if isinstance(block, ast.If) and isinstance(block.test, ast.Name)
                   and block.test.id == "TYPE_CHECKING"
                   for statement in block.body for node in ast.walk(statement)
                   if isinstance(node, ast.Import | ast.ImportFrom)}
    return (i for i in imports(path) if i.line not in typing_only)


def package_of(module: str) -> str:
    """The package a module counts in for arrows between packages: qrun.X for anything under
    qrun/X/ (its __init__ included, which runs whenever one of its modules is imported)."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_packages() -> None:
    """Issue #36: an import inside a function counts (it runs too); a type-only one does not.
    `cli` -> `serve` (the `qrun serve` command) with `serve` -> `cli.jsonio` was such a
    circle, which the file-level test cannot see."""
    graph: dict[str, set[str]] = {}
    for path in python_files("qrun"):
        source = package_of(module_name(path))
        for i in runtime_imports(path):
            target = package_of(i.module)
            if i.module.startswith("qrun.") and target != source:
                graph.setdefault(source, set()).add(target)
    assert _cycles(graph) == []


# The faces above the runtime that reach it only through qrun.api (Query.request and
# Query.runner): the command line is above them all.
FACES = ("qrun.serve", "qrun.lsp", "qrun.testing")


def test_the_faces_reach_the_runtime_only_through_the_api() -> None:
    bad = [f"{i.source}:{i.line} imports {i.module}"
           for path in python_files("qrun") for i in runtime_imports(path)
           if i.source.startswith(FACES)
           and i.module.startswith(("qrun.runtime", "qrun.backends", "qrun.cli"))]
    bad += [f"{i.source}:{i.line} imports {i.module}"
            for path in python_files("qrun") for i in imports(path)
            if i.source.startswith(FACES) and i.module.startswith("qrun.cli")]
    assert bad == []


def constructions(name: str) -> list[str]:
    """Where `name(...)` is called in qrun/ (as a name or an attribute)."""
    found = []
    for path in python_files("qrun"):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call) and (
                    isinstance(node.func, ast.Name) and node.func.id == name
                    or isinstance(node.func, ast.Attribute) and node.func.attr == name):
                found.append(module_name(path))
    return found


@pytest.mark.parametrize("name", ["Run", "ForwardScheduler", "ConstraintCompiler"])
def test_runs_and_per_model_state_are_built_by_the_runner_alone(name: str) -> None:
    """One run path (issue #36): a run, the scheduler of a model's forwards and its compiled
    constraints are made in qrun/runtime/runner.py, once per loaded backend for the last two."""
    assert constructions(name) == ["qrun.runtime.runner"]


CHECK_SCRIPT = """
import sys
import qrun
from qrun.cli import main
query = qrun.Query("Hi {{ name }}: {{ gen x regex=INT }} {{ select s options=['a', 'b'] }}")
program = qrun.compile_source(
    "{% for i in range(2) %}{{ gen y json={'type': 'integer'} }}{% endfor %}"
    "{{ gen z grammar='start: \\"a\\" | \\"b\\"' }}")
assert main([sys.argv[1], "--check"]) == 0
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def test_compiling_and_check_load_no_torch(tmp_path: Path) -> None:
    template = tmp_path / "t.tmpl"
    template.write_text("---\ntemperature: 0.5\n---\nQ: {{ q }}\nA: {{ gen a regex=DATE }}")
    done = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(template)],
                          capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "none", done.stdout + done.stderr


@pytest.mark.parametrize("name", ["Query", "load_model", "Result", "HoleRecord", "BackendError",
                                  "RunOptions", "ModelOptions", "GenRecord", "SelectRecord",
                                  "Matcher"])
def test_public_names_resolve(name: str) -> None:
    import qrun

    assert getattr(qrun, name).__name__ == name
    assert name in qrun.__all__


def test_test_modules_have_unique_names() -> None:
    # pytest imports test files by their base name (rootdir-relative, no __init__.py): two
    # tests/*/test_x.py stop collection with "import file mismatch" in a clean checkout.
    names: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in names, f"{path} and {names[path.name]} share a name"
        names[path.name] = path


def test_the_constraint_core_has_a_face_of_names_that_resolve() -> None:
    """qrun/constraint/__init__.py (issue #36 item 3): its names, imported when asked for."""
    import qrun.constraint as core

    assert sorted(core.__all__) == sorted(vars(core)["_FACE"])
    for name in core.__all__:
        assert getattr(core, name) is not None
    with pytest.raises(AttributeError):
        _ = core.nothing_of_the_kind


LONGEST_MODULE = 700


def test_no_module_grows_past_one_job() -> None:
    """A module over LONGEST_MODULE lines has held several jobs each time it was read (issue
    #36 split serve/app.py 812, lang/compiler.py 807, runtime/executor.py 746 and
    cli/command.py 596 by job): split it by job rather than raise the bound."""
    long = {module_name(path): n for path in python_files("qrun")
            if (n := len(path.read_text().splitlines())) > LONGEST_MODULE}
    assert long == {}
