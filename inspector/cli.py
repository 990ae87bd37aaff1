"""The inspector's command line, `python -m inspector`: this repository's twins for one strategy,
or any program of yours.

    python -m inspector --model=mlp --cpu_devices=8
    python -m inspector --model=transformer --strategy=fsdp --hardware=tpu-v5e-8 \
        --html=/tmp/fsdp.html --trace=/tmp/fsdp.json --cpu_devices=8
    python -m inspector --program=mypkg.mymod:build --cpu_devices=8

`--program=MODULE:FUNCTION`: FUNCTION() (in a module on PYTHONPATH) builds its mesh and returns
(jitted function, tuple of its arguments: arrays or jax.ShapeDtypeStructs with shardings).
"""

import importlib
import json
import sys

import jax
from absl import app, flags
from jax.sharding import AxisType

from shard_parity import UsageError
from shard_parity.mesh import configure_jax
from shard_parity.runtime import declare_key_flags
from shard_parity.runtime import flags as F
from shard_parity.runtime.train import mesh_from_flags

from . import cost
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
HOSTS = flags.DEFINE_integer(
    'hosts', 1, 'Lay the mesh over this many hosts, outer axes across hosts (as '
    'mesh_utils.create_hybrid_device_mesh): a collective whose devices span hosts is priced at '
    'the inter-host link (inspector/hosts.py).', lower_bound=1
)  # fmt: skip
PROGRAM = flags.DEFINE_string(
    'program', None, 'MODULE:FUNCTION: inspect the jitted function FUNCTION() returns, with '
    'its arguments, instead of the twins.'
)  # fmt: skip


def load_program(spec: str):
    """FUNCTION() of MODULE, for --program=MODULE:FUNCTION: (jitted, args)."""
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
    built = build()
    if not (isinstance(built, tuple) and len(built) == 2 and hasattr(built[0], 'lower')):
        raise UsageError(
            f'--program: {spec}() must return (jitted function, tuple of its arguments)'
        )
    return built


def report_of_flags():
    configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
    if PROGRAM.value:
        from .program import inspect

        jitted, args = load_program(PROGRAM.value)
        measure = cost.HARDWARE[HARDWARE.value].emulation  # on the CPU: beside the measured time
        data = inspect(jitted, *args, hardware=HARDWARE.value, measure=measure).json()
        if HOSTS.value > 1:
            from . import hosts
            from .program import _mesh_of

            hosts.price_report(data, hosts.lay(_mesh_of(args).shape.items(), HOSTS.value))
        return data, True
    from .twins import inspect

    # the train CLI's checks, same messages
    plan, mesh = mesh_from_flags(AxisType.Auto, F.NUM_DEVICES.value or jax.device_count())
    config = F.train_config()
    measure = cost.HARDWARE[HARDWARE.value].emulation  # on the CPU: beside the measured time
    report = inspect(
        F.MODEL.value, config, mesh, plan.strategy, F.model_config(), HARDWARE.value, measure,
        F.MICROBATCHES.value, F.CP_LAYOUT.value, HOSTS.value,
    )  # fmt: skip
    return report, False


def main(argv):
    if len(argv) > 1:
        sys.exit(f'error: unexpected arguments {argv[1:]}')
    try:
        report, own = report_of_flags()
    except UsageError as e:
        if F.VERBOSE.value:
            raise
        sys.exit(f'error: {e}')
    if JSON.value:
        print(json.dumps(report, indent=1))
    elif own:
        from .render import program_text

        print(program_text(report), end='')
    else:
        from .expect import print_expected

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
        + [F.CPU_FMA, F.NUM_DEVICES, F.MICROBATCHES, HOSTS, HARDWARE, HTML, TRACE, FAIL_ON_SURPRISE, PROGRAM, JSON]
        + [F.VERBOSE]
    )
    app.run(main)
