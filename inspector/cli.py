"""The inspector's command line, `python -m inspector`: this repository's twins for one strategy,
or any program of yours.

    python -m inspector --model=mlp --cpu_devices=8
    python -m inspector --model=transformer --strategy=fsdp --hardware=tpu-v5e-8 \
        --html=/tmp/fsdp.html --trace=/tmp/fsdp.json --cpu_devices=8
    python -m inspector --program=mypkg.mymod:build --cpu_devices=8
    python -m inspector --model=mlp --strategy=fsdp --target=tpu-v5e-8

`--program=MODULE:FUNCTION`: FUNCTION() (in a module on PYTHONPATH) builds its mesh and returns
(jitted function, tuple of its arguments: arrays or jax.ShapeDtypeStructs with shardings).
`--target=NAME`: every program compiled for that hardware, which need not be here
(inspector/target.py); FUNCTION(devices=...) then gets its devices, if it takes them.
"""

import dataclasses
import importlib
import importlib.util
import inspect as pyinspect
import json
import os
import sys
import tempfile
import traceback

from absl import app, flags
from jax.sharding import AxisType

from shard_parity import UsageError, refuse
from shard_parity.devices import configure_jax
from shard_parity.runtime import declare_key_flags, parse_flags
from shard_parity.runtime import flags as F

from . import cost
from . import target as targets
from .render import print_attribution, print_measured, print_report

JSON = flags.DEFINE_bool('json', False, 'Print one JSON object instead of the tables.')
HARDWARE = flags.DEFINE_enum(
    'hardware', 'h100x8', list(cost.HARDWARE), 'Predict collective and step times on this.'
)
HTML = flags.DEFINE_string('html', None, 'Also write the report as one self-contained HTML file.')
TRACE = flags.DEFINE_string('trace', None, 'Also write the predicted step as Chrome trace JSON.')
FAIL_ON_SURPRISE = flags.DEFINE_bool(
    'fail_on_surprise', False, 'Exit with status 1 when any surprise is flagged (for CI).'
)
TARGET = flags.DEFINE_enum(
    'target', None, list(targets.TARGETS),
    'Compile every program for this hardware, which need not be here (its compiler runs on '
    'this machine; tpu-*: pip install -e ".[tpu]"), read its optimized HLO, and price it on '
    'that hardware: tpu-v5e-N (v5litepod-N), tpu-v5p-N and tpu-v4-N (N = 2 x chips, as Cloud '
    'names them), h200x8 (from a target config captured by benchmarks/gpu.sh).',
)  # fmt: skip
HOSTS = flags.DEFINE_integer(
    'hosts', 1, 'Lay the mesh over this many hosts, outer axes across hosts (as '
    'mesh_utils.create_hybrid_device_mesh): a collective whose devices span hosts is priced at '
    'the inter-host link (inspector/hosts.py).', lower_bound=1
)  # fmt: skip
MEASURE_MEMORY = flags.DEFINE_bool(
    'measure_memory', False, 'On a TPU (or GPU) host: also run the one-device step once on '
    'this chip and report the runtime\'s peak_bytes_in_use beside the compiler\'s peak '
    '(measured_memory in the JSON; inspector/measured.py).'
)  # fmt: skip
PROGRAM = flags.DEFINE_string(
    'program', None, 'MODULE:FUNCTION: inspect the jitted function FUNCTION() returns, with '
    'its arguments, instead of the twins.'
)  # fmt: skip


def load_program(spec: str, devices=None):
    """FUNCTION() of MODULE, for --program=MODULE:FUNCTION: (jitted, args). `devices`: a
    --target's, passed as FUNCTION(devices=...) when it takes them (to build its mesh from).
    A module that cannot be found, raises or has a SyntaxError while importing, a FUNCTION that
    raises or returns anything but (jitted function, tuple of its arguments): each is a refused
    input (UsageError), one line naming the module's line; --verbose prints the traceback."""
    module_name, _, function = spec.partition(':')
    if not module_name or not function:
        raise UsageError(f'--program={spec}: expected MODULE:FUNCTION, e.g. mypkg.mymod:build')
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + '.').startswith(e.name + '.'):
            origin = origin_of(module_name)  # a module it imports is missing: name the line
            raise UsageError(
                f'--program: importing {module_name!r} raised {failure(e, origin)}'
            ) from e
        raise UsageError(
            f'--program: cannot import {module_name!r} ({e}): is it on PYTHONPATH?'
        ) from e  # the module itself (or its package) is not found
    except Exception as e:  # a SyntaxError, or whatever its top level raises
        origin = origin_of(module_name)
        raise UsageError(f'--program: importing {module_name!r} raised {failure(e, origin)}') from e
    build = getattr(module, function, None)
    if not callable(build):
        raise UsageError(f'--program: {module_name} has no function {function}()')
    takes = devices is not None and 'devices' in pyinspect.signature(build).parameters
    try:
        built = build(devices=devices) if takes else build()
    except Exception as e:
        raise UsageError(f'--program: {spec}() raised {failure(e, module.__file__)}') from e
    if not (
        isinstance(built, tuple)
        and len(built) == 2
        and hasattr(built[0], 'lower')
        and isinstance(built[1], tuple)
    ):
        got = (
            f'({", ".join(type(x).__name__ for x in built)})'
            if isinstance(built, tuple)
            else type(built).__name__
        )
        raise UsageError(
            f'--program: {spec}() must return (jitted function, tuple of its arguments), '
            f'e.g. (jax.jit(f), (x, w)); it returned {got}'
        )
    return built


def origin_of(module_name: str) -> str | None:
    """The file of a module that failed to import, for naming its line."""
    try:
        return getattr(importlib.util.find_spec(module_name), 'origin', None)
    except Exception:  # its package failed too
        return None


def compiled_program(jitted, args, spec: str, **kwargs):
    """inspect(jitted, *args) of a --program: an error raised in the user's own function while
    JAX traces it (its file on the stack) is a refused input naming that line; any other is
    raised as it is (an error of the inspector's own shows its traceback)."""
    from .program import inspect

    try:
        return inspect(jitted, *args, **kwargs)
    except (UsageError, targets.TargetError):
        raise
    except Exception as e:
        source = getattr(getattr(jitted, '__wrapped__', None), '__code__', None)
        source = source and source.co_filename
        if not any(f.filename == source for f in traceback.extract_tb(e.__traceback__)):
            raise
        raise UsageError(
            f'--program: the function {spec}() returned fails to trace: {failure(e, source)}'
        ) from e


def failure(error: BaseException, source: str | None = None) -> str:
    """`ValueError: boom at mymod.py:12`: the error's first line and where it was raised, as
    near the user's own code as the traceback goes: its line in `source` (the module's file)
    where there is one, else the innermost frame (a SyntaxError: the line it names)."""
    if isinstance(error, SyntaxError):
        return f'SyntaxError at {error.filename}:{error.lineno}: {error.msg}'
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename[:1] != '<']
    mine = [f for f in frames if source and f.filename == source]
    where = (mine or frames)[-1] if frames else None
    message = (str(error).strip().splitlines() or [''])[0][:200]
    return f'{type(error).__name__}: {message}' + (
        f' at {where.filename}:{where.lineno}' if where else ''
    )


def check_output(flag, path: str) -> None:
    """Before anything compiles: `path` (--html, --trace) is a file to write in a folder that
    exists and takes a new file, so that a bad path costs one line, not the inspection."""
    name = f'--{flag.name}={path}'
    if os.path.isdir(path):
        example = os.path.join(path, 'report.html' if flag is HTML else 'trace.json')
        raise UsageError(f'{name} is a folder: name the file to write, e.g. '
                         f'--{flag.name}={example}')  # fmt: skip
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = 'is not a folder' if os.path.exists(folder) else 'does not exist'
        raise UsageError(f'{name}: {folder} {what}')
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix='.inspector-probe-')
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f'{name}: cannot write in {folder} ({e.strerror})') from e


def on_chip(here):
    """The chip this runs on (target.here()), priced at --hardware where given."""
    if here is None or not flags.FLAGS[HARDWARE.name].present:
        return here
    return dataclasses.replace(here, hardware=HARDWARE.value)


def report_of_flags():
    configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value, libtpu_lines=F.VERBOSE.value)
    target = TARGET.value
    if target and flags.FLAGS[HARDWARE.name].present:
        raise UsageError(
            f'--hardware={HARDWARE.value} with --target={target}: a target\'s program is priced '
            f'on its own hardware ({targets.get(target).hardware}); drop --hardware'
        )
    if target and flags.FLAGS[F.CPU_DEVICES.name].present:
        raise UsageError(
            f'--cpu_devices={F.CPU_DEVICES.value} with --target={target}: a target compiles for '
            f'its own devices ({targets.get(target).devices}); drop --cpu_devices'
        )
    if MEASURE_MEMORY.value:
        check_measurable(target)
    if not target:  # on a TPU host: its own chips, priced and held against their memory
        target = on_chip(targets.here())
    devices = targets.devices(target, F.VERBOSE.value) if target else None
    # on the CPU: beside the measured time; a target's programs cannot run here
    measure = cost.HARDWARE[HARDWARE.value].emulation and not target
    if PROGRAM.value:
        jitted, args = load_program(PROGRAM.value, devices)
        hardware = None if target else HARDWARE.value
        kwargs = {'hardware': hardware, 'measure': measure, 'target': target}
        data = compiled_program(jitted, args, PROGRAM.value, **kwargs).json()
        if HOSTS.value > 1:
            from . import hosts
            from .program import _mesh_of

            hosts.price_report(data, hosts.lay(_mesh_of(args).shape.items(), HOSTS.value))
        return data, True
    from shard_parity.devices import use_matmul_precision
    from shard_parity.mesh import mesh_for
    from shard_parity.runtime import from_flags

    from .twins import inspect

    # the train CLI's plan, with its checks and messages
    plan = from_flags.plan(devices=devices if TARGET.value else None)
    mesh = mesh_for(plan, AxisType.Auto, devices=devices)
    use_matmul_precision(plan.precision.matmul)
    report = inspect(
        F.MODEL.value, from_flags.train_config(), mesh, plan, from_flags.model_config(),
        HARDWARE.value, measure, HOSTS.value, target=target,
    )  # fmt: skip
    if MEASURE_MEMORY.value:
        from .measured import one_device_peak

        report['measured_memory'] = {'one_device': one_device_peak(
            F.MODEL.value, from_flags.train_config(), from_flags.model_config())}  # fmt: skip
    return report, False


def check_measurable(target) -> None:
    """--measure_memory runs the twins' one-device step on this machine's device, which must
    keep memory_stats(): anything else is one line, before anything compiles."""
    import jax

    if PROGRAM.value or target:
        given = f'--program={PROGRAM.value}' if PROGRAM.value else f'--target={target}'
        raise UsageError(f'--measure_memory runs the one-device train step on this machine; '
                         f'{given} does not: drop one of them')  # fmt: skip
    device = jax.devices()[0]
    if device.memory_stats() is None:
        raise UsageError(
            f'--measure_memory reads the device\'s memory_stats(), which {device.platform} '
            'devices do not keep: run it on a TPU (or GPU) host'
        )


def main(argv):
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}')
    try:
        for flag in (HTML, TRACE):
            if flag.value:
                check_output(flag, flag.value)
        report, own = report_of_flags()
    except (UsageError, targets.TargetError) as e:
        if F.VERBOSE.value:
            traceback.print_exc()
        refuse(str(e))  # a bad input, or a target this machine cannot compile for
    if JSON.value:
        print(json.dumps(report, indent=1))
    elif own:
        from .render import program_text

        print(program_text(report), end='')
    else:
        from .reconcile import print_expected

        print_report(report)
        print_attribution(report)
        print_expected(report)
        print_measured(report)
    if 'hosts' in report and not JSON.value:
        from .hosts import print_hosts

        print_hosts(report)
    if HTML.value:
        from .html import write_html

        print(f'wrote {write_html(report, HTML.value)}', file=sys.stderr)
    if TRACE.value:
        from .trace import write_trace

        print(f'wrote {write_trace(report, TRACE.value)}', file=sys.stderr)
    found = sum(len(s) for s in report['surprises'].values())
    if FAIL_ON_SURPRISE.value and found:  # the program disagrees with what was expected
        refuse(f'{found} surprise(s) flagged (--fail_on_surprise)', 1)


def run():
    declare_key_flags(
        [F.MODEL, F.STRATEGY, F.MESH, F.TRAIN['batch_size'], *F.TRANSFORMER_SHAPE, *F.PRECISION, F.CPU_DEVICES]
        + [F.CPU_FMA, F.NUM_DEVICES, F.MICROBATCHES, F.PP_SCHEDULE, F.PP_VIRTUAL, HOSTS]
        + [F.SHARD_OPTIMIZER]
        + [HARDWARE, TARGET, HTML, TRACE]
        + [FAIL_ON_SURPRISE, PROGRAM, MEASURE_MEMORY, JSON]
        + [F.VERBOSE]
    )
    app.run(main, flags_parser=parse_flags)
