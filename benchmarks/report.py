"""Turns benchmark results into the Markdown tables the README carries, and PNG plots."""

import pathlib

from shard_parity.report import atomic_write

NANOGPT_MS, NANOGPT_TOKENS = 45.0, 17_000  # nanoGPT's PyTorch run, same config and machine type


def _table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def _ratio(x: dict) -> str:
    """The ratio, and with several processes each one's: '0.994 (0.975, 1.001, 0.994)'."""
    runs = x.get('explicit_over_auto_runs')
    text = f"{x['explicit_over_auto']:.3f}"
    return text + (f" ({', '.join(f'{v:.3f}' for v in runs)})" if runs else '')


def markdown(r: dict) -> str:
    m = r['machine']
    out = [
        f"Machine: {m['devices']} {m['platform']} devices ({m['device_kind']}) on {m['cpu_count']} "
        f"cores, jax {m['jax']}, {m['date']}"
        + (', XLA:CPU fused multiply-adds on' if m.get('cpu_fma') else '')
        + (
            f"; the transformer computes in {m['transformer_dtype']} with "
            f"{m['transformer_attention']} attention (the MLP in float32)"
            if m['platform'] != 'cpu' and 'transformer_dtype' in m
            else ''
        )
        + f". Command: `{r['command']}`"
    ]
    if 'twins' in r:
        out += [
            '\n**1. auto vs explicit vs one-device reference** (median ms per step; target '
            'for explicit/auto: 0.95–1.05'
            + (
                f"; of {len(r['twins'][0]['explicit_over_auto_runs'])} fresh processes, the one "
                'with the median ratio, and every process\'s ratio in brackets'
                if r['twins'] and 'explicit_over_auto_runs' in r['twins'][0]
                else ''
            )
            + ')\n',
            _table(
                [
                    'model',
                    'global batch',
                    'devices',
                    'reference',
                    'auto',
                    'explicit',
                    'explicit/auto',
                ],
                [
                    [
                        x['model'],
                        x['batch'],
                        x['devices'],
                        f"{x['reference_ms']:.2f}",
                        f"{x['auto_ms']:.2f}",
                        f"{x['explicit_ms']:.2f}",
                        _ratio(x),
                    ]
                    for x in r['twins']
                ],
            ),
        ]
    if 'sweep' in r:
        rows = [
            [
                x['model'],
                x['mode'],
                x['devices'],
                x['batch'],
                x['twin'],
                f"{x['step_ms']:.2f}",
                f"{x['per_sec']:,.0f}",
            ]
            for x in r['sweep']
        ]
        out += [
            '\n**2. Device-count sweep** (examples/s for the MLP, tokens/s for the transformer)\n',
            _table(['model', 'mode', 'devices', 'global batch', 'twin', 'ms/step', 'per s'], rows),
        ]
    if 'attention' in r:
        rows = [
            [
                x['seq_len'],
                f"{x['naive_ms']:.2f}",
                f"{x['fused_ms']:.2f}",
                f"{x['naive_temp_bytes'] / 2**20:,.1f}",
                f"{x['fused_temp_bytes'] / 2**20:,.1f}",
            ]
            for x in r['attention']
        ]
        out += [
            '\n**3. Attention, forward + backward of one layer** (B=1, 4 heads of 32; '
            'XLA temporary memory from `memory_analysis()`)\n',
            _table(['seq_len', 'naive ms', 'fused ms', 'naive temp MiB', 'fused temp MiB'], rows),
        ]
    if 'generation' in r:
        rows = [
            [
                x['new_bytes'],
                f"{x['padded_bytes_per_sec']:,.0f}",
                f"{x['kv_cache_bytes_per_sec']:,.0f}",
                f"{x['kv_cache_bytes_per_sec'] / x['padded_bytes_per_sec']:.2f}",
            ]
            for x in r['generation']
        ]
        out += [
            '\n**4. Generation** (bytes/s, one device, nanoGPT config, random weights)\n',
            _table(['new bytes', 'padded', 'KV cache', 'KV/padded'], rows),
        ]
    if 'nanogpt' in r:
        x, cpu = r['nanogpt'], m['platform'] == 'cpu'
        header = ['ms/step', 'tokens/s', 'nanoGPT (PyTorch, 2-core CPU) ms/step']
        two = 'two_devices_step_ms' in x
        header += ['2 devices ms/step'] if two else []
        header += ['forward ms', 'step/forward', 'achieved GFLOP/s', 'matmul peak GFLOP/s']
        row = [f"{x['step_ms']:.2f}", f"{x['tokens_per_sec']:,.0f}", f'~{NANOGPT_MS:.0f}']
        row += [f"{x['two_devices_step_ms']:.1f}"] if two else []
        row += [
            f"{x['forward_ms']:.2f}",
            f"{x['step_over_forward']:.1f}",
            f"{x['achieved_flops_per_sec'] / 1e9:.1f}",
            f"{x['matmul_peak_flops_per_sec'] / 1e9:,.1f}",
            f"{100 * x['fraction_of_peak']:.2g}%",
        ]
        where = (
            f"timed in a process of {x.get('process_devices', m['devices'])} emulated devices"
            if cpu
            else f"one {m['device_kind']}, {m['transformer_dtype']} compute, "
            f"{m['transformer_attention']} attention; peak: a {m['transformer_dtype']} 8192³ matmul"
        )
        out += [
            f"\n**5. Transformer at nanoGPT's CPU configuration, one device** (batch 12 × 64 "
            f'bytes; {where})\n',
            _table(header + ['of peak'], [row]),
        ]
    if 'strategies' in r:
        rows = [
            [
                x['model'],
                x['strategy'],
                x['twin'],
                x['mesh'],
                f"{x['step_ms']:.2f}",
                f"{x['state_bytes_per_device'] / 2**20:,.2f}",
            ]
            for x in r['strategies']
        ]
        out += [
            '\n**6. Strategies** (median ms per step on a DATA x MODEL mesh; parameters + '
            'optimizer state held by one device)\n',
            _table(['model', 'strategy', 'twin', 'mesh', 'ms/step', 'state MiB/device'], rows),
        ]
    return '\n'.join(out) + '\n'


def plots(r: dict, out: pathlib.Path, suffix: str = '') -> None:
    try:
        import matplotlib

        matplotlib.use('Agg')
        from matplotlib import pyplot as plt
    except ImportError:
        return
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
    if 'sweep' in r:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, model in zip(axes, ('mlp', 'transformer')):
            for mode in ('fixed global batch', 'fixed per-device batch'):
                for twin in ('auto', 'explicit'):
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
