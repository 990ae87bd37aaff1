"""The inspector over this repository's own programs: the train step of the one-device run,
auto/, explicit/ and typed/ for one strategy, compiled from shapes alone (no data is read), each
read by inspector.program.analyse, compared with the analytic expectation (inspector.expect) and
with each other: whatever auto/ moves that explicit/ does not (`differences`), and typed/ likewise
against explicit/ (`typed_differences`), now with the lines on both sides (`difference_lines`).
Where the plan names a compiled form as what it does the work of (`written_forms`: ZeRO-1's
reduce-scatter compiled as an all-reduce and a slice), each side is compared as written, and the
form is listed with its mechanism (`same_as_written`), not as a difference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from shard_parity import UsageError, auto, explicit, typed
from shard_parity.mesh import DATA, FSDP, STAGE, with_axis_type
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.placement import rows, state_shardings
from shard_parity import config as cfg
from shard_parity.runtime import tasks
from shard_parity.step import (
    Accumulated, create_state, make_optimizer, one_device_train_step, strategy_file,
)  # fmt: skip

from . import cost, hosts as by_host, policy, reconcile, surprises
from . import target as targets
from .attribute import shorten
from .compare import difference_lines, differences, mark_differences, named_lines, written_forms
from .expect import expectation
from .program import VERSION, analyse, bytes_by_line, compile_all, measure_us


def model_and_batch(model: str, batch_size: int, model_config=None):
    """(model factory, loss, abstract host batch) for `model`, without touching any data."""
    if model == 'mlp':
        batch = {
            'image': jax.ShapeDtypeStruct((batch_size, 784), jnp.float32),
            'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32),
        }
        return (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs)), tasks.classification_loss, batch
    model_config = model_config or cfg.TransformerConfig()
    tokens = jax.ShapeDtypeStruct((batch_size, model_config.seq_len), jnp.int32)
    return (
        (lambda rngs: Transformer(model_config, rngs=rngs)),
        tasks.lm_loss,
        {'x': tokens, 'y': tokens},
    )


def with_sharding(tree, mesh, spec):
    s = NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)


def lowered_steps(model, config, mesh, plan, model_config, one_device=None, refused=None):
    """The abstract params, and a generator of (name, (lowered train step, its mesh, its
    abstract args, its strategy file)): lowered one at a time, as the compiler asks for them.
    Each twin runs its file for `plan` (step.strategy_file, as the train CLI does); auto or
    typed, where it refuses the plan (--reduce_dtype=bfloat16), is left out and its one line
    goes into `refused` ({twin: line}); explicit/, the reference, refuses for all.
    `one_device`: the device the one-device program is compiled for (a --target's first;
    default: this process's default device)."""
    modules = {}
    for twin in (auto, explicit, typed):
        try:
            modules[twin.NAME] = strategy_file(twin, plan)
        except UsageError as e:
            if twin is explicit or refused is None:
                raise
            refused[twin.NAME] = getattr(e, 'reason', str(e))  # NarrowReduce: explicit is shown
    make_model, loss_fn, batch = model_and_batch(model, config.batch_size, model_config)
    loss_fn = Accumulated(loss_fn, config.gradient_accumulation_steps)  # K microbatches a step
    tx = make_optimizer(config)
    graphdef, state = nnx.eval_shape(lambda: create_state(make_model(nnx.Rngs(0)), tx))

    def steps():
        step = one_device_train_step(graphdef, loss_fn, tx)
        args = (state, batch)
        if one_device is not None:  # unplaced shapes compile for the default backend
            s = jax.sharding.SingleDeviceSharding(one_device)
            args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), args)
        yield 'one_device', (step.lower(*args), None, args, None)
        for twin in (t for t in (auto, explicit, typed) if t.NAME in modules):
            twin_mesh = with_axis_type(mesh, twin.AXIS_TYPE)  # typed/: the same devices, Explicit
            shardings = state_shardings(state, twin_mesh, plan)
            abstract = jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
            )
            module = modules[twin.NAME]
            step = module.train_step(graphdef, loss_fn, tx, twin_mesh, plan)
            args = (abstract, with_sharding(batch, twin_mesh, rows(plan)))
            yield twin.NAME, (step.lower(*args), twin_mesh, args, shorten(module.__file__))

    return state.params, steps()


def read_steps(steps, weights, plan, hardware, measure, target=None) -> dict:
    """{name: analyse()'s result, with surprises, sources and strategy lines} for the lowered
    train steps `steps` yields; each is lowered while the one before it compiles. `target`:
    inspector.target.Target they were compiled for (adds memory against its HBM)."""
    meta = {}

    def lowered():
        for name, (lowered, *rest) in steps:
            meta[name] = rest
            yield name, lowered

    compiled_steps = compile_all(lowered())
    out = {}
    for name, (twin_mesh, args, source) in meta.items():
        compiled, logs, partitioned = compiled_steps[name]
        result = out[name] = analyse(compiled, twin_mesh, hardware, logs, target, partitioned)
        expect = (FSDP,) if twin_mesh and plan.uses(FSDP) else ()  # gathers
        expect += (DATA,) if twin_mesh and plan.zero1 else ()  # ZeRO-1's params, once a step
        result['surprises'] = (
            surprises.program_surprises(result, weights, expect) if twin_mesh else []
        )
        if twin_mesh:  # each operand's dtype against the precision policy
            result['surprises'] += policy.audit(result['ops'], plan)
            result['dtypes'] = policy.rows(result['ops'])
        if measure:
            result['predicted']['measured_us'] = measure_us(compiled, args)
        result['source'] = {'file': source, 'bytes_by_line': bytes_by_line(result['ops'], source)}
        for op in result['ops']:  # the line of the strategy file on the collective's stack
            op['strategy_line'] = next(
                (f.partition(' ')[0] for f in op['stack'] if source and f.startswith(source + ':')),
                '',
            )
    return out


def inspect(model: str, config: cfg.TrainConfig, mesh, plan, model_config=None,
            hardware: str = 'h100x8', measure: bool = False, hosts: int = 1,
            target: str | None = None) -> dict:  # fmt: skip
    """Compiles the train steps and returns their collectives, attribution, predicted cost,
    surprises and the expectation. `model_config`: the transformer's shape (default:
    TransformerConfig()); unused by the MLP. `measure`: also time each step on this machine.
    `plan`: the plan the train CLI would run (--mesh and every option; its mesh is `mesh`).
    `hosts`: the mesh laid over that many hosts (inspector/hosts.py), outer axes across hosts,
    each collective priced by the link its devices span.
    `target`: an inspector.target name (`mesh` is then over its devices, mesh_from_flags(on=)):
    every program compiled for it, priced on its own hardware, with its memory per device.
    Under --pp_schedule=1f1b or interleaved, the expectation is theirs (inspector/pieces.py)."""
    model_config = model_config or cfg.TransformerConfig()
    over_hosts = by_host.lay(mesh.shape.items(), hosts)  # a bad --hosts: one line, uncompiled
    chosen = targets.get(target) if target else None
    hardware = chosen.hardware if chosen else hardware
    one = mesh.devices.flat[0] if chosen else None
    refused = {}
    params, steps = lowered_steps(model, config, mesh, plan, model_config, one, refused)
    weights = [
        (jax.tree_util.keystr(p), int(np.prod(x.shape)))
        for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
    ]
    read = read_steps(steps, weights, plan, hardware, measure and not chosen, chosen)
    if hosts > 1:
        for result in read.values():
            by_host.price(result, over_hosts, hardware)
    programs = {name: r['ops'] for name, r in read.items()}
    found = {name: r['surprises'] for name, r in read.items()}
    forms = written_forms(plan)
    lines = difference_lines(programs, 'auto', forms) + difference_lines(programs, 'typed', forms)
    named = named_lines(programs, 'auto', forms) + named_lines(programs, 'typed', forms)
    mark_differences(programs, lines, forms)
    for d in lines:  # explicit/ is the reference: the difference is the other twin's surprise
        found[d['twin'] if d['twin'] != 'explicit' else d['sibling']].append(
            {'kind': 'twin-difference', 'what': d['what'], 'op': '', 'file': d['file'],
             'line': d['line']}
        )  # fmt: skip
    expected = expectation(plan, model, params, mesh, config.batch_size, model_config,
                           config.gradient_accumulation_steps)
    # the reference against its expectation; for a target, a row no mechanism found in the
    # program explains is a surprise (inspector/reconcile.py)
    verdicts = reconcile.rows(expected['collectives'], programs.get('explicit', []))
    if chosen and 'explicit' in found:
        found['explicit'] += reconcile.surprises(verdicts)
    return {
        'version': VERSION,
        'model': model,
        'strategy': plan.strategy,
        **({'pp_schedule': plan.schedule, 'pp_virtual': plan.chunks}
           if plan.uses(STAGE) and plan.schedule != 'gpipe' else {}),
        'devices': mesh.size,
        'mesh': 'x'.join(map(str, mesh.devices.shape)),
        'axes': list(mesh.axis_names),
        'batch_size': config.batch_size,
        'hardware': hardware,
        'hardware_note': cost.HARDWARE[hardware].sources,
        'programs': programs,
        'precision': dataclasses.asdict(plan.precision),
        'dtypes': {name: r['dtypes'] for name, r in read.items() if 'dtypes' in r},
        'predicted': {name: r['predicted'] for name, r in read.items()},
        'warnings': {name: r['warnings'] for name, r in read.items()},
        'surprises': found,
        'sources': {name: r['source'] for name, r in read.items()},
        'expected': expected,
        'expected_vs_compiled': verdicts,
        'refused': refused,  # {twin: its one line}: a twin that cannot run the plan as asked
        'differences': (
            differences(programs['auto'], programs['explicit'], 'auto', forms)
            if 'auto' in programs else None
        ),
        'typed_differences': (
            differences(programs['typed'], programs['explicit'], 'typed', forms)
            if 'typed' in programs else None
        ),
        'difference_lines': lines,
        'same_as_written': named,  # a compiled form named for what it does: no difference
    } | ({'hosts': by_host.report(programs, over_hosts, hardware)} if hosts > 1 else {}) | (
        target_fields(chosen, read) if chosen else {}
    )


def target_fields(chosen, read: dict) -> dict:
    """What a --target report adds: the target, its devices, and each program's memory."""
    return {
        'target': chosen.name,
        'device_kind': chosen.device_kind,
        'target_here': chosen.here,  # compiled on these chips (target.here()), not from shapes
        'memory': {name: r['memory'] for name, r in read.items()},
    }
