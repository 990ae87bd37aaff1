"""A side of the bisector (tools/bisect/divergence.py): what is compared, how it is found and placed,
and how its failure is named.

A side is a twin package (auto, explicit, typed: its file for the plan, step.strategy_file), the
import path of a strategy module of yours (loss_and_grads, train_step and eval_step, as
explicit/dp.py defines them), or 'one_device'; with the mesh it runs on (None: one device) and
the plan that places its state and that its functions take. A module of yours written before
plans (`train_step(graphdef, loss_fn, tx, mesh)`) is called without one. A side whose own code
raises, while tracing, compiling or running, cannot be compared: SideFailed names it and the
line, which is no divergence.
"""

import dataclasses
import functools
import importlib
import inspect
import os
import re
import sys
import traceback
import types
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import AxisType

from shard_parity import UsageError
from shard_parity.mesh import with_axis_type
from shard_parity.placement import place_batch, place_state
from shard_parity.step import (
    INTERFACE,
    NarrowReduce,
    bind,
    one_device_loss_and_grads,
    one_device_train_step,
    strategy_file,
)


class Side(NamedTuple):
    name: str  # as given: 'auto', 'one_device', 'tools.zoo.no_pcast', ...
    module: Any  # loss_and_grads, train_step, eval_step, each taking (..., mesh, plan)
    mesh: Any  # None: one device, no mesh
    plan: Any  # the plan it runs (its state placed by it: shard_parity/placement.py)


def _one_device():
    return types.SimpleNamespace(
        loss_and_grads=lambda graphdef, loss_fn, mesh, plan: one_device_loss_and_grads(
            graphdef, loss_fn
        ),
        train_step=lambda graphdef, loss_fn, tx, mesh, plan: one_device_train_step(
            graphdef, loss_fn, tx
        ),
        eval_step=lambda graphdef, eval_fn, mesh, plan: jax.jit(bind(graphdef, eval_fn)),
    )


def without_plan(module):
    """A strategy module of yours whose functions take no plan (written before plans: their
    last parameter is the mesh), called as the others are: each such function is given
    everything but the plan."""

    def called(fn):
        if 'plan' in inspect.signature(fn).parameters:
            return fn
        return functools.wraps(fn)(lambda *args: fn(*args[:-1]))

    functions = {name: called(getattr(module, name)) for name in INTERFACE}
    if all(functions[name] is getattr(module, name) for name in INTERFACE):
        return module
    return types.SimpleNamespace(**functions, __file__=getattr(module, '__file__', None),
                                 __name__=module.__name__)  # fmt: skip


def module_name(name: str) -> str:
    """The module a --twins name means: a twin (auto, explicit, typed, or one of their modules)
    and the bug zoo (tools.zoo.X; parity_tests.zoo.X, its old name) are this project's, found
    under the package the bisector runs from; any other name is a module of yours, as given."""
    if name.split('.')[0] in ('auto', 'explicit', 'typed'):
        return f'shard_parity.{name}'
    for zoo in ('tools.zoo.', 'parity_tests.zoo.'):
        if name.startswith(zoo):  # tools when run from a checkout, else shard_parity.tools
            return f"{__package__.rpartition('.')[0]}.zoo.{name.removeprefix(zoo)}"
    return name


def axis_type(module, package):
    """The mesh type a side runs on: its module's AXIS_TYPE, else its package's (auto, explicit
    and typed define one), else Explicit for a module that calls reshard (a copy of a typed/
    file: Explicit mode moves data only there), else None (the plan's mesh: Auto)."""
    for holder in (module, package):
        if getattr(holder, 'AXIS_TYPE', None) is not None:
            return holder.AXIS_TYPE
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):  # no source to read (a module built in memory)
        return None
    return AxisType.Explicit if re.search(r'\breshard\(', source) else None


def load_side(name: str, plan, mesh) -> Side:
    """A twin package (its file for `plan`: step.strategy_file), a strategy module's import
    path, or 'one_device'."""
    if name == 'one_device':
        return Side(name, _one_device(), None, plan)
    full = module_name(name)
    try:
        module = importlib.import_module(full)
    except ImportError as e:
        raise UsageError(
            f'--twins: cannot import {name!r} ({e}): give a twin (auto, explicit), one_device, '
            'or the import path of a strategy module on PYTHONPATH, e.g. mypkg.my_dp'
        ) from e
    # The twin's mesh type (typed/ needs an Explicit mesh)
    package = module if hasattr(module, 'STRATEGIES') else sys.modules.get(full.rpartition('.')[0])
    if (kind := axis_type(module, package)) is not None and mesh is not None:
        mesh = with_axis_type(mesh, kind)
    try:
        module = strategy_file(None, plan, module)
    except NarrowReduce:
        raise  # the command line says what to bisect instead (cli.py)
    except UsageError as e:
        raise UsageError(f'--twins: {e}') from e
    # a module of yours places its state as its own STRATEGY says, on the same axes
    own = getattr(module, 'STRATEGY', plan.strategy)
    if plan.strategy in getattr(module, 'PLANS', ()):  # a file that runs several strategies'
        own = plan.strategy  # plans (pp_1f1b.py: pp's and a named mesh's) places as the plan does
    return Side(name, without_plan(module), mesh, dataclasses.replace(plan, strategy=own))


def place(side: Side, tree, batch=False):
    tree = jax.tree.map(np.array, tree)  # a private copy: train_step donates its state
    if side.mesh is None:
        return jax.device_put(tree, jax.devices()[0])
    return (
        place_batch(tree, side.mesh, side.plan) if batch else place_state(tree, side.mesh, side.plan)
    )


class SideFailed(Exception):
    """A side's function raised (while tracing, compiling or running): it cannot be compared,
    which is not a divergence."""


def where(e: BaseException, side: Side) -> str:
    """file:line of the innermost frame in the side's own module, else the innermost frame
    outside JAX, Flax and the bisector's own files (tools/bisect/)."""
    frames = traceback.extract_tb(e.__traceback__)
    own = getattr(side.module, '__file__', None)
    mine = [f for f in frames if own and f.filename == own]
    outside = [
        f for f in frames if not re.search(r'site-packages|bisect/\w+\.py$', f.filename)
    ]
    frame = (mine or outside or frames)[-1]
    return f'{os.path.relpath(frame.filename)}:{frame.lineno}'


def guarded(method):
    """Turns an exception of the side's code into SideFailed, naming the side and the line."""

    @functools.wraps(method)
    def call(self, *args):
        try:
            return method(self, *args)
        except UsageError:
            raise
        except Exception as e:
            first = (str(e).strip().splitlines() or [''])[0][:200]
            raise SideFailed(
                f'{self.label} ({self.side.name}) fails to trace at {where(e, self.side)}: '
                f'{type(e).__name__}: {first}'
            ) from e

    return call
