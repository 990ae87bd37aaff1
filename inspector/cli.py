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

import importlib
import inspect as pyinspect
import json
import os
import sys
import tempfile

import jax
from absl import app, flags
from jax.sharding import AxisType

from shard_parity import UsageError, refuse
from shard_parity.mesh import configure_jax
from shard_parity.runtime import declare_key_flags, parse_flags
from shard_parity.runtime import flags as F

from . import cost
from . import target as targets
from .render import print_attribution, print_report

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
PROGRAM = flags.DEFINE_string(
    'program', None, 'MODULE:FUNCTION: inspect the jitted function FUNCTION() returns, with '
    'its arguments, instead of the twins.'
)  # fmt: skip


def load_program(spec: str, devices=None):
    """FUNCTION() of MODULE, for --program=MODULE:FUNCTION: (jitted, args). `devices`: a
    --target's, passed as FUNCTION(devices=...) when it takes them (to build its mesh from)."""
    module_name, _, function = spec.partition(':')
    if not module_name or not function:
        raise UsageError(f'--program={spec}: expected MODULE:FUNCTION, e.g. mypkg.mymod:build')
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f'--program: cannot import {module_name!r} ({e}): is it on PYTHONPATH?')
    build = getattr(module, function, None)
    if not callable(build):
        raise UsageError(f'--program: {module_name} has no function {function}()')
    takes = devices is not None and 'devices' in pyinspect.signature(build).parameters
    built = build(devices=devices) if takes else build()
    if not (isinstance(built, tuple) and len(built) == 2 and hasattr(built[0], 'lower')):
        raise UsageError(
            f'--program: {spec}() must return (jitted function, tuple of its arguments)'
        )
    return built


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


def report_of_flags():
    configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value, libtpu_lines=F.VERBOSE.value)
    target = TARGET.value
    if target and flags.FLAGS[HARDWARE.name].present:
        raise UsageError(
            f'--hardware={HARDWARE.value} with --target={target}: a target\'s program is priced '
            f'on its own hardware ({targets.get(target).hardware}); drop --hardware'
        )
    devices = targets.devices(target, F.VERBOSE.value) if target else None
    # on the CPU: beside the measured time; a target's programs cannot run here
    measure = cost.HARDWARE[HARDWARE.value].emulation and not target
    if PROGRAM.value:
        from .program import inspect

        jitted, args = load_program(PROGRAM.value, devices)
        hardware = None if target else HARDWARE.value
        data = inspect(jitted, *args, hardware=hardware, measure=measure, target=target).json()
        if HOSTS.value > 1:
            from . import hosts
            from .program import _mesh_of

            hosts.price_report(data, hosts.lay(_mesh_of(args).shape.items(), HOSTS.value))
        return data, True
    from shard_parity.runtime.training import mesh_from_flags

    from .twins import inspect

    # the train CLI's checks, same messages
    count = F.NUM_DEVICES.value or (len(devices) if target else jax.device_count())
    plan, mesh = mesh_from_flags(AxisType.Auto, count, on=devices, schedules=True)
    config = F.train_config()
    report = inspect(
        F.MODEL.value, config, mesh, plan.strategy, F.model_config(), HARDWARE.value, measure,
        F.MICROBATCHES.value, F.CP_LAYOUT.value, HOSTS.value, target=target,
        schedule=F.PP_SCHEDULE.value, virtual=F.PP_VIRTUAL.value,
    )  # fmt: skip
    return report, False


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
            raise
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
    if FAIL_ON_SURPRISE.value and found:
        sys.exit(f'error: {found} surprise(s) flagged (--fail_on_surprise)')


def run():
    declare_key_flags(
        [F.MODEL, F.STRATEGY, F.MESH, F.TRAIN['batch_size'], *F.TRANSFORMER_SHAPE, F.CPU_DEVICES]
        + [F.CPU_FMA, F.NUM_DEVICES, F.MICROBATCHES, F.PP_SCHEDULE, F.PP_VIRTUAL, HOSTS]
        + [HARDWARE, TARGET, HTML, TRACE]
        + [FAIL_ON_SURPRISE, PROGRAM, JSON]
        + [F.VERBOSE]
    )
    app.run(main, flags_parser=parse_flags)
