"""The PNG plots of `python -m benchmarks.run`, one per section that has one, beside the tables
of benchmarks/report.py (where matplotlib is installed: the `plots` extra), and the pipeline's
bubble plot of `python -m benchmarks.pipeline --plot=PATH` (pipeline_plot)."""

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


def pipeline_plot(rows, path, schedules=()) -> None:
    """GPipe's bubble against M, measured two ways beside its formula, and each schedule's
    (benchmarks/pipeline.py's rows)."""
    import numpy as np

    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    m = [r['M'] for r in rows]
    fig, (ax, right) = plt.subplots(1, 2, figsize=(10, 3.2))
    ax.plot(m, [r['formula'] for r in rows], 'k--', label='(S-1)/(M+S-1)')
    ax.plot(m, [r['bubble'] for r in rows], 'o-', label='measured: compiled FLOPs')
    low, high = np.array([r['time_range'] for r in rows]).T
    mid = np.array([r['time_bubble'] for r in rows])
    ax.errorbar(m, mid, yerr=[mid - low, high - mid], fmt='s-', capsize=3,
                label='measured: step time (median, range)')  # fmt: skip
    ax.set(xscale='log', xlabel='microbatches M', ylabel='bubble fraction')
    ax.set_title(f'GPipe bubble, S = {rows[0]["S"]} stages (explicit/pp.py)', fontsize=10)
    ax.set_xticks(m, [str(x) for x in m])
    ax.legend(fontsize=8)
    marks = {'gpipe': dict(marker='o', ms=9, mfc='none'), '1f1b': dict(marker='x'),
             'interleaved': dict(marker='s')}  # GPipe's and 1F1B's coincide: both visible
    for i, (name, mark) in enumerate(marks.items()):
        mine = [r for r in schedules if r['schedule'] == name]
        if mine:
            x = [r['M'] for r in mine]
            right.plot(x, [r['formula'] for r in mine], f'C{i}--', lw=1)
            right.plot(x, [r['bubble'] for r in mine], f'C{i}', ls='none', **mark,
                       label=f"{name} (V = {mine[0]['V']})")  # fmt: skip
    right.set(xscale='log', xlabel='microbatches M', ylabel='bubble fraction')
    right.set_title("each schedule's bubble: FLOPs (marks), formula (dashes)", fontsize=10)
    ms = sorted({r['M'] for r in schedules})
    right.set_xticks(ms, [str(x) for x in ms])
    right.minorticks_off()
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
