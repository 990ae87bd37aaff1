"""One Markdown table, for the report (benchmarks/report.py) and the sections that bring their own
table (context.py, chip.py), and how a row's rates read: kept apart so that none imports another."""


def markdown_table(header, rows) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


RATES = (
    'model TFLOP/s by PaLM\'s count (6N + 12LDT a token, attention counted in full; '
    'shard_parity/runtime/flops.py), with MFU against the devices\' peak in the compute dtype '
    'in brackets where the table of peaks has one (none on the CPU, none for float32)'
)


def rate(x: dict, name: str = '') -> str:
    """'69.7 (35.4%)': a candidate's model TFLOP/s and MFU; '-' in a run from before them."""
    key = f'{name}_' if name else ''
    tflops = x.get(f'{key}model_tflops_per_sec')
    if tflops is None:
        return '-'
    mfu = x.get(f'{key}mfu')
    return f'{tflops:.3g}' + (f' ({100 * mfu:.1f}%)' if mfu is not None else '')
