"""The training loop and CLI that both twins run; the twin only supplies its train_step module.

    python -m auto.train --model=mlp --steps=600 --cpu_devices=8
    python -m explicit.train --model=transformer --cpu_devices=1 --workdir=runs/t

The loop waits on the device only every `--log_every` steps, at evaluations and checkpoints, and
to keep at most two steps in flight: on a 2-core host with 8 emulated devices, queueing many
steps deadlocks XLA's in-process CPU all-reduce, so after dispatching step i we wait for step
i-1. A rerun with the same --workdir resumes from its latest complete checkpoint; --steps is the
total, so a larger --steps trains on.
"""

import json
import pathlib
import sys
import time
import traceback

import jax
import numpy as np
from absl import flags, logging
from flax import nnx
from jax.experimental.multihost_utils import process_allgather
from tqdm import tqdm

import datasets
from shard_parity import UsageError, checkpoint, report, tasks
from shard_parity import config as cfg
from shard_parity import flags as F
from shard_parity.mesh import configure_jax, local_rows, make_mesh, start_processes
from shard_parity.step import create_state, make_optimizer


class Diverged(UsageError):
    """The loss became NaN or inf: training stops before anything non-finite is saved."""


def check_batch(batch_size: int, mesh) -> None:
    if batch_size % mesh.size:
        fits = [n for n in (1, 2, 4, 8) if batch_size % n == 0 and n < mesh.size]
        raise UsageError(
            f'--batch_size={batch_size} is not divisible by the {mesh.size} devices of the '
            f'mesh: each device takes batch_size/{mesh.size} examples; use a multiple of '
            f'{mesh.size}, or --num_devices={fits[-1]}'
        )


def evaluate(twin, eval_step, params, task: tasks.Task, mesh) -> tuple[dict, dict]:
    """Runs every fixed eval batch; returns the task's metrics and the per-example outputs,
    gathered from every process (each placed and evaluated only its own rows)."""
    outs = []
    for b in task.eval_batches:
        rows = local_rows(mesh, len(b['mask'] if 'mask' in b else next(iter(b.values()))))
        batch = twin.place_batch({k: v[rows] for k, v in b.items() if k != 'mask'}, mesh)
        outs.append(eval_step(params, batch))
    out = {k: np.concatenate([process_allgather(o[k], tiled=True) for o in outs]) for k in outs[0]}
    return task.summarize(out), out


def show_sharding(state, batch):
    x = next(iter(batch.values()))
    print(f'One batch, {x.dtype}{list(x.shape)} @ {x.sharding.spec}:')
    jax.debug.visualize_array_sharding(x)
    w = next(p for p in jax.tree.leaves(state.params) if p.ndim == 2)
    print(f'One weight matrix, {w.dtype}{list(w.shape)} @ {w.sharding.spec}:')
    jax.debug.visualize_array_sharding(w)


def check_finite(pending: list, first_step: int, mngr) -> None:
    """Raises Diverged naming the first step whose loss is not finite."""
    if not pending:
        return
    losses = np.array([float(m['loss']) for m in pending])
    bad = np.flatnonzero(~np.isfinite(losses))
    if len(bad):
        last = mngr.latest_step()
        raise Diverged(
            f'the loss is {losses[bad[0]]} at step {first_step + bad[0]}: training stopped. '
            f'The last good checkpoint ({"step " + str(last) if last else "none"}) is kept; '
            'lower --learning_rate, or find the operation with --debug_nans'
        )
    pending.clear()


def resume(mngr, state, saved: dict, twin, mesh):
    """(state, step): the latest complete checkpoint if this workdir has one, else (state, 0)."""
    step = mngr.latest_step()
    if step is None:
        return state, 0
    checkpoint.check_compatible(checkpoint.read_config(mngr, step), saved)
    sharding = jax.sharding.NamedSharding(mesh, twin.REPLICATED)
    logging.warning('resuming from %s', mngr.directory / str(step))
    return checkpoint.restore_state(mngr, step, checkpoint.target_for(state, sharding)), step


def run(
    twin,
    task: tasks.Task,
    config: cfg.TrainConfig,
    mesh,
    workdir: pathlib.Path,
    sharding=False,
    checkpoint_every=None,
    keep=3,
) -> dict:
    """Trains `task` with `twin` (auto.train_step or explicit.train_step); returns the last line.
    Saves a checkpoint every `checkpoint_every` steps (default: at each evaluation) and at the
    end, and resumes from the latest one in `workdir`."""
    check_batch(config.batch_size, mesh)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    state = twin.place_state(state, mesh)
    name = twin.__name__.split('.')[0]
    saved = {
        'model': task.name,
        'model_config': cfg.to_dict(task.model_config),
        'train': cfg.to_dict(config),
        'twin': name,
        'devices': mesh.size,
    }
    report.ensure_writable(workdir)
    main = jax.process_index() == 0  # with several processes, process 0 writes and prints
    with checkpoint.manager(workdir, keep) as mngr:
        state, start = resume(mngr, state, saved, twin, mesh)
        text = json.dumps(saved, indent=2)
        if main:
            report.atomic_write(workdir / 'config.json', lambda f: f.write(text.encode()))
        log = report.MetricsLog(workdir / 'metrics.jsonl', resume_from=start, enabled=main)
        loop = Loop(twin, task, config, mesh, graphdef, tx, log, mngr, saved)
        return loop.run(state, start, checkpoint_every or config.eval_every, sharding, workdir)


class Loop:
    """The step loop, with its timer: evaluations and checkpoints are left out of throughput."""

    def __init__(self, twin, task, config, mesh, graphdef, tx, log, mngr, saved):
        self.twin, self.task, self.config, self.mesh = twin, task, config, mesh
        self.log, self.mngr, self.saved = log, mngr, saved
        self.train_step = twin.train_step(graphdef, task.loss_fn, tx, mesh)
        self.eval_step = twin.eval_step(graphdef, task.eval_fn, mesh)
        self.seconds, self.t0 = 0.0, time.perf_counter()

    def pause(self):
        self.seconds += time.perf_counter() - self.t0

    def resume(self):
        self.t0 = time.perf_counter()

    def run(self, state, start, checkpoint_every, sharding, workdir) -> dict:
        c, twin, mesh = self.config, self.twin, self.mesh
        window, pending, previous = [], [], None
        main, rows = jax.process_index() == 0, local_rows(mesh, c.batch_size)
        bar = tqdm(
            range(start, c.steps),
            initial=start,
            total=c.steps,
            disable=not main,
            desc=twin.__name__.split('.')[0],
            unit='step',
            mininterval=1,
        )
        evals, out = None, None
        for i in bar:
            batch = twin.place_batch(self.task.train_batches.batch(i, rows), mesh)
            if sharding and i == start and main:
                show_sharding(state, batch)
            state, metrics = self.train_step(state, batch)
            window.append(metrics)
            pending.append(metrics)
            if previous is not None:
                jax.block_until_ready(previous)  # at most two steps in flight: see the docstring
            previous, step = metrics, i + 1
            if step == start + 1:  # the first step compiles: leave it out of the throughput
                jax.block_until_ready(metrics)
                self.seconds, self.t0 = 0.0, time.perf_counter()
            if step % c.log_every == 0 or step == c.steps:
                check_finite(pending, step - len(pending) + 1, self.mngr)
                means = jax.tree.map(lambda *xs: float(np.mean(xs)), *window)
                window = []
                self.log.write(step=step, **{f'train_{k}': v for k, v in means.items()})
                bar.set_postfix(
                    loss=f"{means['loss']:.4f}", **{self.unit: f'{self.rate(step - start):.0f}'}
                )
            if step % c.eval_every == 0 or step == c.steps:
                self.pause()
                evals, out = evaluate(twin, self.eval_step, state.params, self.task, mesh)
                self.log.write(step=step, **evals)
                if main:
                    tqdm.write(
                        f'step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in evals.items())
                    )
                self.resume()
            if step % checkpoint_every == 0 or step == c.steps:
                self.pause()
                check_finite(pending, step - len(pending) + 1, self.mngr)
                checkpoint.save(self.mngr, state, self.saved)
                self.resume()
        bar.close()
        if evals is None:  # nothing left to train: this workdir already reached --steps
            evals, out = evaluate(twin, self.eval_step, state.params, self.task, mesh)
        self.pause()
        final = dict(
            step=c.steps,
            final=True,
            **evals,
            **{f'{self.task.throughput_unit}_per_sec': self.rate(c.steps - start)},
        )
        self.log.write(**final)
        if main:
            self.task.write_report(workdir, out)
        self.mngr.wait_until_finished()
        return final

    @property
    def unit(self):
        return f'{self.task.throughput_unit}/s'

    def rate(self, steps_done: int) -> float:
        seconds = self.seconds + (time.perf_counter() - self.t0)
        return max(steps_done - 1, 0) * self.task.units_per_batch / max(seconds, 1e-9)


def make_task(config):
    if F.MODEL.value == 'mlp':
        return tasks.mnist_task(config, F.DATA_DIR.value, F.DOWNLOAD.value)
    return tasks.shakespeare_task(
        config, F.transformer_config(), F.DATA_DIR.value, F.DOWNLOAD.value
    )


def main(twin):
    """The absl main of `python -m <twin>.train`."""

    def _main(argv):
        if len(argv) > 1:
            sys.exit(f'error: unexpected arguments {argv[1:]}: every setting is a --flag')
        if not flags.FLAGS['verbosity'].present:  # Orbax and XLA log a lot at INFO
            logging.set_verbosity(logging.WARNING)
        try:
            configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
            start_processes(
                F.COORDINATOR.value,
                F.NUM_PROCESSES.value,
                F.PROCESS_ID.value,
                F.DISTRIBUTED_AUTO.value,
                F.HEARTBEAT_TIMEOUT.value,
            )
            jax.config.update('jax_debug_nans', F.DEBUG_NANS.value)
            mesh = make_mesh(F.NUM_DEVICES.value)
            config = F.train_config()
            check_batch(config.batch_size, mesh)
            name = twin.__name__.split('.')[0]
            workdir = pathlib.Path(F.WORKDIR.value or f'runs/{name}_{F.MODEL.value}')
            final = run(
                twin,
                make_task(config),
                config,
                mesh,
                workdir,
                F.SHOW_SHARDING.value,
                F.CHECKPOINT_EVERY.value,
                F.KEEP.value,
            )
        except FloatingPointError as e:  # raised by JAX's checks under --debug_nans
            if F.VERBOSE.value:
                traceback.print_exc()
            sys.exit(f'error: --debug_nans stopped training at the first NaN: {str(e)[:300]}')
        except (UsageError, datasets.DataError, OSError) as e:
            if F.VERBOSE.value:
                traceback.print_exc()
            sys.exit(f'error: {e}')
        if jax.process_index() == 0:
            print(json.dumps(final))

    return _main
