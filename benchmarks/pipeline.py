"""Pipeline parallelism's bubble, measured from the compiled program: explicit/pp.py's FLOPs per
device against M, at fixed S, beside GPipe's (S - 1) / (M + S - 1) (docs/pipeline.md).

    python -m benchmarks.pipeline [--plot=benchmarks/results/pipeline.png]

The bubble ticks here compute on zeros rather than idle, so the bubble is the share of each
device's block FLOPs that no emitted output needs. Deterministic (XLA's cost analysis, with loop
bodies counted per trip as the inspector counts them, inspector/program.py); no timing, which on
emulated CPU devices sharing a few cores would measure the cores, not the pipeline. The blocks'
FLOPs are isolated as the difference between 8 and 4 layers, which cancels the embedding and
head. XLA's cost analysis counts a loop's elementwise FLOPs once, not per trip, so the measured
bubble sits a little under the formula.
"""

import numpy as np
from absl import app, flags
from flax import nnx

from shard_parity.mesh import configure_jax

STAGES, MICROBATCHES, BATCH, LAYERS = 4, (1, 2, 4, 8, 16), 16, (4, 8)
PLOT = flags.DEFINE_string('plot', None, 'Write the figure here (needs matplotlib).')


def block_flops(step_for, tx) -> float:
    """FLOPs of 4 layers: `step_for(graphdef, state)` -> its program, compiled at 8 layers minus
    at 4 (nanoGPT's width 128, T 64)."""
    from inspector.hlo import Module
    from inspector.program import flops
    from shard_parity.model.transformer import Transformer
    from shard_parity.runtime import config as cfg
    from shard_parity.step import create_state

    counts = []
    for layers in LAYERS:
        model = Transformer(cfg.TransformerConfig(num_layers=layers), rngs=nnx.Rngs(0))
        compiled = step_for(*create_state(model, tx)).compile()
        counts.append(flops(compiled, Module(compiled.as_text())))
    return counts[1] - counts[0]


def measure(stages=STAGES, microbatches=MICROBATCHES) -> list[dict]:
    import explicit
    from shard_parity.mesh import make_mesh
    from shard_parity.placement import mesh_axes, place_batch, place_state
    from shard_parity.runtime import config as cfg
    from shard_parity.runtime.tasks import lm_loss
    from shard_parity.step import make_optimizer, one_device_train_step

    tx = make_optimizer(cfg.TRAIN_DEFAULTS['transformer'])
    batch = {k: np.zeros((BATCH, 64), np.int32) for k in ('x', 'y')}
    one = lambda g, s: one_device_train_step(g, lm_loss, tx).lower(s, batch)
    useful = block_flops(one, tx) / stages  # one stage's share of the whole batch's work
    mesh = make_mesh(shape=(1, stages), axes=mesh_axes('pp'))
    rows = []
    for m in microbatches:
        step = lambda g, s: explicit.pp.train_step(g, lm_loss, tx, mesh, m).lower(  # noqa: B023
            place_state(s, mesh, 'pp'), place_batch(batch, mesh)
        )
        spent = block_flops(step, tx)
        formula = (stages - 1) / (m + stages - 1)
        rows.append({'S': stages, 'M': m, 'bubble': 1 - useful / spent, 'formula': formula})
    return rows


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    m = [r['M'] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(m, [r['formula'] for r in rows], 'k--', label='(S-1)/(M+S-1)')
    ax.plot(m, [r['bubble'] for r in rows], 'o-', label='explicit/pp.py, measured (FLOPs)')
    ax.set(xscale='log', xlabel='microbatches M', ylabel='bubble fraction')
    ax.set_title(f'GPipe bubble, S = {rows[0]["S"]} stages', fontsize=10)
    ax.set_xticks(m, [str(x) for x in m])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    configure_jax(8)
    rows = measure()
    for r in rows:
        print(f"S={r['S']} M={r['M']:2d}: bubble {r['bubble']:.3f}, formula {r['formula']:.3f}")
    if PLOT.value:
        plot(rows, PLOT.value)


if __name__ == '__main__':
    app.run(main)
