"""The GPT-2-small step's compiled TPU program, read op by op without a chip: compiled from shapes
for one v5e chip (libtpu's compiler on this host, as `--target=tpu-v5e-1`; its memory figures
equal the chip's own compile to the byte, docs/inspector.md), each top-level op's category
(`categories`, which profile_step.py also uses on the chip's trace), and every copy and transpose
with its shape and bytes: which layout changes the step makes, and what they cost at the HBM's
819 GB/s (read + write).

    python benchmarks/results/tpu/hlo_ops.py OUT_DIR [--batch_size=16] [--remat_policy=none]

Writes OUT_DIR/hlo_gpt2.txt.gz (read again, not recompiled, where it exists) and prints the
tables.
"""

import collections
import gzip
import os
import re
import sys

HBM_BYTES_PER_S = 819e9
DTYPE_BYTES = {'bf16': 2, 'f32': 4, 's32': 4, 'u32': 4, 'pred': 1, 'f16': 2, 's8': 1, 'u8': 1}


def categories(text):
    """op name -> category, from the compiled HLO's instructions and fused computations."""
    comps, current = {}, None
    for line in text.splitlines():
        m = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
        if m:
            current = comps.setdefault(m.group(1), [])
        elif current is not None:
            current.append(line)
    cat = {}
    for lines in comps.values():
        for line in lines:
            m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = (?:\(.*?\)|\S+) (\w[\w-]*)\(', line)
            if not m:
                continue
            name, op = m.groups()
            body = ''
            c = re.search(r'calls=%?([\w.\-]+)', line)
            if c:
                body = '\n'.join(comps.get(c.group(1), []))
            if op == 'custom-call':
                cat[name] = 'attention kernel (Pallas)' if 'tpu_custom_call' in line else 'custom call'
            elif op in ('convolution', 'dot') or re.search(r'= \S+ (convolution|dot)\(', body):
                cat[name] = 'matmul (MXU)'
            elif op in ('copy', 'transpose') or re.search(r'ROOT \S+ = \S+ (copy|transpose)\(', body):
                cat[name] = 'layout (copy/transpose)'
            elif op in ('reduce', 'all-reduce') or re.search(r'= \S+ reduce\(', body):
                cat[name] = 'reduction'
            elif op == 'fusion':
                cat[name] = 'elementwise fusion'
            else:
                cat[name] = op
    return cat


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape such as bf16[16,1024,12,64]{...} (a tuple: its parts)."""
    total = 0
    for dtype, dims in re.findall(r'(\w+)\[([\d,]*)\]', shape):
        n = 1
        for d in filter(None, dims.split(',')):
            n *= int(d)
        total += n * DTYPE_BYTES.get(dtype, 4)
    return total


def entry_ops(text: str):
    """(name, op, result shape) of the entry computation's instructions."""
    body = text[text.index('\nENTRY') + 1:]  # the last computation, to the end of the text
    for line in body.splitlines()[1:]:
        m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) (\w[\w-]*)\(', line)
        if m:
            yield m.group(1), m.group(3), m.group(2)


def main(out: str, batch: int, policy: str) -> None:
    import dataclasses

    from benchmarks import remat
    from shard_parity import plan as plans
    from shard_parity.inspector import target as targets
    from shard_parity.model.transformer import TransformerConfig

    mc = TransformerConfig(embed_dim=768, num_layers=12, num_heads=12, num_kv_heads=12,
                           seq_len=1024, dtype='bfloat16', attention='fused')  # fmt: skip
    devices = targets.devices('tpu-v5e-1', False)
    plan = plans.parse(None, 'dp', 1)
    saved = os.path.join(out, 'hlo_gpt2.txt.gz')
    if os.path.exists(saved):  # compiled before (a minute or more): read again
        with gzip.open(saved, 'rt') as f:
            text = f.read()
    else:
        low = remat.lowered(policy, dataclasses.replace(mc), batch, plan, devices=devices)
        text = low.compile().as_text()
        os.makedirs(out, exist_ok=True)
        with gzip.open(saved, 'wt') as f:
            f.write(text)
    cat = categories(text)
    counts, layout = collections.Counter(), []
    for name, op, shape in entry_ops(text):
        c = cat.get(name, op)
        counts[c] += 1
        if c == 'layout (copy/transpose)':
            layout.append((shape_bytes(shape), name, shape.split('{')[0]))
    print('entry ops by category:', dict(counts.most_common()))
    total = sum(b for b, *_ in layout)
    print(f'{len(layout)} copies/transposes, {total / 2**20:,.1f} MiB written, '
          f'{2 * total / HBM_BYTES_PER_S * 1e3:.2f} ms at {HBM_BYTES_PER_S / 1e9:.0f} GB/s (read + write)')
    shapes = collections.Counter((s, b) for b, _, s in layout)
    for (s, b), n in shapes.most_common(25):
        print(f'  {n:4d} x {s:40s} {b / 2**20:8.2f} MiB each')


if __name__ == '__main__':
    args = dict(a.lstrip('-').split('=') for a in sys.argv[2:])
    main(sys.argv[1], int(args.get('batch_size', 16)), args.get('remat_policy', 'none'))
