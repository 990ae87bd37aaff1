"""Section 7 of `python -m benchmarks.run --sections=context`: context parallelism, who holds what
of a sequence of T positions on 8 devices, its table and its plot.

dp gives each device whole sequences (8x1, one per device); cp splits one sequence 8 ways (1x8,
T/8 each). With `--target=tpu-v5e-8` (inspector/target.py) every program is compiled for that
TPU instead, nothing is timed, and each row also carries the TPU compiler's own peak.
"""

import dataclasses
import pathlib

import jax
from jax.sharding import NamedSharding

from benchmarks.report import _table
from benchmarks.sections import NANOGPT, mesh_plan, runner, setup
from benchmarks.timing import interleaved
from shard_parity import auto, explicit, typed
from shard_parity.inspector import target as targets
from shard_parity.mesh import mesh_for
from shard_parity.placement import place_batch, place_state, rows, state_shardings
from shard_parity.step import strategy_file

CANDIDATES = {  # name -> (twin, --strategy, --mesh, global batch, attention)
    'dp naive': (explicit, 'dp', '8x1', 8, 'naive'),
    'dp fused': (explicit, 'dp', '8x1', 8, 'fused'),
    'cp explicit': (explicit, 'cp', '1x8', 1, 'naive'),  # the ring ignores --attention
    'cp typed': (typed, 'cp', '1x8', 1, 'naive'),
    'cp auto': (auto, 'cp', '1x8', 1, 'naive'),  # XLA partitions naive attention
}
CONTEXT = tuple(CANDIDATES)  # the table's order


def abstract(state, batch, mesh, plan):
    """(state, batch) as ShapeDtypeStructs placed as `plan` places them on `mesh`: what a
    target's compiler needs (the target's devices hold no arrays)."""

    def shaped(x, s):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    on_rows = NamedSharding(mesh, rows(plan))
    return (
        jax.tree.map(shaped, state, state_shardings(state, mesh, plan)),
        jax.tree.map(lambda x: shaped(x, on_rows), batch),
    )


def context(lengths, timed_lengths, rounds: int, target: str | None = None) -> list[dict]:
    """7. One transformer block (4 heads of 32, width 128) at sequence length T on 8 devices:
    XLA's temporary memory per device of the compiled train step (memory_analysis: the same
    program runs on every device), and the step time where T is short enough to run here.
    Each device holds T positions under dp, T/8 under cp. Beside cp, the analytic expectation
    (`cp_expected_bytes`): flash attention's memory on whole sequences (dp fused) split 8 ways,
    what a ring that keeps no score matrix (shard_parity/model/ring.py) should approach.
    `target`: compile for that hardware instead (nothing timed); a program its HBM cannot hold
    is recorded with the compiler's reason."""
    devices = targets.devices(target) if target else None
    chip = targets.get(target) if target else None
    out = []
    for t in lengths:
        row, runs = {'seq_len': t} | ({'target': target} if target else {}), {}
        for name, (twin, strategy, text, b, attn) in CANDIDATES.items():
            config = dataclasses.replace(NANOGPT, seq_len=t, num_layers=1, attention=attn)
            graphdef, tx, state, loss, batch, units = setup('transformer', b, config)
            plan = mesh_plan(text, strategy, 8)
            mesh = mesh_for(plan, twin.AXIS_TYPE, devices=devices)
            step = strategy_file(twin, plan).train_step(graphdef, loss, tx, mesh, plan)
            if target:
                with targets.uncached():
                    try:
                        compiled = step.lower(*abstract(state, batch, mesh, plan)).compile()
                    except Exception as e:  # the chip's HBM cannot hold it: say so, go on
                        if (why := targets.does_not_fit(e)) is None:
                            raise
                        row[f'{name}_does_not_fit'] = why
                        continue
                m = targets.memory(compiled, chip)
                row[f'{name}_peak_bytes'] = m['peak']  # the TPU compiler's own peak
            else:
                placed = place_state(state, mesh, plan), place_batch(batch, mesh, plan)
                compiled = step.lower(*placed).compile()
            row[f'{name}_temp_bytes'] = compiled.memory_analysis().temp_size_in_bytes
            row[f'{name}_tokens_per_device'] = b * t // 8
            if t in timed_lengths and not target:
                runs[name] = runner(twin, 8, 'transformer', b, 3, config, text, strategy)
        if 'dp fused_temp_bytes' in row:
            row['cp_expected_bytes'] = row['dp fused_temp_bytes'] / 8
        if runs:
            med = interleaved(runs, rounds, warmup=1)
            row |= {f'{k}_ms': 1e3 * med[k] / runs[k].steps for k in runs}
        out.append(row)
    return out


def markdown(rows: list) -> list:
    def ms(x, name):
        return f"{x[f'{name}_ms']:.0f}" if f'{name}_ms' in x else '—'

    def mib(x, name, key='temp'):  # results of before cp typed existed lack it
        if f'{name}_does_not_fit' in x:
            return 'does not fit'
        return f"{x[f'{name}_{key}_bytes'] / 2**20:,.1f}" if f'{name}_{key}_bytes' in x else '—'

    def expected(x):  # dp fused / 8, and explicit cp's multiple of it
        want = x.get('cp_expected_bytes', x.get('dp fused_temp_bytes', 0) / 8)
        if not want or 'cp explicit_temp_bytes' not in x:
            return ['—', '—']
        return [f'{want / 2**20:,.1f}', f"{x['cp explicit_temp_bytes'] / want:.2f}"]

    table = [
        [f"{x['seq_len']:,}", *(mib(x, n) for n in CONTEXT), *expected(x)]
        + [ms(x, n) for n in CONTEXT]
        for x in rows
    ]
    target = rows[0].get('target') if rows else None
    out = [
        '\n**7. Context parallelism** (one block, 4 heads of 32, width 128, 8 devices; XLA '
        'temporary memory per device of the compiled train step, MiB; ms per step where run. '
        'dp: 8x1, one whole sequence per device; cp: 1x8, one sequence split 8 ways; expected: '
        'dp fused / 8, flash attention split 8 ways; issue 22 asks cp explicit / expected <= 1.5'
        + (f'; compiled for {target}, nothing run' if target else '')
        + ')\n',
        _table(
            ['T', *(f'{n} MiB' for n in CONTEXT), 'expected MiB', 'cp explicit / expected']
            + [f'{n} ms' for n in CONTEXT],
            table,
        ),
    ]
    if target:  # on a TPU temp is not the peak: the compiler's own peak, beside it
        out += [
            f"\nThe same programs' peak on {target} (MiB per device, the TPU compiler's "
            'peak_memory_in_bytes: arguments and live buffers at their largest)\n',
            _table(
                ['T', *(f'{n} peak MiB' for n in CONTEXT)],
                [[f"{x['seq_len']:,}", *(mib(x, n, 'peak') for n in CONTEXT)] for x in rows],
            ),
        ]
    return out


def plot(rows: list, out: pathlib.Path, suffix: str = '') -> None:
    """context.png: temp per device against T, one line per candidate, and the expectation."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from shard_parity.runtime.report import atomic_write

    fig, ax = plt.subplots(figsize=(6, 4))
    lengths = [x['seq_len'] for x in rows]
    for name in CONTEXT:
        mib = [x.get(f'{name}_temp_bytes', float('nan')) / 2**20 for x in rows]
        ax.loglog(lengths, mib, 'o-', label=name)
    expected = [x.get('dp fused_temp_bytes', float('nan')) / 8 / 2**20 for x in rows]
    ax.loglog(lengths, expected, 'k--', label='expected: dp fused / 8')
    ax.minorticks_off()  # the lengths' own labels only
    ax.set(
        xlabel='sequence length T',
        ylabel='MiB per device',
        title='train step temporary memory, 8 devices'
        + (f" ({rows[0]['target']})" if rows and rows[0].get('target') else ''),
        xticks=lengths,
        xticklabels=[f'{t:,}' for t in lengths],
    )
    ax.legend(fontsize=7)
    atomic_write(out / f'context{suffix}.png', lambda f: fig.savefig(f, format='png', dpi=90))
    plt.close(fig)
