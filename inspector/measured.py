"""The chip's own figure beside its compiler's: the one-device train step (the report's
`one_device` program, built as inspector/twins.py builds it) compiled on the device this process
runs on, run once on real arrays, and the device's memory_stats() read before and after.

    python -m inspector --model=transformer --dtype=bfloat16 --measure_memory --json   # on a TPU

`peak` is the runtime's peak_bytes_in_use after the step: the most the allocator held at once in
this process, which holds the step's arguments (the state and the batch, put there first) and
whatever the step allocated beside them. The state is made on the host (its initialisation
leaves no peak on the chip), so in a fresh process that peak is the step's, and `rose` says so:
false where something earlier in the process had held more (then the figure is not the step's).
`difference` is peak minus the compiler's peak_memory_in_bytes for the same executable.
"""

import jax
import numpy as np
from flax import nnx

from shard_parity import UsageError
from shard_parity.step import create_state, make_optimizer, one_device_train_step


def host_state(model: str, config, model_config):
    """(graphdef, state, loss, batch of zeros, tx): the one-device step's inputs, on the host."""
    from .twins import model_and_batch

    make_model, loss_fn, batch = model_and_batch(model, config.batch_size, model_config)
    tx = make_optimizer(config)
    try:
        host = jax.devices('cpu')[0]
    except RuntimeError:  # no CPU backend in this process: made on the default device
        host = None
    with jax.default_device(host):
        graphdef, state = create_state(make_model(nnx.Rngs(0)), tx)
        state = jax.tree.map(np.asarray, state)
    zeros = {k: np.zeros(v.shape, v.dtype) for k, v in batch.items()}
    return graphdef, state, loss_fn, zeros, tx


def one_device_peak(model: str, config, model_config, device=None, stats=None) -> dict:
    """The one-device step's memory on `device` (default: the first): its compiler's figures
    (memory_analysis(), bytes) and the runtime's peak_bytes_in_use after one step (module
    docstring). A device without memory_stats() (XLA:CPU) is refused in one line. `stats`:
    what reads them (default device.memory_stats; a test's stand-in on the CPU)."""
    device = device or jax.devices()[0]
    stats = stats or device.memory_stats
    if stats() is None:
        raise UsageError(
            f'--measure_memory reads the device\'s memory_stats(), which {device.platform} '
            'devices do not keep: run it on a TPU (or GPU) host'
        )
    graphdef, state, loss_fn, batch, tx = host_state(model, config, model_config)
    step = one_device_train_step(graphdef, loss_fn, tx)
    state, batch = jax.device_put((state, batch), device)
    compiled = step.lower(state, batch).compile()
    m = compiled.memory_analysis()
    before = stats()
    jax.block_until_ready(compiled(state, batch))
    after = stats()
    return {
        'device_kind': device.device_kind,
        'arguments': m.argument_size_in_bytes,
        'outputs': m.output_size_in_bytes,
        'aliased': m.alias_size_in_bytes,
        'temp': m.temp_size_in_bytes,
        'compiler_peak': m.peak_memory_in_bytes,
        'in_use_before': before['bytes_in_use'],
        'peak_before': before.get('peak_bytes_in_use', 0),
        'peak': after['peak_bytes_in_use'],
        'bytes_limit': after.get('bytes_limit'),
        'rose': after['peak_bytes_in_use'] > before.get('peak_bytes_in_use', 0),
        'difference': after['peak_bytes_in_use'] - m.peak_memory_in_bytes,
    }


FIELDS = ('arguments', 'outputs', 'aliased', 'temp', 'compiler_peak')


def figures(report: dict) -> dict:
    """What a target report says of each program that the chip's own compile can be held
    against: memory_analysis()'s fields (bytes) and the collectives (kind and group size, in
    order); with --measure_memory, the runtime's peak beside them (`measured`)."""
    out = {
        name: {k: m[k] for k in FIELDS}
        | {'collectives': [[op['kind'], op['group_size']] for op in report['programs'][name]]}
        for name, m in report['memory'].items()
    }
    for name, m in report.get('measured_memory', {}).items():
        out[name]['measured'] = {k: m[k] for k in ('peak', 'rose', 'in_use_before')}
    return out


def disagreements(chip: dict, shapes: dict) -> list[str]:
    """Each figure where the compile on the chip and the compile from shapes differ, in a line."""
    out = []
    for name in sorted(set(chip) | set(shapes)):
        a, b = chip.get(name), shapes.get(name)
        if a is None or b is None:
            out.append(f'{name}: compiled only {"from shapes" if a is None else "on the chip"}')
            continue
        out += [
            f'{name} {k}: {a[k]} on the chip, {b[k]} from shapes'
            for k in (*FIELDS, 'collectives')
            if a[k] != b[k]
        ]
    return out
