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
import math
import os
import re
import sys

HBM_BYTES_PER_S = 819e9


def categories(text):
    """op name -> category, from the compiled HLO's instructions and the computations their
    fusions call (the inspector's parser, inspector/hlo_module.py)."""
    from shard_parity.inspector.hlo_module import Module

    return categorised(Module(text))


def categorised(module) -> dict:
    """`categories` of a parsed module."""
    cat = {}
    for name, i in module.instructions.items():
        called = re.search(r'calls=%?([\w.\-]+)', i.line)
        body = module.computations.get(called.group(1), []) if called else []
        inside = {j.opcode for j in body}
        root = next((j.opcode for j in body if j.line.lstrip().startswith('ROOT')), None)
        if i.opcode == 'custom-call':
            cat[name] = (
                'attention kernel (Pallas)' if 'tpu_custom_call' in i.line else 'custom call'
            )
        elif {i.opcode, *inside} & {'convolution', 'dot'}:
            cat[name] = 'matmul (MXU)'
        elif i.opcode in ('copy', 'transpose') or root in ('copy', 'transpose'):
            cat[name] = 'layout (copy/transpose)'
        elif i.opcode in ('reduce', 'all-reduce') or 'reduce' in inside:
            cat[name] = 'reduction'
        elif i.opcode == 'fusion':
            cat[name] = 'elementwise fusion'
        else:
            cat[name] = i.opcode
    return cat


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape such as bf16[16,1024,12,64]{...} (a tuple: its parts)."""
    from shard_parity.inspector.hlo_module import ARRAY, ITEMSIZE

    return sum(math.prod(int(d) for d in dims.split(',') if d) * ITEMSIZE.get(dtype, 4)
               for dtype, dims in ARRAY.findall(shape))  # fmt: skip


def main(out: str, batch: int, policy: str) -> None:
    from benchmarks import remat
    from shard_parity import plan as plans
    from shard_parity.inspector import target as targets
    from shard_parity.inspector.hlo_module import Module
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
        low = remat.lowered(policy, mc, batch, plan, devices=devices)
        text = low.compile().as_text()
        os.makedirs(out, exist_ok=True)
        with gzip.open(saved, 'wt') as f:
            f.write(text)
    module = Module(text)
    cat = categorised(module)
    counts, layout = collections.Counter(), []
    for i in module.computations[module.entry]:
        c = cat.get(i.name, i.opcode)
        counts[c] += 1
        if c == 'layout (copy/transpose)':
            layout.append((shape_bytes(i.type), i.name, i.type.split('{')[0]))
    print('entry ops by category:', dict(counts.most_common()))
    total = sum(b for b, *_ in layout)
    print(
        f'{len(layout)} copies/transposes, {total / 2**20:,.1f} MiB written, '
        f'{2 * total / HBM_BYTES_PER_S * 1e3:.2f} ms at {HBM_BYTES_PER_S / 1e9:.0f} GB/s (read + write)'
    )
    shapes = collections.Counter((s, b) for b, _, s in layout)
    for (s, b), n in shapes.most_common(25):
        print(f'  {n:4d} x {s:40s} {b / 2**20:8.2f} MiB each')


if __name__ == '__main__':
    args = dict(a.lstrip('-').split('=') for a in sys.argv[2:])
    main(sys.argv[1], int(args.get('batch_size', 16)), args.get('remat_policy', 'none'))
