"""The step loop every twin runs, and what it does between steps: logging, evaluation, the
NaN check and checkpoints.

The loop waits on the device only every `--log_every` steps, at evaluations and checkpoints, and
to keep at most two steps in flight: on a 2-core host with 8 emulated devices, queueing many
steps deadlocks XLA's in-process CPU all-reduce, so after dispatching step i we wait for step
i-1. Evaluation and checkpoint time is left out of the measured throughput; the final line adds
the median step time, model TFLOP/s and MFU (runtime/flops.py), which metrics.jsonl does not log.

A train line is the mean of each figure over the steps since the previous one (the window).
Every checkpoint carries the window's per-step values (at most --log_every scalars per figure),
and a resumed run starts from them: its means add the same numbers in the same order as an
undisturbed run's, so every line of metrics.jsonl is bitwise the same wherever the run stopped.
A checkpoint saved before windows were resumes with an empty window; its first train line then
says how many steps it averages (`train_steps_averaged`), which tools.compare and tools.bisect
read to pair like with like.

Ctrl-C and SIGTERM (a preemption) only set a flag (`stop_on_signals`, installed before anything
compiles: a KeyboardInterrupt raised inside XLA's compiler crashed the process); the loop stops
at the next step boundary, saves that step and raises Interrupted (a signal that came during an
evaluation or a save stops it before it starts another step: a scheduler's grace before SIGKILL
is short, docs/errors.md). A second signal exits at once
(os._exit: a save in flight is left as a temporary folder, which the next start removes).
With several processes (jax.distributed), JAX's preemption notifier owns SIGTERM: a signal to any
process reaches every other through the coordination service, which picks the step all stop at
(`reached_preemption_sync_point`, asked after every step); Ctrl-C is handed to it as a SIGTERM.
"""

import os
import signal
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.experimental.multihost_utils import process_allgather
from tqdm import tqdm

from shard_parity import UsageError
from shard_parity.mesh import local_rows
from shard_parity.placement import place_batch, rows
from shard_parity.runtime import checkpoint, flops, tasks
from shard_parity.runtime.averaging import means, window_from_record, window_record
from shard_parity.step import strategy_file


class Diverged(UsageError):
    """The loss became NaN or inf: training stops before anything non-finite is saved."""

    exit_code = 1  # a fault, not a bad input


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the run at a step boundary, after saving that step."""

    def __init__(self, step: int, signum: int):
        super().__init__(
            f'interrupted at step {step}; saved checkpoint {step}; rerun the same command to resume'
        )
        self.exit_code = 128 + signum  # 130 for Ctrl-C, 143 for SIGTERM, as the shell reports


SIGNALS = []  # why the run stops (a signal here, or JAX's sync point); the loop polls it
RECEIVED = []  # the signals this handler got (JAX's notifier takes SIGTERM before the sync point)
AGAIN = ['interrupted again: stopped at once']  # what a second signal prints (stop_on_signals)


def on_signal(signum, frame):
    if RECEIVED:  # the second: the user insists. Exit here: a KeyboardInterrupt raised now can
        # land in a callback from XLA's C++ during a compile, which prints it and goes on, or crashes
        os.write(2, f'\n{AGAIN[0]}\n'.encode())
        os._exit(128 + signum)
    RECEIVED.append(signum)
    if SIGNALS:  # already stopping at JAX's sync point: the scheduler's SIGTERM reaching us late
        return
    SIGNALS.append(signum)
    if signum != signal.SIGTERM and jax.distributed.is_initialized():
        signal.raise_signal(signal.SIGTERM)  # to JAX's notifier, which tells every process


def stop_on_signals(again: str | None = None) -> None:
    """Ctrl-C and SIGTERM set a flag; a second one prints `again` and exits."""
    AGAIN[:] = [again or AGAIN[0]]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def stop_requested(step: int) -> bool:
    """With one process, after any step. With several, all must stop at the same step (Orbax's
    save is collective): JAX's preemption sync point, which must be asked at every step."""
    if jax.process_count() == 1:
        return bool(SIGNALS)
    if not multihost_utils.reached_preemption_sync_point(step):
        return False
    if not SIGNALS:  # JAX's notifier took the SIGTERM, here or in another process
        SIGNALS.append(signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_signal)  # from now on a second SIGTERM stops at once
    return True


def evaluate(eval_step, params, task: tasks.Task, mesh, plan) -> tuple[dict, dict]:
    """Runs every fixed eval batch; returns the task's metrics and the per-example outputs,
    gathered from every process (each placed and evaluated only its own rows)."""
    outs = []
    for b in task.eval_batches:
        mine = local_rows(mesh, len(next(iter(b.values()))), rows(plan))  # B rows each
        batch = place_batch({k: v[mine] for k, v in b.items() if k != 'mask'}, mesh, plan)
        outs.append(eval_step(params, batch))
        if len(outs) > 1:  # at most two in flight, as in training: FSDP's eval all-gathers
            jax.block_until_ready(outs[-2])
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


class Stopwatch:
    """Training time only: stopped around evaluations and checkpoints. `laps`: the seconds
    between one step's end and the next's (`lap` after waiting on a step), each a step's time
    once the loop keeps two in flight; none spans a stop or the compiling first step."""

    def __init__(self):
        self.seconds, self.t0 = 0.0, time.perf_counter()
        self.laps, self.t_lap = [], None

    def stop(self):
        self.seconds += time.perf_counter() - self.t0
        self.t_lap = None

    def start(self):
        self.t0 = time.perf_counter()

    def reset(self):
        self.seconds, self.t0 = 0.0, time.perf_counter()
        self.laps, self.t_lap = [], None

    def lap(self):
        now = time.perf_counter()
        if self.t_lap is not None:
            self.laps.append(now - self.t_lap)
        self.t_lap = now

    def elapsed(self) -> float:
        return self.seconds + (time.perf_counter() - self.t0)


class Loop:
    """The step loop of the twin's file for `plan` (step.strategy_file), with a stopwatch for
    the throughput."""

    def __init__(self, twin, plan, task, config, mesh, graphdef, tx, log, mngr, saved):
        parallel = strategy_file(twin, plan)  # e.g. explicit/fsdp.py, or pp_1f1b.py
        self.name, self.task, self.config, self.mesh = twin.NAME, task, config, mesh
        self.plan = plan
        self.log, self.mngr, self.saved = log, mngr, saved
        self.train_step = parallel.train_step(graphdef, task.loss_fn, tx, mesh, plan)
        self.eval_step = parallel.eval_step(graphdef, task.eval_fn, mesh, plan)
        self.clock = Stopwatch()

    def run(self, state, start, checkpoint_every, sharding, workdir) -> dict:
        c, mesh = self.config, self.mesh
        if SIGNALS and jax.process_count() == 1:  # before the first step: nothing new to save
            raise KeyboardInterrupt
        window, pending, previous = self.restored_window(start), [], None
        unknown = window is None  # a checkpoint saved before windows were: see the docstring
        window = window or []
        main = jax.process_index() == 0
        mine = local_rows(mesh, c.batch_size, rows(self.plan))
        bar = tqdm(
            range(start, c.steps),
            initial=start,
            total=c.steps,
            disable=not main,
            desc=self.name,
            unit='step',
            mininterval=1,
        )
        evals, out, saved_step = None, None, None
        for i in bar:
            if i > start and SIGNALS and jax.process_count() == 1:  # came after the last check
                bar.close()  # (during an evaluation, a save): stop before another step
                self.stop(state, i, saved_step, pending, self.window(window, i, unknown))
            batch = place_batch(self.task.train_batches.batch(i, mine), mesh, self.plan)
            if sharding and i == start and main:
                show_sharding(state, batch)
            state, metrics = self.train_step(state, batch)
            window.append(metrics)
            pending.append(metrics)
            if previous is not None:
                jax.block_until_ready(previous)  # at most two steps in flight: see the docstring
                self.clock.lap()
            previous, step = metrics, i + 1
            if step == start + 1:  # the first step compiles: leave it out of the throughput
                jax.block_until_ready(metrics)
                self.clock.reset()
            if step % c.log_every == 0 or step == c.steps:
                check_finite(pending, step - len(pending) + 1, self.mngr)
                mean = means(window)
                if unknown:  # the first line after such a resume: how many steps it covers
                    mean['steps_averaged'], unknown = len(window), False
                window = []
                self.log.write(step=step, **{f'train_{k}': v for k, v in mean.items()})
                bar.set_postfix(
                    loss=f"{mean['loss']:.4f}", **{self.unit: f'{self.rate(step - start):.0f}'}
                )
            if step % c.eval_every == 0 or step == c.steps:
                self.clock.stop()
                evals, out = evaluate(self.eval_step, state.params, self.task, mesh, self.plan)
                self.log.write(step=step, **evals)
                if main:
                    tqdm.write(
                        f'step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in evals.items())
                    )
                self.clock.start()
            if step % checkpoint_every == 0 or step == c.steps:
                self.clock.stop()
                check_finite(pending, step - len(pending) + 1, self.mngr)
                window_now = self.window(window, step, unknown)
                checkpoint.save(self.mngr, state, self.saved, window_now, last=step == c.steps)
                saved_step = step
                self.clock.start()
            if step < c.steps and stop_requested(step):
                bar.close()
                self.stop(state, step, saved_step, pending, self.window(window, step, unknown))
        bar.close()
        self.clock.stop()
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
        # printed on the final line, not logged: MFU and the median step (runtime/flops.py)
        hardware = flops.hardware_flops(self.train_step, state, batch) if start < c.steps else None
        devices = mesh.devices.size
        return {**final, **flops.utilisation(self.task, self.clock.laps, hardware, devices)}

    def stop(self, state, step, saved_step, pending, window):
        """Saves `step` (unless just saved) once any save in flight is done; raises Interrupted."""
        check_finite(pending, step - len(pending) + 1, self.mngr)
        if saved_step != step:  # no step follows: no private copy (checkpoint.save)
            checkpoint.save(self.mngr, state, self.saved, window, last=True)
        self.mngr.wait_until_finished()
        raise Interrupted(step, SIGNALS[0] if SIGNALS else signal.SIGTERM)

    def restored_window(self, start: int) -> list | None:
        """The window checkpoint `start` saved ([] at a fresh start); None if it saved none."""
        if start == 0:
            return []
        record = checkpoint.read_window(self.mngr, start)
        return None if record is None else window_from_record(record, start)

    @staticmethod
    def window(window: list, step: int, unknown: bool) -> dict | None:
        """What a checkpoint of `step` keeps of the window: None while it is not the whole
        window since the last train line (after resuming a checkpoint that kept none)."""
        return None if unknown else window_record(window, step)

    @property
    def unit(self):
        return f'{self.task.throughput_unit}/s'

    def rate(self, steps_done: int) -> float:
        seconds = self.clock.elapsed()
        return max(steps_done - 1, 0) * self.task.units_per_batch / max(seconds, 1e-9)
