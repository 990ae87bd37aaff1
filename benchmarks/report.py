"""Turns benchmark results into the Markdown tables the README carries (the plots:
benchmarks/plots.py; a section with a module of its own brings its own table, drawn with
benchmarks/tables.py as these are)."""

import statistics

from benchmarks.tables import RATES, markdown_table, rate

NANOGPT_MS = 45.0  # nanoGPT's PyTorch step, same configuration and machine type
def _ratio(x: dict, key: str = 'explicit_over_auto') -> str:
    """The ratio; with several processes, the median over them (the lower middle one of an even
    count) and their range: '0.994 (0.975–1.001)'. Missing (a run from before the control
    existed): '-'."""
    if key not in x:
        return '-'
    runs = x.get(f'{key}_runs')
    if not runs:
        return f'{x[key]:.3f}'
    return f'{statistics.median_low(runs):.3f} ({min(runs):.3f}–{max(runs):.3f})'


def _twins(rows: list) -> list:
    """Section 1: the table, and with several processes every process's ratios under it. Runs
    from before typed/ or the auto copy control existed render without their columns."""
    several = bool(rows) and 'explicit_over_auto_runs' in rows[0]
    control = bool(rows) and 'auto_copy_ms' in rows[0]
    has_typed = bool(rows) and 'typed_ms' in rows[0]
    header = ['model', 'global batch', 'devices', 'reference', 'auto', 'explicit']
    header += ['typed'] * has_typed + ['auto copy'] * control + ['explicit/auto']
    header += ['typed/auto'] * has_typed + ['auto copy/auto'] * control
    table = []
    for x in rows:
        names = ['reference', 'auto', 'explicit'] + ['typed'] * has_typed
        ms = [f"{x[f'{k}_ms']:.2f}" for k in names + ['auto_copy'] * control]
        ratios = [_ratio(x)] + [_ratio(x, 'typed_over_auto')] * has_typed
        ratios += [_ratio(x, 'auto_copy_over_auto')] * control
        table.append([x['model'], x['batch'], x['devices'], *ms, *ratios])
    out = [
        '\n**1. auto vs explicit'
        + ' vs typed' * has_typed
        + ' vs one-device reference** (median ms per step; target for '
        'explicit/auto: 0.95–1.05'
        + (
            '. Auto copy is the control (auto compiled a second time, timed beside the '
            'others); its ratio to auto shows what the measurement can resolve'
            if control
            else ''
        )
        + (
            f". Of {len(rows[0]['explicit_over_auto_runs'])} fresh processes: the step times "
            'are those of the process with the median explicit/auto; each ratio is the median '
            'over all the processes, with their range in brackets'
            if several
            else ''
        )
        + ')\n',
        markdown_table(header, table),
    ]
    if rows and 'auto_model_tflops_per_sec' in rows[0]:
        names = ['reference', 'auto', 'explicit'] + ['typed'] * has_typed + ['auto_copy'] * control
        out += [
            f'\nThe same steps as {RATES}:\n',
            markdown_table(
                ['model', *(n.replace('_', ' ') for n in names)],
                [[x['model'], *(rate(x, n) for n in names)] for x in rows],
            ),
        ]
    if several:
        out.append('\nEvery process, in the order they ran:\n')
        for x in rows:
            for key, name in (
                ('explicit_over_auto', 'explicit/auto'),
                ('typed_over_auto', 'typed/auto'),
                ('auto_copy_over_auto', 'auto copy/auto'),
            ):
                if f'{key}_runs' in x:
                    values = ', '.join(f'{v:.3f}' for v in x[f'{key}_runs'])
                    out.append(f"- {x['model']}, {name}: {values}")
    return out


def where(m: dict) -> str:
    """What the figures were measured on, or compiled for (--target: nothing ran there)."""
    if m.get('target'):
        return (
            f"Compiled for {m['target']} ({m['target_devices']} {m['target_device_kind']} "
            f"devices) from shapes alone on a {m['cpu_count']}-core host, nothing run; "
            f"jax {m['jax']}, {m['date']}"
        )
    return (
        f"Machine: {m['devices']} {m['platform']} devices ({m['device_kind']}) on "
        f"{m['cpu_count']} cores, jax {m['jax']}"
        + (f", libtpu {m['libtpu']}" if m.get('libtpu') else '')
        + f", {m['date']}"
        + (', XLA:CPU fused multiply-adds on' if m.get('cpu_fma') else '')
        + (
            f"; the transformer computes in {m['transformer_dtype']} with "
            f"{m['transformer_attention']} attention (the MLP in float32)"
            if m['platform'] != 'cpu' and 'transformer_dtype' in m
            else ''
        )
    )


def run_lines(r: dict) -> list[str]:
    """The run the figures come from; for results merged from several runs (a run of some
    sections into recorded ones, benchmarks/output.py), each later run and its sections."""
    out = [f"{where(r['machine'])}. Command: `{r['command']}`"]
    for note in r.get('merged', []):
        out.append(
            f"\nSection(s) {', '.join(note['sections'])}, rerun: {where(note['machine'])}. "
            f"Command: `{note['command']}`"
        )
    return out


def markdown(r: dict) -> str:
    m = r['machine']
    out = run_lines(r)
    if m['platform'] != 'cpu' and m['devices'] == 1 and ('twins' in r or 'mfu' in r):
        out.append(
            '\nOne device: the twins\' programs have no collectives here, so their agreement '
            'says nothing about parallelism, only that the three files compile to equally fast '
            'one-device programs.'
        )
    if 'twins' in r:
        out += _twins(r['twins'])
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
                rate(x),
            ]
            for x in r['sweep']
        ]
        out += [
            '\n**2. Device-count sweep** (examples/s for the MLP, tokens/s for the transformer; '
            f'{RATES})\n',
            markdown_table(
                ['model', 'mode', 'devices', 'global batch', 'twin', 'ms/step', 'per s',
                 'model TFLOP/s'], rows
            ),
        ]
    if 'attention' in r:
        rows = [
            [
                x['seq_len'],
                f"{x['naive_ms']:.2f}",
                f"{x['fused_ms']:.2f}",
                f"{x['naive_temp_bytes'] / 2**20:,.1f}",
                f"{x['fused_temp_bytes'] / 2**20:,.1f}",
                rate(x, 'naive'),
                rate(x, 'fused'),
            ]
            for x in r['attention']
        ]
        out += [
            '\n**3. Attention, forward + backward of one layer** (B=1, 4 heads of 32; '
            'XLA temporary memory from `memory_analysis()`; TFLOP/s by 12 B H D T², the '
            'causal half counted in full, MFU in brackets where the table of peaks has one)\n',
            markdown_table(
                ['seq_len', 'naive ms', 'fused ms', 'naive temp MiB', 'fused temp MiB',
                 'naive TFLOP/s', 'fused TFLOP/s'], rows
            ),
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
            markdown_table(['new bytes', 'padded', 'KV cache', 'KV/padded'], rows),
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
            f"{100 * x['mfu']:.2g}%" if x.get('mfu') is not None else '-',
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
            markdown_table(header + ['of peak', 'MFU (table peak)'], [row]),
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
                rate(x),
            ]
            for x in r['strategies']
        ]
        out += [
            '\n**6. Strategies** (median ms per step on each mesh, named as --mesh names it; '
            f'parameters + optimizer state held by one device; {RATES})\n',
            markdown_table(
                ['model', 'strategy', 'twin', 'mesh', 'ms/step', 'state MiB/device',
                 'model TFLOP/s'], rows
            ),
        ]
    if 'context' in r:
        from benchmarks import context

        out += context.markdown(r['context'])
    if 'cli' in r:
        out += _cli(r['cli'])
    if 'mfu' in r or 'chip_memory' in r:
        from benchmarks import chip

        out += chip.markdown(r)
    if 'memory' in r:
        from benchmarks import memory

        out += memory.markdown(r['memory'])
    if 'memory_101m' in r:
        from benchmarks import memory

        out += memory.markdown(r['memory_101m'], 'The 101M-parameter transformer', memory.HEADLINE)
    if 'remat' in r:
        from benchmarks import remat

        out += remat.markdown(r['remat'])
    return '\n'.join(out) + '\n'


CLI = ('auto', 'explicit', 'typed', 'auto_copy')  # benchmarks/cli.py's candidates


def _cli(rows: list) -> list:
    table = [
        [
            x['batch'],
            x['steps'],
            *(f"{x[f'{n}_tokens_per_sec']:,.0f}" for n in CLI),
            *(_ratio(x, f'{n}_over_auto') for n in CLI[1:]),
        ]
        for x in rows
    ]
    return [
        f"\n**8. The train CLI's own loop** (`shard_parity.runtime.train.run`, the transformer, "
        f"dp on {rows[0]['devices']} devices; median tokens/s as the loop reports them, first "
        'step and evaluation left out, over '
        f"{rows[0]['rounds']} interleaved runs each. Ratios are of time per token, as in "
        "section 1: the median of the runs' ratios, their range in brackets; auto copy is the "
        'control)\n',
        markdown_table(
            ['global batch', 'steps', *(n.replace('_', ' ') for n in CLI)]
            + [f"{n.replace('_', ' ')}/auto" for n in CLI[1:]],
            table,
        ),
    ]
