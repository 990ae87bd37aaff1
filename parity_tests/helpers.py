"""What the tests share: tiny models and their cases, tolerances, one-device and twin runners,
the CLI runner. Test modules import from here, never from each other."""

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import pytest
from flax import nnx

from shard_parity import explicit
from shard_parity import plan as plans
from shard_parity.mesh import mesh_for
from shard_parity.model.mlp import MLP
from shard_parity.placement import place_batch, place_state
from shard_parity.plan import Plan
from shard_parity import config as cfg
from shard_parity.runtime import tasks
from shard_parity.step import (
    create_state, make_optimizer, one_device_loss_and_grads, strategy_file,
)  # fmt: skip

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# jax 0.12.1 lowers an `unreduced` array with one leading dimension per unreduced axis, and its
# reduction as one reduce-sum over them (jax/_src/pjit.py _lower_shaped_reshard), which XLA:CPU
# partitions one axis at a time: a typed/ gradient unreduced over two axes is reduced by a
# collective over each, where jax 0.10.2 and 0.12.0.1 make one over both (test_inspector_axes,
# test_ep pin what each moves).
REDUCES_PER_AXIS = jax.__version_info__ >= (0, 12, 1)

# Small versions of both models for tests that run the train CLIs as subprocesses.
CLI_MODELS = {
    'mlp': ['--model=mlp', '--batch_size=64'],
    'transformer': [
        '--model=transformer',
        '--seq_len=16',
        '--num_layers=1',
        '--num_heads=2',
        '--embed_dim=16',
        '--batch_size=16',
        '--warmup_steps=2',
    ],
}

TINY_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32
)
# 8 heads of 4 dims, width 32: up to 8 'model' devices get whole heads. One block: every layer
# kind, half the compile time (the tensor-parallel tests of test_mesh_parity.py and test_tp.py).
TP_TRANSFORMER = cfg.TransformerConfig(
    seq_len=16, num_layers=1, num_heads=8, num_kv_heads=8, embed_dim=32
)

# The tolerances, each with its error model (docs/determinism.md, "Tolerances"). Every comparison
# goes through `assert_close`, which records its margin (error / allowed) for
# `python -m tools.margins`; the suite keeps each parity margin at 10x or more.
#
# One step, float32: a loss or gradient computed in another order (each device's rows summed,
# then the partial sums added) differs from the one-device value by a few float32 roundings:
# well conditioned, within 1e-6 relative on any processor.
TOL = dict(rtol=1e-5, atol=1e-6)

STEPS = 20
# Twenty steps, float32: the trajectory amplifies round-off. AdamW divides by sqrt(v), so a
# last-bit difference in a near-zero gradient becomes a visible one in its parameter, and a ReLU
# that flips passes it on; by how much depends on the processor's kernels and summation order
# (issue 21: one MLP weight of 262,144 moved 5.3e-5 on one AMD EPYC, none on another machine).
# So float32 trajectories are compared by their loss at every step, an average over the batch
# that those few elements barely move (measured: within 3e-7 relative, 30x inside LOSS_TOL)...
LOSS_TOL = dict(rtol=1e-5, atol=0)
# ...and every parameter is compared after the same STEPS steps run in float64 (`train_twin_x64`):
# there each rounding is 2^-53 ~ 1.1e-16 instead of 2^-24 ~ 6e-8, so no ReLU flips, and the
# amplified round-off stays near 1e-13 on any processor (measured on 8 devices: MLP within 4e-14
# absolute, 480x inside X64_TOL; transformer within 1e-16, 4e4x inside); a wrong strategy is off
# by 1e-3 or more, and the same run in float32 by 1e-7 (test_training_parity shows it caught).
X64_TOL = dict(rtol=1e-9, atol=1e-12)
# Only to show that float32 training moved the parameters at all (test_training_parity), never
# to compare two float32 trajectories parameter by parameter.
PARAM_TOL = dict(rtol=1e-4, atol=5e-5)


class Case(NamedTuple):
    """One model as the parity tests see it: how to build it, its loss, and its batches."""

    name: str
    make_model: Callable  # rngs -> nnx.Module
    loss_fn: Callable
    batches: Any  # .batch(step) -> dict of host arrays
    config: cfg.TrainConfig
    model_config: Any = None  # the transformer's TransformerConfig; None for the MLP


def tier(fast: bool, exhaustive: bool = False) -> list:
    """A parametrized case's marks: none in the fast tier, else slow, and exhaustive too where
    it runs only with --exhaustive (conftest.py)."""
    if fast:
        return []
    return [pytest.mark.slow] + ([pytest.mark.exhaustive] if exhaustive else [])


def make_case(name: str, model_config=TINY_TRANSFORMER) -> Case:
    from shard_parity.datasets import batches, mnist, shakespeare
    from shard_parity.datasets.root import data_root
    from shard_parity.model.transformer import Transformer

    root = data_root()
    if name == 'mlp':
        images, labels = mnist.load(root)['train']
        return Case(
            name,
            lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs),
            tasks.classification_loss,
            batches.ClassificationBatches(images, labels, 64, seed=0),
            cfg.TrainConfig(),
        )
    train, _ = shakespeare.load(root)
    # nanoGPT's recipe, with warm-up and decay shortened to fit 20 test steps.
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], steps=20, warmup_steps=5)
    return Case(
        name,
        lambda rngs: Transformer(model_config, rngs=rngs),
        tasks.lm_loss,
        batches.LanguageModelBatches(train, 16, model_config.seq_len, seed=0),
        config,
        model_config,
    )


def fresh_state(seed=0, case: Case | None = None):
    """(graphdef, tx, TrainState) of a newly initialised model (the MLP unless `case` says):
    host-side numpy copies, so that a twin's donated step can never delete the arrays that
    another twin or the one-device run still uses."""
    make_model = case.make_model if case else (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs))
    tx = make_optimizer(case.config if case else cfg.TrainConfig())
    graphdef, state = create_state(make_model(nnx.Rngs(seed)), tx)
    return graphdef, tx, jax.tree.map(np.array, state)


MARGINS: list[tuple[str, str, float]] = []  # (test, tolerance, error / allowed), for --margins


def tolerance_name(tol: dict) -> str:
    names = {'TOL': TOL, 'LOSS_TOL': LOSS_TOL, 'X64_TOL': X64_TOL, 'PARAM_TOL': PARAM_TOL}
    for name, known in names.items():
        if tol == known:
            return name
    return 'bitwise' if not any(tol.values()) else ', '.join(f'{k}={v}' for k, v in tol.items())


def assert_close(actual, desired, what: str = '', **tol):
    """np.testing.assert_allclose, recording (when it passes) how much of the tolerance the
    error used: the largest |actual - desired| / (atol + rtol |desired|); 0 is equal."""
    np.testing.assert_allclose(actual, desired, err_msg=what, **tol)
    a, d = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    error = np.abs(a - d)
    allowed = tol.get('atol', 0) + tol.get('rtol', 1e-7) * np.abs(d)
    used = np.where(error == 0, 0.0, error / np.where(allowed > 0, allowed, np.inf))
    test = os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]
    MARGINS.append((test, tolerance_name(tol), float(used.max(initial=0.0))))


MODEL_MARGINS: list[tuple[str, str, float]] = []  # (test, 'agrees' or 'caught', figure)


def record_model(report):
    """For --margins, a bisector's report under the error model (docs/numerics.md): a correct
    pair's largest error as a fraction of its budget (every phase, every leaf compared), or a
    bug's first differing leaf in budgets over (none where it is caught by shapes or dtypes)."""
    test = os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]
    if not report.diverged:
        MODEL_MARGINS.append((test, 'agrees', max((f for _, _, f in report.seen), default=0.0)))
    elif report.leaves[0].budgets is not None:
        MODEL_MARGINS.append((test, 'caught', report.leaves[0].budgets))
    return report


def assert_trees_close(a, b, **tol):
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(a)]
    for path, x, y in zip(paths, jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert_close(x, y, path, **tol)


def assert_params_close(params, want, **tol):
    """Two lists of parameter arrays (as `train` returns them), leaf by leaf."""
    for i, (p, r) in enumerate(zip(params, want, strict=True)):
        assert_close(p, r, f'param {i}', **tol)


def plan_of(mesh, strategy: str = 'composed', **options) -> Plan:
    """The plan a test's mesh runs: its axes, `strategy`'s file and `options` (microbatches,
    schedule, virtual, layout, precision). The CLIs build theirs from the flags
    (shard_parity/runtime/from_flags.py); a test builds its mesh first."""
    return Plan(tuple(mesh.shape.items()), strategy, **options)


def twin_loss_and_grads(twin, mesh, graphdef, loss_fn, state, batch, strategy='dp'):
    """(metrics, grads) of one `twin.STRATEGIES[strategy]` loss_and_grads call on `mesh`."""
    plan = plan_of(mesh, strategy)
    fn = twin.STRATEGIES[strategy].loss_and_grads(graphdef, loss_fn, mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    return fn(placed.params, place_batch(batch, mesh, plan))


def train(step_fn, state, batches, place=lambda b: b):
    """STEPS steps of `step_fn`: (losses, final params as numpy)."""
    losses = []
    for i in range(STEPS):
        state, metrics = step_fn(state, place(batches.batch(i)))
        losses.append(float(metrics['loss']))
    return np.array(losses), [np.asarray(p) for p in jax.tree.leaves(state.params)]


def train_twin(twin, mesh, case, seed=0, strategy='dp', **options):
    """STEPS steps of `twin`'s file for the plan (`strategy` on `mesh`, with `options`: the
    schedule, microbatches...), as step.strategy_file chooses it."""
    graphdef, tx, state = fresh_state(seed, case)
    plan = plan_of(mesh, strategy, **options)
    step_fn = strategy_file(twin, plan).train_step(graphdef, case.loss_fn, tx, mesh, plan)
    placed = place_state(state, mesh, plan)
    return train(step_fn, placed, case.batches, lambda b: place_batch(b, mesh, plan))


def strategy_mesh(strategy: str, shape=(8, 1), twin=None):
    """The mesh --strategy=STRATEGY --mesh=AxB builds: its two axes (shard_parity/plan.py)."""
    from shard_parity.mesh import make_mesh
    from shard_parity.placement import mesh_axes

    axis_type = twin.AXIS_TYPE if twin is not None else jax.sharding.AxisType.Auto
    return make_mesh(shape=shape, axes=mesh_axes(strategy), axis_type=axis_type)


def device0_bytes(state):
    """Bytes of the state held by the first device: what FSDP divides."""
    d0 = jax.devices()[0]
    return sum(
        s.data.nbytes
        for x in jax.tree.leaves(state)
        for s in x.addressable_shards
        if s.device == d0
    )


def logits(graphdef, params, tokens, device=None):
    """The model's logits for `tokens`, as numpy. With `device`, the params are first copied to
    that one device, so that differently placed params run the very same program. They go
    through the host: copied device to device, an array of an Explicit mesh (typed/) keeps that
    mesh's sharding in its type (jax 0.10.2), and one device's program would then refuse it."""
    if device is not None:
        params = jax.device_put(jax.device_get(params), device)
    return np.asarray(jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)[0])(params, tokens))


def save_checkpoint(workdir, state, case: Case, model_config=TINY_TRANSFORMER):
    """Saves `state` as the train CLI would, with the config that rebuilds it."""
    from shard_parity.runtime import checkpoint

    saved = {
        'model': case.name,
        'model_config': cfg.to_dict(model_config),
        'train': cfg.to_dict(case.config),
    }
    with checkpoint.manager(workdir) as mngr:
        checkpoint.save(mngr, state, saved)
        mngr.wait_until_finished()


def run_cli(twin, *flags, timeout=240, program='train'):
    """`python -m <twin>.<program> <flags>` in a subprocess, from the repository root."""
    return subprocess.run(
        [sys.executable, '-m', f'{twin}.{program}', *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,  # a deadlocked all-reduce aborts after 40 s; never wait forever
        env=dict(os.environ, PYTHONUNBUFFERED='1'),
    )


# The transformer on 8 devices, logging every 5 steps, evaluating and saving every 10: the runs
# test_faults.py and test_interrupts.py stop and resume.
FAULT_FLAGS = [*CLI_MODELS['transformer'], '--cpu_devices=8', '--log_every=5', '--eval_every=10']
FAULT_FLAGS += ['--checkpoint_every=10', '--decay_steps=400']


def saved_params(workdir):
    """The newest checkpoint's parameters in `workdir`, as numpy, read whole on one device."""
    from shard_parity.mesh import make_mesh
    from shard_parity.runtime import checkpoint

    _, _, state = checkpoint.restore(workdir, make_mesh(1))
    return [np.asarray(p) for p in jax.tree.leaves(state.params)]


def assert_same_params(a, b):
    """The newest checkpoints of workdirs `a` and `b` hold the same parameters, bitwise."""
    for x, y in zip(saved_params(a), saved_params(b), strict=True):
        np.testing.assert_array_equal(x, y)


def read_metrics(workdir):
    return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def inspect_collectives(model='mlp', strategy='dp', mesh=(8, 1), batch_size=None,
                        schedule='gpipe', **shape):  # fmt: skip
    """What `python -m inspector --json` prints, computed in this process: the
    collectives of each compiled train step. `shape`: TransformerConfig fields; `schedule`:
    pp's --pp_schedule."""
    from shard_parity.inspector.twins import inspect
    from shard_parity.mesh import make_mesh
    from shard_parity.placement import mesh_axes

    config = cfg.TRAIN_DEFAULTS[model]
    if batch_size is not None:
        config = dataclasses.replace(config, batch_size=batch_size)
    model_config = cfg.TransformerConfig(**shape)
    mesh = make_mesh(shape=mesh, axes=mesh_axes(strategy))
    report = inspect(model, config, mesh, plan_of(mesh, strategy, schedule=schedule), model_config)
    return json.loads(json.dumps(report))  # as the CLI's JSON: tuples become lists


def one_device_grads():
    """model config -> the one-device run's (case, metrics, gradients) on the first batch,
    each computed once: what the composed files hold every mesh to (their fixtures)."""
    cache = {}

    def get(config):
        if config not in cache:
            case = make_case('transformer', config)
            graphdef, _, state = fresh_state(case=case)
            grads_fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[config] = (case, *grads_fn(state.params, case.batches.batch(0)))
        return cache[config]

    return get


def mesh_of(text, twin=explicit):
    """The named mesh `text` ('data:2,fsdp:2,model:2') over this process's devices, with
    `twin`'s axis types (typed/'s Explicit): what the composed files run their plans on."""
    return mesh_for(plans.parse(text, 'composed', jax.device_count()), twin.AXIS_TYPE)
