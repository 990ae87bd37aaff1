"""The training loop and CLI that both twins run; the twin only supplies its train_step module.

    python -m auto.train --model=mlp --steps=600 --cpu_devices=8
    python -m explicit.train --model=mlp --steps=600 --cpu_devices=8

The loop waits on the device only every `--log_every` steps, at evaluations, and to keep at most
two steps in flight: on a 2-core host with 8 emulated devices, queueing many steps deadlocks
XLA's in-process CPU all-reduce, so after dispatching step i we wait for step i-1.
"""

import json
import pathlib
import sys
import time

import jax
import numpy as np
from absl import flags, logging
from flax import nnx
from tqdm import tqdm

import datasets
from shard_parity import UsageError, checkpoint, report, tasks
from shard_parity import config as cfg
from shard_parity import flags as F
from shard_parity.mesh import configure_jax, make_mesh
from shard_parity.step import create_state, make_optimizer


def check_batch(batch_size: int, mesh) -> None:
    if batch_size % mesh.size:
        raise UsageError(
            f'--batch_size={batch_size} is not divisible by the {mesh.size} devices of the '
            f'mesh: each device takes batch_size/{mesh.size} examples; use a multiple of '
            f'{mesh.size}'
        )


def evaluate(twin, eval_step, params, task: tasks.Task, mesh) -> tuple[dict, dict]:
    """Runs every fixed eval batch; returns the task's metrics and the per-example outputs."""
    outs = []
    for b in task.eval_batches:
        batch = twin.place_batch({k: v for k, v in b.items() if k != 'mask'}, mesh)
        outs.append(eval_step(params, batch))
    out = {k: np.concatenate([np.asarray(o[k]) for o in outs]) for k in outs[0]}
    return task.summarize(out), out


def show_sharding(state, batch):
    x = next(iter(batch.values()))
    print(f'One batch, {x.dtype}{list(x.shape)} @ {x.sharding.spec}:')
    jax.debug.visualize_array_sharding(x)
    w = next(p for p in jax.tree.leaves(state.params) if p.ndim == 2)
    print(f'One weight matrix, {w.dtype}{list(w.shape)} @ {w.sharding.spec}:')
    jax.debug.visualize_array_sharding(w)


def run(
    twin,
    task: tasks.Task,
    config: cfg.TrainConfig,
    mesh,
    workdir: pathlib.Path,
    sharding: bool = False,
) -> dict:
    """Trains `task` with `twin` (auto.train_step or explicit.train_step); returns the last line."""
    check_batch(config.batch_size, mesh)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    state = twin.place_state(state, mesh)
    train_step = twin.train_step(graphdef, task.loss_fn, tx, mesh)
    eval_step = twin.eval_step(graphdef, task.eval_fn, mesh)

    name = twin.__name__.split('.')[0]
    workdir.mkdir(parents=True, exist_ok=True)
    saved = {
        'model': task.name,
        'model_config': cfg.to_dict(task.model_config),
        'train': cfg.to_dict(config),
        'twin': name,
        'devices': mesh.size,
    }
    report.atomic_write(
        workdir / 'config.json', lambda f: f.write(json.dumps(saved, indent=2).encode())
    )
    log = report.MetricsLog(workdir / 'metrics.jsonl')

    window, previous, train_seconds, t0 = [], None, 0.0, time.perf_counter()
    bar = tqdm(range(config.steps), desc=name, unit='step', mininterval=1)
    for i in bar:
        batch = twin.place_batch(task.train_batches.batch(i), mesh)
        if sharding and i == 0:
            show_sharding(state, batch)
        state, metrics = train_step(state, batch)
        window.append(metrics)
        if previous is not None:
            jax.block_until_ready(previous)  # at most two steps in flight: see the docstring
        previous, step = metrics, i + 1
        if step == 1:  # the first step compiles: leave it out of the throughput
            jax.block_until_ready(metrics)
            t0 = time.perf_counter()
        if step % config.log_every == 0 or step == config.steps:
            means = jax.tree.map(lambda *xs: float(np.mean(xs)), *window)
            window = []
            log.write(step=step, **{f'train_{k}': v for k, v in means.items()})
            rate = (step - 1) * task.units_per_batch / (train_seconds + time.perf_counter() - t0)
            bar.set_postfix(
                loss=f"{means['loss']:.4f}", **{f'{task.throughput_unit}/s': f'{rate:.0f}'}
            )
        if step % config.eval_every == 0 or step == config.steps:
            jax.block_until_ready(state)
            train_seconds += time.perf_counter() - t0
            evals, out = evaluate(twin, eval_step, state.params, task, mesh)
            log.write(step=step, **evals)
            tqdm.write(f'step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in evals.items()))
            t0 = time.perf_counter()
    bar.close()
    rate = (config.steps - 1) * task.units_per_batch / max(train_seconds, 1e-9)
    final = dict(
        step=config.steps, final=True, **evals, **{f'{task.throughput_unit}_per_sec': rate}
    )
    log.write(**final)
    task.write_report(workdir, out)
    checkpoint.save(workdir, state, saved)
    return final


def main(twin):
    """The absl main of `python -m <twin>.train`."""

    def _main(argv):
        if len(argv) > 1:
            sys.exit(f'error: unexpected arguments {argv[1:]}: every setting is a --flag')
        if not flags.FLAGS['verbosity'].present:  # Orbax and XLA log a lot at INFO
            logging.set_verbosity(logging.WARNING)
        try:
            configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
            mesh = make_mesh(F.NUM_DEVICES.value)
            config = F.train_config()
            check_batch(config.batch_size, mesh)
            if F.MODEL.value == 'mlp':
                task = tasks.mnist_task(config, F.DATA_DIR.value, F.DOWNLOAD.value)
            else:
                model_config = F.transformer_config()
                task = tasks.shakespeare_task(
                    config, model_config, F.DATA_DIR.value, F.DOWNLOAD.value
                )
            name = twin.__name__.split('.')[0]
            workdir = pathlib.Path(F.WORKDIR.value or f'runs/{name}_{F.MODEL.value}')
            final = run(twin, task, config, mesh, workdir, F.SHOW_SHARDING.value)
        except (UsageError, datasets.DataError) as e:
            sys.exit(f'error: {e}')
        print(json.dumps(final))

    return _main
