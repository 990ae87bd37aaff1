"""Section 8 of `python -m benchmarks.run --sections=cli`: what a user measures with the train CLI.

Sections 1, 2 and 6 time the step alone (benchmarks.sections.runner). This one runs the train
CLI's own loop, shard_parity.runtime.train.run (batches loaded on the host, at most two steps in
flight, logging, the evaluation and checkpoint at the end), and reads the tokens/s it reports,
which leave out the first step (the compile) and the evaluation and checkpoint time. All three
twins run dp on the same devices, each on its own mesh (typed/'s Explicit), beside `auto_copy`:
auto again, the control. The runs are interleaved in this one process (Williams orders,
benchmarks.timing), each with a fresh workdir, so that a drift of the machine lands on all alike.

The section runs in a child process of its own, `python -m benchmarks.cli '<JSON>'`: the train
CLI's flags (shard_parity/runtime/flags.py, defined on import) share names with the benchmark's.
A bad input or missing data there is the train CLI's one line, which the benchmark passes on.
"""

import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from benchmarks import SectionFailed

CANDIDATES = ('auto', 'explicit', 'typed', 'auto_copy')  # auto_copy: auto again, the control
EVAL_BATCHES = 10  # of the task's 100: evaluation is outside the timer, and this saves minutes


def run_once(twin, config, model_config, n: int, data_dir=None) -> float:
    """tokens/s of one `python -m <twin>.train --strategy=dp` run, in this process."""
    from shard_parity import plan as plans
    from shard_parity.runtime import tasks, train

    task = tasks.shakespeare_task(config, model_config, data_dir)
    task = dataclasses.replace(task, eval_batches=task.eval_batches[:EVAL_BATCHES])
    plan = plans.parse(None, 'dp', n)  # as the train CLI's --strategy=dp on n devices
    with tempfile.TemporaryDirectory() as workdir:  # fresh: never resumes
        final = train.run(twin, plan, task, config, workdir=pathlib.Path(workdir))
    return final['tokens_per_sec']


def cli(n: int, batch_sizes, rounds: int, steps: int, model_config, cpu_fma=False) -> list:
    """8. One row per batch size: each candidate's median tokens/s over `rounds` runs of `steps`
    steps, and the ratios of time per token to auto's (as section 1: below 1 is faster), each
    the median of the rounds' ratios with its range. Measured by a child process."""
    args = {
        'n': n,
        'batch_sizes': list(batch_sizes),
        'rounds': rounds,
        'steps': steps,
        'model_config': dataclasses.asdict(model_config),
        'cpu_fma': cpu_fma,
    }
    child = subprocess.run(
        [sys.executable, '-m', 'benchmarks.cli', json.dumps(args)],
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,  # Ctrl-C reaches the benchmark, which stops this child
    )
    if child.returncode:
        lines = child.stderr.strip().splitlines() or ['(nothing on stderr)']
        said = [ln[len('error: ') :] for ln in lines if ln.startswith('error: ')]
        if said:  # the child's own one line, and its status
            raise SectionFailed(f'section cli: {said[-1]}', child.returncode)
        raise SectionFailed(f'section cli failed (exit {child.returncode}): {lines[-1]}', 1)
    return json.loads(child.stdout.splitlines()[-1])


def measure(n: int, batch_sizes, rounds: int, steps: int, model_config) -> list[dict]:
    """The child's side of `cli`: the runs, interleaved, in this process."""
    from benchmarks.timing import balanced_orders
    from shard_parity import auto, explicit, typed
    from shard_parity import config as cfg

    twins = {'auto': auto, 'explicit': explicit, 'typed': typed, 'auto_copy': auto}
    orders = balanced_orders(len(CANDIDATES))
    rows = []
    for b in batch_sizes:
        config = dataclasses.replace(  # nanoGPT's recipe; a warm-up that fits a short run
            cfg.TRAIN_DEFAULTS['transformer'],
            steps=steps,
            batch_size=b,
            warmup_steps=min(100, steps // 2),
        )
        rates = {name: [] for name in CANDIDATES}
        for r in range(rounds):
            for i in orders[r % len(orders)]:
                name = CANDIDATES[i]
                rates[name].append(run_once(twins[name], config, model_config, n))
                print(
                    f'[cli] batch {b}, round {r}: {name} {rates[name][-1]:,.0f} tokens/s',
                    file=sys.stderr,
                    flush=True,
                )
        row = {'batch': b, 'steps': steps, 'devices': n, 'rounds': rounds}
        for name in CANDIDATES:
            row[f'{name}_tokens_per_sec'] = statistics.median(rates[name])
            row[f'{name}_runs'] = rates[name]
        for name in CANDIDATES[1:]:
            per_round = [a / x for a, x in zip(rates['auto'], rates[name])]
            row[f'{name}_over_auto'] = statistics.median(per_round)
            row[f'{name}_over_auto_runs'] = per_round
        rows.append(row)
    return rows


def child_main(a: dict) -> None:
    """The child: the measurement as JSON on stdout; a bad input or the data's absence as the
    train CLI's one line (`error: ...`) and its status; Ctrl-C as 130, quietly."""
    from shard_parity import UsageError, exit_status
    from shard_parity.datasets.root import DataError
    from shard_parity.devices import configure_jax
    from shard_parity import config as cfg

    try:
        configure_jax(a['n'], cpu_fma=a['cpu_fma'])
        model_config = cfg.TransformerConfig(**a['model_config'])
        rows = measure(a['n'], a['batch_sizes'], a['rounds'], a['steps'], model_config)
    except (UsageError, DataError) as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(exit_status(e))
    except KeyboardInterrupt:
        sys.exit(130)
    print(json.dumps(rows))


if __name__ == '__main__':
    child_main(json.loads(sys.argv[1]))
