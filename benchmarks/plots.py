"""The PNG plots of `python -m benchmarks.run`, one per section that has one, beside the tables
of benchmarks/report.py (where matplotlib is installed: the `plots` extra)."""

import pathlib

from shard_parity.runtime.report import atomic_write


def plots(r: dict, out: pathlib.Path, suffix: str = '') -> None:
    try:
        import matplotlib

        matplotlib.use('Agg')
        from matplotlib import pyplot as plt
    except ImportError:
        return
    if r.get('twins') and 'processes_ms' in r['twins'][0]:
        fig, axes = plt.subplots(
            1, len(r['twins']), figsize=(5 * len(r['twins']), 4), squeeze=False
        )
        for ax, x in zip(axes[0], r['twins']):
            steps = x['processes_ms']
            for name, marker in (
                ('auto', 'o'),
                ('auto_copy', '.'),
                ('explicit', 's'),
                ('typed', '^'),
            ):
                if f'{name}_ms' in steps[0]:
                    ys = [p[f'{name}_ms'] for p in steps]
                    ax.plot(range(1, len(ys) + 1), ys, marker, label=name.replace('_', ' '))
            ax.set(
                xticks=range(1, len(steps) + 1),
                xlabel='fresh process, in the order they ran',
                ylabel='ms per step (median of its rounds)',
                title=f"{x['model']}, {x['devices']} devices",
            )
            ax.legend(fontsize=7)
        atomic_write(out / f'twins{suffix}.png', lambda f: fig.savefig(f, format='png', dpi=90))
        plt.close(fig)
    if 'attention' in r:
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        lengths = [x['seq_len'] for x in r['attention']]
        for name in ('naive', 'fused'):
            a.loglog(lengths, [x[f'{name}_ms'] for x in r['attention']], 'o-', label=name)
            b.loglog(
                lengths, [x[f'{name}_temp_bytes'] / 2**20 for x in r['attention']], 'o-', label=name
            )
        a.set(xlabel='sequence length', ylabel='ms (fwd + bwd)', title='attention latency')
        b.set(xlabel='sequence length', ylabel='MiB', title='XLA temporary memory')
        a.legend(), b.legend()
        atomic_write(out / f'attention{suffix}.png', lambda f: fig.savefig(f, format='png', dpi=90))
        plt.close(fig)
    if 'memory' in r:
        from benchmarks import memory

        memory.plot(r['memory'], out, suffix)
    if 'context' in r:
        from benchmarks import context

        context.plot(r['context'], out, suffix)
    if 'sweep' in r:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, model in zip(axes, ('mlp', 'transformer')):
            for mode in ('fixed global batch', 'fixed per-device batch'):
                for twin in sorted({x['twin'] for x in r['sweep']}):
                    xs = [
                        x
                        for x in r['sweep']
                        if (x['model'], x['mode'], x['twin']) == (model, mode, twin)
                    ]
                    ax.plot(
                        [x['devices'] for x in xs],
                        [x['per_sec'] for x in xs],
                        'o-',
                        label=f'{twin}, {mode}',
                    )
            ax.set(
                xlabel='devices',
                ylabel='examples/s' if model == 'mlp' else 'tokens/s',
                title=model,
                xscale='log',
                xticks=[1, 2, 4, 8],
                xticklabels=['1', '2', '4', '8'],
            )
            ax.legend(fontsize=7)
        atomic_write(out / f'sweep{suffix}.png', lambda f: fig.savefig(f, format='png', dpi=90))
        plt.close(fig)
