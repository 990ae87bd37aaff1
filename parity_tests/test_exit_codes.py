"""Claim: an exit status means one thing in every CLI (docs/errors.md, "Exit codes"): 0 done or
agree, 1 a disagreement or a failure while running, 2 refused input, 3 a side that cannot run,
130 and 143 interrupted; and a refusal is one line, `error: ...`, never a traceback.

The lint keeps it so: `sys.exit('error: ...')` prints its string and exits 1 whatever the string
means, so no code of the project exits with a string. The walk runs every CLI through an unknown
flag and one refused input of its own; the rows of docs/errors.md this file owns are below.
"""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from parity_tests.helpers import REPO

SKIP = ('.', '__pycache__', 'build', 'runs')  # hidden folders (.venv, .git), outputs


def project_files() -> list[pathlib.Path]:
    files = []
    for folder, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(SKIP) and not d.endswith('.egg-info')]
        files += [pathlib.Path(folder, n) for n in names if n.endswith('.py')]
    return files


def exits_with_a_string(source: str) -> list[int]:
    """The lines of `source` that exit with a string, which Python prints and then exits 1:
    sys.exit('...'), sys.exit(f'...'), raise SystemExit('...'), exit(...), quit(...)."""

    def exits(func) -> bool:
        if isinstance(func, ast.Attribute):  # sys.exit
            return (
                func.attr == 'exit' and isinstance(func.value, ast.Name) and func.value.id == 'sys'
            )
        return isinstance(func, ast.Name) and func.id in ('exit', 'quit', 'SystemExit')

    def text(arg) -> bool:
        if isinstance(arg, ast.Constant):
            return isinstance(arg.value, str)
        if isinstance(arg, ast.BinOp):  # 'error: ' + message, 'error: %s' % message
            return text(arg.left) or text(arg.right)
        if isinstance(arg, ast.Call):  # str(e), 'error: {}'.format(e)
            f = arg.func
            return (isinstance(f, ast.Name) and f.id == 'str') or (
                isinstance(f, ast.Attribute) and f.attr == 'format' and text(f.value)
            )
        return isinstance(arg, ast.JoinedStr)

    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and exits(node.func) and node.args and text(node.args[0])
    )


def test_the_lint_finds_every_spelling_of_an_exit_with_a_string():
    planted = '''
import sys
sys.exit('error: no final line')
sys.exit(f'error: {problem}')
sys.exit('error: ' + problem)
raise SystemExit(str(e))
exit('error: {}'.format(e))
sys.exit(2)
sys.exit(main(sys.argv))
refuse('no final line', 2)
'''
    assert exits_with_a_string(planted) == [3, 4, 5, 6, 7]


def test_no_code_exits_with_a_string():
    """Each such exit was a 1 whatever it meant (compare's refusals, the launcher's): every one
    goes through shard_parity.refuse(message, status) with the status of its meaning."""
    files = project_files()
    assert any(f.name == 'compare.py' for f in files) and len(files) > 100  # it reads the tree
    found = {
        str(f.relative_to(REPO)): lines
        for f in files
        if (lines := exits_with_a_string(f.read_text(encoding='utf-8')))
    }
    assert found == {}, f'exits with a string (it exits 1): use shard_parity.refuse: {found}'


# Each CLI, an unknown flag (absl's refusal; margins: argparse's) and one refused input of its
# own, with what that refusal says. Every command runs from the checkout's root, as the README's.
ABSL = "Unknown command line flag 'nosuchflag' (--help lists the flags)"
UNKNOWN = {  # (the unknown flag, what is said) where not (['--nosuchflag'], ABSL)
    'tools.launch': (['--nosuchflag', '--', 'true'], ABSL),  # its flags come before the --
    'tools.margins': (['--nosuchflag'], 'unrecognized arguments: --nosuchflag'),  # argparse
}
WALK = {
    'auto.train': (['--mesh=4by2'], '--mesh=4by2: expected DATAxMODEL'),
    'explicit.train': (['--strategy=cp', '--mesh=2x4'], '--strategy=cp splits sequences'),
    'typed.train': (
        ['--model=transformer', '--num_kv_heads=3', '--batch_size=16'],
        '--num_kv_heads=3 does not divide --num_heads=4',
    ),
    'explicit.generate': (['--workdir={tmp}'], 'no checkpoint in'),
    'tools.compare': (['{tmp}'], 'expected two workdirs, got 1'),
    'tools.bisect': (['--twins=auto,explicit,typed'], '--twins=auto,explicit,typed: give two'),
    'tools.launch': (['python', '-m', 'auto.train'], 'put -- before the command'),
    'inspector': (['--program=mymod'], '--program=mymod: expected MODULE:FUNCTION'),
    'benchmarks.run': (['--sections=foo'], "--sections has ['foo']"),
    'tools.margins': (['parity_tests/test_tp.py'], 'is not a parity test file'),
}


def one_line(result, status: int) -> str:
    """The command exited `status`, printing one line, `error: ...`, and nothing else."""
    printed = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == status and len(printed) == 1, result.stdout + result.stderr
    assert printed[0].startswith('error: ') and 'Traceback' not in result.stderr
    return printed[0]


@pytest.mark.slow  # 20 commands, 2 s each for those that import JAX
@pytest.mark.parametrize('command', WALK)
def test_every_cli_refuses_an_unknown_flag_and_a_bad_input_in_one_line_exit_2(command, tmp_path):
    """Exit 2 and one line for each, in every CLI: the launcher's unknown flag exited 1 with
    its own words, and the train CLIs' took two lines (absl's `FATAL Flags parsing error`)."""
    refused, message = WALK[command]
    for args, says in (UNKNOWN.get(command, (['--nosuchflag'], ABSL)), (refused, message)):
        result = subprocess.run(
            [sys.executable, '-m', command, *(a.format(tmp=tmp_path) for a in args)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert says in one_line(result, 2)


# --program=MODULE:FUNCTION, a module of the user's that fails: each a refused input (exit 2),
# one line naming the module's line (docs/errors.md's rows). (module source, what is said).
PROGRAMS = {
    'raises at import': ('import jax\nx = 1 / 0\n', "importing 'mine' raised ZeroDivisionError"),
    'a SyntaxError': ('def build(:\n    pass\n', "importing 'mine' raised SyntaxError at"),
    'its function raises': (
        'def helper():\n    raise ValueError("no mesh")\n\ndef build():\n    return helper()\n',
        "mine:build() raised ValueError: no mesh at",
    ),
    'returns (jitted, array)': (
        'import jax, jax.numpy as jnp\n\ndef build():\n    return jax.jit(jnp.tanh), jnp.ones(8)\n',
        'must return (jitted function, tuple of its arguments), e.g. (jax.jit(f), (x, w)); it '
        'returned (',  # then the two types' names, JAX's own
    ),
}
WHERE = {  # the line each names (None: a return value has no line)
    'raises at import': 2,
    'a SyntaxError': 1,
    'its function raises': 2,
    'returns (jitted, array)': None,
}


@pytest.mark.parametrize('case', PROGRAMS)
def test_a_program_of_yours_that_fails_is_refused_naming_its_line(case, tmp_path, monkeypatch):
    """In this process (no compile): the UsageError the CLI prints as its one line, exit 2."""
    from shard_parity import UsageError, exit_status
    from shard_parity.inspector.cli import load_program

    source, says = PROGRAMS[case]
    (tmp_path / 'mine.py').write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mine', raising=False)
    with pytest.raises(UsageError) as refused:
        load_program('mine:build')
    message = str(refused.value)
    assert says in message and '\n' not in message and exit_status(refused.value) == 2, message
    if WHERE[case] is not None:
        assert message.endswith(f'{tmp_path / "mine.py"}:{WHERE[case]}') or (
            f'{tmp_path / "mine.py"}:{WHERE[case]}:' in message  # a SyntaxError: then its msg
        ), message


FAILS_TO_TRACE = """import jax, jax.numpy as jnp

def f(x, w):
    return jnp.dot(x, w)

def build():
    return jax.jit(f), (jnp.ones((8, 4)), jnp.ones((5, 3)))
"""


def test_a_program_whose_function_fails_to_trace_is_refused_naming_its_line(tmp_path, monkeypatch):
    """Traced only (it fails before anything compiles): the user's line, not JAX's traceback;
    an error of the inspector's own, with no line of theirs on the stack, is raised as it is."""
    from shard_parity import UsageError
    from shard_parity.inspector import cli

    (tmp_path / 'mine.py').write_text(FAILS_TO_TRACE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mine', raising=False)
    jitted, args = cli.load_program('mine:build')
    with pytest.raises(UsageError) as refused:
        cli.compiled_program(jitted, args, 'mine:build', hardware='h100x8')
    message = str(refused.value)
    assert message.startswith(
        '--program: the function mine:build() returned fails to trace: TypeError: '
    ), message
    assert message.endswith(f'{tmp_path / "mine.py"}:4') and '\n' not in message, message
    with pytest.raises(ValueError, match='--hardware=a100: expected one of'):  # ours: as it is
        cli.compiled_program(jitted, args, 'mine:build', hardware='a100')


@pytest.mark.slow  # two inspector runs: 10 s
def test_a_failing_program_is_one_line_and_verbose_shows_the_traceback(tmp_path):
    (tmp_path / 'mine.py').write_text(PROGRAMS['its function raises'][0])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    command = [sys.executable, '-m', 'inspector', '--program=mine:build', '--cpu_devices=8']
    quiet, verbose = (
        subprocess.run(command + flags, cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
        for flags in ([], ['--verbose'])
    )  # fmt: skip
    assert one_line(quiet, 2).endswith(f'{tmp_path / "mine.py"}:2')
    assert verbose.returncode == 2 and 'Traceback' in verbose.stderr, verbose.stderr[-2000:]
    assert verbose.stderr.strip().splitlines()[-1] == quiet.stderr.strip()


NO_DATA = {  # every CLI that reads data, without it: the train CLI's line, the train CLI's status
    'auto.train': ['--model=transformer', '--batch_size=16', '--steps=1', '--workdir={tmp}/run'],
    'tools.bisect': ['--twins=one_device,explicit', '--model=transformer', '--batch_size=16'],
    'benchmarks.run': ['--sections=cli', '--out={tmp}/results'],
}


@pytest.mark.slow  # three CLIs up to their data: 8 s
def test_every_cli_that_reads_data_says_the_train_clis_line_without_it(tmp_path):
    """Offline (a proxy that refuses every connection) and no data folder: one line naming the
    file and how to get it, exit 1 (a fault, as the train CLI's), no chained tracebacks (the
    bisector printed four: socket.gaierror, URLError, DataError, DataError)."""
    env = dict(os.environ, SHARD_PARITY_DATA_DIR=str(tmp_path / 'none'))
    env |= {'https_proxy': 'http://127.0.0.1:1', 'HTTPS_PROXY': 'http://127.0.0.1:1'}
    file = tmp_path / 'none' / 'tinyshakespeare' / 'input.txt'
    said = set()
    for command, flags in NO_DATA.items():
        result = subprocess.run(
            [sys.executable, '-m', command, *(f.format(tmp=tmp_path) for f in flags)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        line = one_line(result, 1)
        assert line.startswith(f'error: Tiny Shakespeare file {file} is missing and could not be '
                               'downloaded: '), line  # fmt: skip
        said.add(line)
    assert len(said) == 1  # word for word the train CLI's
    assert not (tmp_path / 'results').exists()  # found before the first section, nothing written
