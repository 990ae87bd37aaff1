"""Claim: imports run one way, and the plan is built in two places only.

The project's floors, lowest first (FLOORS): a module imports its own floor and those below,
never one above; the core (shard_parity/ less its twins, tools and inspector) imports no twin,
tool or inspector code, the twins are injected into the shared train CLI. Imports inside
functions count, and so do `importlib.import_module` calls with a literal name. No two modules
import each other, directly or round a longer cycle, and a test module imports what the tests
share from helpers.py, never another test module. The plan (shard_parity/plan.py) is built
from the flags (shard_parity/runtime/from_flags.py, the one module that reads the plan's flags)
or from a saved config.json (`plan.from_config`); everything else is handed it.
"""

import ast
import pathlib

import pytest

from parity_tests.helpers import REPO as ROOT

REPO = pathlib.Path(ROOT)

FLOORS = (  # lowest first: (name, the top-level folders on that floor)
    ('core', ('shard_parity', 'datasets')),
    ('twins', ('auto', 'explicit', 'typed')),
    ('tools and inspector', ('tools', 'inspector')),
    ('benchmarks', ('benchmarks',)),
    ('tests', ('parity_tests',)),
)
FOLDER_FLOOR = {folder: i for i, (_, folders) in enumerate(FLOORS) for folder in folders}
INSTALLED = {'auto', 'explicit', 'typed', 'tools', 'inspector', 'datasets'}  # shard_parity.<x>
PLAN_FLAGS = {'MESH', 'STRATEGY', 'NUM_DEVICES', 'MICROBATCHES', 'PP_SCHEDULE', 'PP_VIRTUAL',
              'CP_LAYOUT', 'REDUCE_DTYPE', 'MATMUL_PRECISION', 'SHARD_OPTIMIZER'}  # fmt: skip


def module_name(path: pathlib.Path) -> str:
    """auto/pp.py -> 'auto.pp'; shard_parity/runtime/loop.py -> 'shard_parity.runtime.loop'
    (the checkout's names: shard_parity.auto is auto/, installed)."""
    parts = list(path.relative_to(REPO).with_suffix('').parts)
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def canonical(name: str) -> str:
    """An imported name in the checkout's terms: 'shard_parity.auto.pp' -> 'auto.pp'."""
    head, _, rest = name.partition('.')
    if head == 'shard_parity' and rest.split('.')[0] in INSTALLED:
        return rest
    return name


def imports(path: pathlib.Path, source: str | None = None) -> list[tuple[str, int]]:
    """(every module `path` imports, the line): at the top, inside functions, relative ones
    resolved, `from package import module` as the module, and importlib.import_module calls
    with a literal name."""
    tree = ast.parse(source if source is not None else path.read_text())
    package = module_name(path).split('.')
    if path.name != '__init__.py':
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = '.'.join(base + ([node.module] if node.module else []))
            out.append((module, node.lineno))
            out += [(f'{module}.{alias.name}', node.lineno) for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'import_module'
              and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            out.append((node.args[0].value, node.lineno))
    return [(canonical(name), line) for name, line in out]


def project_files() -> list[pathlib.Path]:
    return sorted(
        p for folder in FOLDER_FLOOR for p in (REPO / folder).rglob('*.py')
        if '.venv' not in p.parts
    )  # fmt: skip


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in project_files()}


def floor(name: str) -> int | None:
    """The floor of a project module's name (None: not the project's)."""
    return FOLDER_FLOOR.get(name.split('.')[0])


def upward(path: pathlib.Path, source: str | None = None) -> list[str]:
    """Each import of `path` that reaches a floor above its own."""
    mine = floor(module_name(path))
    return [
        f'{path.relative_to(REPO)}:{line} imports {name} ({FLOORS[floor(name)][0]}, above '
        f'{FLOORS[mine][0]})'
        for name, line in imports(path, source)
        if floor(name) is not None and floor(name) > mine
    ]


def edges() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name that is an attribute of a module, a
    function or a constant, counts as that module)."""
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for imported, _ in imports(path):
            while imported and imported not in known:
                imported = imported.rpartition('.')[0]
            if imported and imported != name and not name.startswith(imported + '.'):
                if not (known[imported].name == '__init__.py' and imported in name):
                    targets.add(imported)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, one per strongly connected component of more than one module."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_a_floor_above_its_own():
    found = [line for p in project_files() for line in upward(p)]
    assert not found, '\n'.join(found)


def test_a_planted_upward_import_is_caught_even_inside_a_function():
    """The check can fail: a core module that imports the inspector inside a function (as
    mesh.py once did for libtpu's quieting), or by importlib with a literal name."""
    mesh = REPO / 'shard_parity' / 'mesh.py'
    planted = 'def quiet():\n    from shard_parity.inspector.target import quiet_libtpu\n'
    assert upward(mesh, planted) == [
        'shard_parity/mesh.py:2 imports inspector.target (tools and inspector, above core)',
        'shard_parity/mesh.py:2 imports inspector.target.quiet_libtpu (tools and inspector, '
        'above core)',
    ]
    by_name = "import importlib\nimportlib.import_module('shard_parity.auto')\n"
    assert upward(mesh, by_name) == ['shard_parity/mesh.py:2 imports auto (twins, above core)']
    twin = REPO / 'auto' / 'pp.py'  # a twin reaching up to the tools by a relative path
    assert upward(twin, 'from ..tools import bisect\n') == [
        'auto/pp.py:1 imports tools (tools and inspector, above twins)',
        'auto/pp.py:1 imports tools.bisect (tools and inspector, above twins)',
    ]
    assert upward(twin, 'from shard_parity.mesh import STAGE\n') == []  # downward is fine


def test_no_two_modules_import_each_other():
    found = cycles(edges())
    assert not found, found


def test_a_planted_cycle_is_caught():
    graph = edges()
    assert not cycles(graph)
    graph['shard_parity.runtime.flags'].add('shard_parity.runtime.from_flags')  # as it once was
    assert cycles(graph) == [['shard_parity.runtime.flags', 'shard_parity.runtime.from_flags']]


def test_test_modules_import_only_helpers():
    found = [
        f'{p.relative_to(REPO)}:{line} imports {name}'
        for p in (REPO / 'parity_tests').glob('*.py')
        for name, line in imports(p)
        if name.startswith('parity_tests.test_')
    ]
    assert not found, found


BUILDERS = {'Plan', 'parse', 'named', 'of'}  # plan.py's ways to make a Plan from scratch


def builds(path: pathlib.Path) -> list[tuple[str, int]]:
    """(name, line) of each call that makes a Plan from scratch: `Plan(...)`, or plan.py's
    `parse`, `named` or `of` (as `plans.parse(...)`, `plan.parse(...)`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        owner = getattr(getattr(func, 'value', None), 'id', None)
        if getattr(func, 'id', None) == 'Plan' or getattr(func, 'attr', None) == 'Plan':
            out.append(('Plan', node.lineno))
        elif owner in ('plans', 'plan') and getattr(func, 'attr', None) in BUILDERS:
            out.append((func.attr, node.lineno))
    return out


def flag_reads(path: pathlib.Path) -> list[tuple[str, int]]:
    """(flag, line) of each `X.value` of a flag that decides the plan (PLAN_FLAGS)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == 'value':
            holder = getattr(node.value, 'attr', None) or getattr(node.value, 'id', None)
            if holder in PLAN_FLAGS:
                out.append((holder, node.lineno))
    return out


PRODUCT = ('shard_parity', 'auto', 'explicit', 'typed', 'tools', 'inspector', 'benchmarks')
BUILDS_FROM_FLAGS = {'shard_parity/plan.py', 'shard_parity/runtime/from_flags.py'}


def product_files() -> list[pathlib.Path]:
    return [p for p in project_files() if p.relative_to(REPO).parts[0] in PRODUCT]


def test_the_plan_is_built_from_the_flags_or_a_saved_config_only():
    """Only plan.py constructs a Plan; only from_flags.py reads the flags that decide it and
    parses --mesh (the benchmarks parse their sections' fixed meshes, their own flags); every
    other reader takes the plan whole, or reads a run's config.json with plan.from_config."""
    built = [
        f'{p.relative_to(REPO)}:{line} {name}()'
        for p in product_files()
        for name, line in builds(p)
        if str(p.relative_to(REPO)) not in BUILDS_FROM_FLAGS
        and not (name in ('parse', 'named') and p.relative_to(REPO).parts[0] == 'benchmarks')
    ]
    assert not built, built
    read = [
        f'{p.relative_to(REPO)}:{line} reads --{flag.lower()}'
        for p in product_files()
        for flag, line in flag_reads(p)
        if str(p.relative_to(REPO)) != 'shard_parity/runtime/from_flags.py'
    ]
    assert not read, read


def test_a_plan_rebuilt_elsewhere_is_caught(tmp_path):
    """The check can fail: a tool that parses --mesh itself, or reads --microbatches."""
    planted = tmp_path / 'planted.py'
    planted.write_text(
        'from shard_parity import plan as plans\n'
        'p = plans.parse(F.MESH.value, None, 8)\n'
        'q = plans.Plan(p.axes, microbatches=F.MICROBATCHES.value)\n'
    )
    assert builds(planted) == [('parse', 2), ('Plan', 3)]
    assert flag_reads(planted) == [('MESH', 2), ('MICROBATCHES', 3)]


@pytest.mark.parametrize('module', ['shard_parity.runtime.flags', 'shard_parity.runtime.train'])
def test_no_shim_re_exports_what_another_module_defines(module):
    """flags.py's `__getattr__` shim and train.py's "as before" re-exports are gone: a name is
    imported from the module that defines it."""
    path = modules()[module]
    tree = ast.parse(path.read_text())
    assert not any(
        isinstance(n, ast.FunctionDef) and n.name == '__getattr__' for n in tree.body
    ), 'a module __getattr__'
    assert 'as before' not in path.read_text()
