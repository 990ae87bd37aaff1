"""Every test process runs on 8 emulated CPU devices, configured before anything starts JAX.

The twins are compared with XLA's fused multiply-adds off (shard_parity/mesh.py explains why);
tests that run the train CLIs in subprocesses get the same settings from the CLI's defaults.
Shared helpers live in parity_tests/helpers.py; this file holds the fixtures, the report header
(the processor and versions a failure report needs), --margins (python -m tools.margins) and
--exhaustive (the opt-in tier: tests marked exhaustive run only with it).
"""

import atexit
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zlib

import jax
import pytest

from parity_tests import helpers
from parity_tests.helpers import make_case
from shard_parity.devices import configure_jax
from shard_parity.mesh import make_mesh

# The suite's time is XLA:CPU compiling (85% of the fast tier's; its programs then run for
# milliseconds), most of it LLVM optimising machine code at XLA's default level 3. Tests compare
# programs, not machine code, so they compile at level 0, and, where this XLA has them (jaxlib
# 0.10's; later ones abort on the flag, so a short subprocess asks first), through XLA:CPU's older
# fusion emitters, which give the same bits as the new ones at level 0 in a third of the time:
# together a sixth of the CPU per compile (docs/determinism.md, "The suite's time"). The
# transformer's last bits differ from level 3's, as another processor's would, which the
# tolerances allow for (helpers.py); the MLP twins stay bitwise equal. CLIs the tests start
# inherit the flags, so a CLI run and an in-process run compile alike. XLA_FLAGS naming a level
# of your own (3: the CLIs' default) wins.
OPT_LEVEL = '--xla_backend_optimization_level'
OLD_EMITTERS = '--xla_cpu_use_fusion_emitters=false'


def xla_knows(flag: str) -> bool:
    env = {**os.environ, 'XLA_FLAGS': flag, 'JAX_PLATFORMS': 'cpu'}
    probe = [sys.executable, '-c', 'import jax; jax.devices()']
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


if OPT_LEVEL not in os.environ.get('XLA_FLAGS', ''):
    fast = f'{OPT_LEVEL}=0' + (f' {OLD_EMITTERS}' if xla_knows(OLD_EMITTERS) else '')
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {fast}".strip()

# On a TPU v5e (or newer) host whose kernel has transparent hugepages off, `import jax` warns so
# on stderr (a UserWarning of jax's cloud_tpu_init) in every process, ahead of the one line a
# CLI's error is: the CLIs the tests start leave that platform notice out, as CI's machines,
# which have no chip, never print it. Nothing else is filtered.
THP = 'ignore:Transparent hugepages are not enabled:UserWarning'
if THP not in os.environ.get('PYTHONWARNINGS', ''):
    os.environ['PYTHONWARNINGS'] = ','.join(filter(None, [os.environ.get('PYTHONWARNINGS'), THP]))

# Importing JAX does not start its backend; the first computation does. None has run yet.
# SHARD_PARITY_TEST_DEVICES: another count, for a test that needs more (test_composed.py's 4-D
# mesh runs itself in a pytest of 16).
configure_jax(int(os.environ.get('SHARD_PARITY_TEST_DEVICES', 8)))

# Compilation is most of the suite's time, and many tests compile the very same program again
# (the one-device step of a case, a twin's step that another test built before, the same
# initialiser): a compilation cache for this test process turns each repeat into a look-up.
# Identical programs give identical executables, so no result changes. The cache is this
# process's alone (subprocesses, which may run several at once, compile for themselves) and is
# deleted at exit, unless JAX_COMPILATION_CACHE_DIR names one of yours.
if not jax.config.jax_compilation_cache_dir:
    _cache = tempfile.mkdtemp(prefix='shard-parity-xla-cache-')
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    jax.config.update('jax_compilation_cache_dir', _cache)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def pytest_addoption(parser):
    parser.addoption(
        '--exhaustive',
        action='store_true',
        help="also run the tests marked exhaustive: more meshes, schedules and precisions of a "
        'claim another test already holds (coverage, no new signal); CI runs them in a leg of '
        'their own (.ci/run)',
    )
    parser.addoption(
        '--shard',
        metavar='I/N',
        help='run the I-th of N parts of the selected tests, each test in one part by a hash of '
        'its id (CI runs the exhaustive tier a quarter at a time, the part chosen by the commit: '
        '.ci/run)',
    )
    parser.addoption(
        '--margins',
        action='store_true',
        help='after the run, print how much of its tolerance each parity comparison used '
        '(python -m tools.margins runs the parity tests with it)',
    )


def pytest_collection_modifyitems(config, items):
    """The tests marked exhaustive run only with --exhaustive: deselected, not skipped, so that
    `-m "not slow"` and the README's command time what they run; --shard=I/N keeps its part."""
    if not config.getoption('exhaustive'):
        deselect(config, items, lambda item: 'exhaustive' not in item.keywords)
    if config.getoption('shard'):
        part, parts = shard(config.getoption('shard'))
        deselect(config, items, lambda item: zlib.crc32(item.nodeid.encode()) % parts == part - 1)


def deselect(config, items, keep):
    kept = [item for item in items if keep(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not keep(item)])
        items[:] = kept


def shard(text: str) -> tuple[int, int]:
    """--shard=I/N: (I, N), 1 <= I <= N; anything else is a usage error naming what is allowed."""
    try:
        part, parts = (int(x) for x in text.split('/'))
    except ValueError:
        part = parts = 0
    if not 1 <= part <= parts:
        raise pytest.UsageError(
            f'--shard={text}: give I/N, whole numbers with 1 <= I <= N (e.g. 1/4)'
        )
    return part, parts


def pytest_report_header(config):
    """What a failure report needs to be reproduced: the processor, what XLA:CPU compiles for,
    the versions and the emulated devices."""
    import jaxlib

    return [
        f'processor: {cpu_model()} ({platform.machine()}; host has {host_isa()})',
        f'XLA:CPU: XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r} (AVX: no fused multiply-add;'
        ' level 0 and older emitters where known: the tests compile fast, conftest.py)',
        f'jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python {platform.python_version()}'
        f', {jax.config.jax_num_cpu_devices} emulated CPU devices',
    ]


def cpu_model() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
        return names[0] if names else platform.processor() or 'unknown'
    except OSError:
        return platform.processor() or 'unknown'


def host_isa() -> str:
    """The widest vector extensions the processor reports (Linux), as XLA:CPU would see them."""
    try:
        with open('/proc/cpuinfo') as f:
            flags = next((line.split(':', 1)[1].split() for line in f if line.startswith('flags')))
    except (OSError, StopIteration):
        return 'unknown vector extensions'
    wanted = ('avx512f', 'avx512_bf16', 'amx_tile', 'avx2', 'fma', 'avx', 'sse4_2', 'neon')
    return ' '.join(f for f in wanted if f in flags) or 'none of ' + ' '.join(wanted)


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption('margins'):
        return
    write = terminalreporter.write_line
    worst: dict[tuple[str, str], float] = {}
    for test, tolerance, used in helpers.MARGINS:
        worst[test, tolerance] = max(used, worst.get((test, tolerance), 0.0))
    write('')
    write('margins: allowed / largest error of each parity test, per tolerance (helpers.py)')
    for (test, tolerance), used in sorted(worst.items(), key=lambda kv: (-kv[1], kv[0])):
        margin = 'exact' if used == 0 else f'{1 / used:.3g}x'
        flag = '  <-- under 10x' if used > 0.1 else ''
        write(f'{margin:>10}  {tolerance:<9}  {test}{flag}')
    if not helpers.MODEL_MARGINS:
        return
    write('')
    write('error model (docs/numerics.md): a correct pair\'s largest error as a fraction of')
    write('its budget (kept at 1/3 or less), a bug\'s first leaf in budgets (10 or more), a')
    write('small bug within the budget: its float32 effect as a fraction of the detection limit')
    for test, kind, figure in sorted(helpers.MODEL_MARGINS, key=lambda r: (r[1], -r[2], r[0])):
        if kind == 'agrees':
            flag = '  <-- over 1/3' if figure > 1 / 3 else ''
            write(f'{figure:>10.3g}  of budget  {test}{flag}')
        elif kind == 'limit':  # a small bug within bf16's budget (test_detection.py)
            write(f'{figure:>10.3g}  of limit   {test}  (its effect under what bf16 can see)')
        else:
            flag = '  <-- under 10' if figure < 10 else ''
            write(f'{figure:>10.3g}  budgets    {test}{flag}')


@pytest.fixture(scope='session')
def mesh8():
    assert jax.device_count() == 8, 'conftest asks for 8 CPU devices before JAX starts'
    return make_mesh(8)


@pytest.fixture(scope='session')
def fsdp8():
    """--strategy=fsdp's mesh on 8 devices: 'fsdp' splits the batch and the state."""
    return helpers.strategy_mesh('fsdp')


@pytest.fixture(scope='session', params=['mlp', 'transformer'])
def case(request):
    return make_case(request.param)


@pytest.fixture(scope='session')
def mnist_batches():
    return make_case('mlp').batches
