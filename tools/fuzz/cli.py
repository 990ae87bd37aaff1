"""Random configurations against one device: `python -m tools.fuzz` draws models, meshes and
schedules (draws.py), and every draw is either refused in the train CLI's one line,
for a reason table.py's independent table gives, or each twin's step equals the
one-device run's (the bisector's activations, loss, gradients and update, at its tolerance:
f32 round-off, or the error model where a draw computes or reduces in bfloat16).

    python -m tools.fuzz --minutes=10
    python -m tools.fuzz --draws=6 --seed=1 --twins=one_device,explicit
    python -m tools.fuzz --draws=40 --twins=one_device,tools.zoo.tp_pmean   # finds the bug
    python -m tools.fuzz --entries=typed_pp_one_row_microbatch   # one corpus entry, its command

Draws are generated here, by Hypothesis, and run in a worker subprocess per device count
(worker.py) with --timeout, so a hang or a crash is a failure and not the end of the
run. A failure is shrunk (Hypothesis, in the domain's order: the MLP first, fewer axes, sizes
towards 1) and printed as the one `python -m tools.bisect` command that replays it. The corpus,
tools/fuzz/corpus/*.json (its schema: entries.py), is replayed first, its time on a line of
its own and not counted in --minutes (--nocorpus skips it): fixed entries must pass, known-open
ones are reported as known, and so is a new draw that hits one. Exit 0: no new failure; 1: one found (or
a fault of the fuzzer's own); 2: bad input (a corpus file too); 130: Ctrl-C, after the summary
so far and each failure found. docs/fuzzing.md says more.
"""

import signal
import statistics
import sys
import traceback

from absl import flags

from shard_parity import UsageError, refuse

from . import entries
from .draws import command, inspect
from .driver import Fuzz, Options, slices, zoo_axes

MINUTES = flags.DEFINE_float(
    'minutes', None, "Wall-clock budget of the random draws (the corpus's replay before them not "
    'counted: --nocorpus skips it).', lower_bound=0,
)  # fmt: skip
DRAWS = flags.DEFINE_integer(
    'draws', None, 'How many draws (default 20 without --minutes).', lower_bound=0
)
SEED = flags.DEFINE_integer('seed', 0, "Hypothesis's seed: the same seed, the same draws.")
DEVICES = flags.DEFINE_enum('devices', '8', ['8', '16'], 'Emulated CPU devices of every mesh.')
TWINS = flags.DEFINE_list(
    'twins', ['one_device', 'auto', 'explicit', 'typed'],
    'one_device and what is compared with it: twins (auto, explicit, typed), or import paths of '
    'strategy modules (tools.zoo.tp_pmean), as the bisector takes them.',
)  # fmt: skip
TIMEOUT = flags.DEFINE_integer(
    'timeout', 300, 'Seconds a draw may take before it is a hang.', lower_bound=1
)
SHRINK_MINUTES = flags.DEFINE_float(
    'shrink_minutes', 5, 'Wall-clock budget of shrinking a failure.', lower_bound=0
)
BF16 = flags.DEFINE_bool(
    'bf16', False, 'Draw bfloat16 --dtype/--reduce_dtype too, judged by the error model of '
    'docs/numerics.md (the bisector\'s --tolerance=model).',
)  # fmt: skip
MAX_FAILURES = flags.DEFINE_integer(
    'max_failures', 1, 'Stop after this many failures, each shrunk; another search starts after '
    'each with the next seed, and draws that fail as one found did pass.', lower_bound=1,
)  # fmt: skip
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 10, 'One draw in this many also trains 3 steps with each twin that '
    'agrees, saves an Orbax checkpoint, restores it on another drawn mesh and holds its arrays '
    "and its logits (on one device) bitwise to the saved run's. 0: never.", lower_bound=0,
)  # fmt: skip
TARGET = flags.DEFINE_string(
    'target', None, "A TPU slice (inspector/target.py's, e.g. tpu-v5e-8) of --devices chips, or "
    "'tpu': one such slice drawn per draw. Each draw's step is then compiled for it with libtpu "
    "and its collectives held to the plan's axes (tools/fuzz/target.py), instead of run.",
)  # fmt: skip
MODELS = flags.DEFINE_multi_enum(
    'models', ['mlp', 'transformer'], ['mlp', 'transformer'],
    'The models drawn (a module of yours that runs one only: --models=transformer).',
)  # fmt: skip
PP_SCHEDULES = flags.DEFINE_multi_enum(
    'pp_schedules', None, ['gpipe', '1f1b', 'interleaved'],
    "The schedules a 'stage' axis is drawn with (default all, GPipe mostly); 1f1b or interleaved "
    'alone draw data x stage pipelines of the transformer without experts, what they run on.',
)  # fmt: skip
CORPUS = flags.DEFINE_bool(
    'corpus', True, 'Replay tools/fuzz/corpus/ first (its entries for --twins, --devices, '
    '--models and --target), and call a new failure that matches a known entry known. '
    '--nocorpus reads none of it: the search alone.',
)  # fmt: skip
CORPUS_ONLY = flags.DEFINE_bool('corpus_only', False, 'Replay the corpus, draw nothing.')
ENTRIES = flags.DEFINE_list(
    'entries', None, 'Replay only these corpus entries (file names without .json), draw nothing, '
    'and print the command that replays each (tools.bisect, or the inspector for a --target '
    "entry's).",
)  # fmt: skip
VERBOSE = flags.DEFINE_bool(
    'verbose', False, 'One line per draw: its flags and its outcome; a fault shows its traceback.'
)


def main(argv):
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
    twins, target = checked()
    options = Options(
        timeout=TIMEOUT.value, shrink_minutes=SHRINK_MINUTES.value,
        max_failures=MAX_FAILURES.value, checkpoint_every=CHECKPOINT_EVERY.value,
        verbose=VERBOSE.value, bf16=BF16.value, models=tuple(MODELS.value),
        pp_schedules=PP_SCHEDULES.value,
    )  # fmt: skip
    fuzz = Fuzz(twins, int(DEVICES.value), target, options, entries=corpus(twins))
    if ENTRIES.value:
        fuzz.entries = chosen(fuzz, ENTRIES.value)
    stage = fault = interrupted = None  # stage: 'corpus', then 'search', as each starts
    try:
        if CORPUS.value and (fuzz.entries or CORPUS_ONLY.value):
            stage = 'corpus'
            fuzz.replay(show_commands=bool(ENTRIES.value))
            print(corpus_line(fuzz), flush=True)
        if not (CORPUS_ONLY.value or ENTRIES.value):
            stage = 'search'
            count = DRAWS.value if DRAWS.value is not None or MINUTES.value else 20
            fuzz.search(SEED.value, count, MINUTES.value)
    except KeyboardInterrupt:  # Ctrl-C: what was found so far is printed below, nothing lost
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one would cut the report short
        interrupted = True
    except Exception as e:  # a fault of the fuzzer's own (a worker's is a failure it reports)
        if VERBOSE.value:
            traceback.print_exc()
        fault = f'{type(e).__name__}: {e}'.splitlines()[0]
    finally:
        fuzz.worker.stop()
    report(fuzz, twins, stage, interrupted)
    if fault:
        refuse(f'the fuzzer stopped on a fault of its own, {fault} (--verbose shows where); '
               'what it found so far is above', 1)  # fmt: skip
    if interrupted:
        print('interrupted (Ctrl-C): what was found so far is above', file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT)  # 130, as the shell reports a Ctrl-C
    raise SystemExit(1 if fuzz.bad or fuzz.found else 0)


def checked():
    """(the twins compared with one device, --target): bad flags refused in one line, exit 2."""
    twins = [t for t in TWINS.value if t != 'one_device']
    if not twins:
        refuse(f'--twins={",".join(TWINS.value)}: name a twin or module to compare with one_device')
    try:
        zoo_axes(twins)
    except UsageError as e:
        refuse(str(e))
    if TARGET.value is not None:
        target_or_refuse(TARGET.value, int(DEVICES.value))
    draws = [f'--{f.name}' for f in (DRAWS, MINUTES) if f.present]
    only = '--corpus_only' if CORPUS_ONLY.value else '--entries' if ENTRIES.value else None
    if only and draws:
        refuse(f'{only} replays the corpus and draws nothing: drop {" and ".join(draws)}')
    if ENTRIES.value is not None and not ENTRIES.value:
        refuse('--entries is empty: name one or more files of tools/fuzz/corpus/ (without .json)')
    if only and not CORPUS.value:
        refuse(f'{only} replays the corpus, which --nocorpus skips: drop one of them')
    return twins, TARGET.value


def corpus(twins) -> list:
    """The corpus's entries, read only where this run may use them: the corpus on and a twin it
    concerns compared (a zoo entry's run reads none); a file that breaks its schema is refused
    in one line naming the file and the field, exit 2."""
    if not CORPUS.value or not set(twins) & set(entries.TWINS):
        return []
    try:
        return entries.load()
    except entries.CorpusError as e:
        refuse(str(e))


def chosen(fuzz: Fuzz, names: list) -> list:
    """--entries: those entries, each of which must replay in this run (else the flag that
    replays it is named)."""
    by_name = {e['name']: e for e in fuzz.entries}
    picked = []
    for name in names:
        name = name.removesuffix('.json')
        if name not in by_name:
            refuse(f'--entries={name}: no such entry in tools/fuzz/corpus/; the entries: '
                   f'{", ".join(by_name) or "none for these --twins"}')  # fmt: skip
        why = fuzz.skips(by_name[name])
        if why:
            refuse(f'--entries={name} does not replay in this run: add {why}')
        picked.append(by_name[name])
    return picked


def report(fuzz: Fuzz, twins, stage: str | None, interrupted: bool) -> None:
    """The summary, then each corpus entry failing again and each failure found, with the
    command that replays it (a failure cut short by Ctrl-C: its smallest draw so far)."""
    if stage == 'corpus' and interrupted:
        print(corpus_line(fuzz, interrupted=True))  # cut short in the replay
    if stage == 'search':
        print(summary(fuzz, interrupted))
    for entry, failures in fuzz.bad:
        for f in failures:
            print(f"REGRESSION corpus {entry['name']}: {f.kind} {f.twin or ''}: {f.message}")
            print(f"  {command(entry['draw'], f.twin or twins[0])}")
    for i, (draw, f) in enumerate(d for d in fuzz.found if d):
        cut = interrupted and fuzz.signature is not None and i == len(fuzz.found) - 1
        state = 'NOT fully shrunk (interrupted): the smallest draw so far' if cut else 'shrunk'
        print(f'FAILURE ({f.kind}{" of " + f.twin if f.twin else ""}), {state}:\n{f.message}')
        if f.kind == 'checkpoint':  # no bisect command replays a round trip: the fuzzer does
            print(f'draw: {" ".join(draw.flags())}')
        elif f.kind == 'collectives' or fuzz.target:  # the program, as the inspector reads it
            print(f'draw: {" ".join(draw.flags())} compiled for {fuzz.slice(draw)}')
            print(f'inspect: {inspect(draw, fuzz.slice(draw))}')
        else:
            print(f'reproduce: {command(draw, f.twin or twins[0])}')


def target_or_refuse(name: str, devices: int) -> None:
    """--target: a TPU slice of --devices chips (or 'tpu'), and libtpu to compile for it."""
    from shard_parity.devices import libtpu_installed

    fits = slices(devices)
    if name != 'tpu' and name not in fits:
        what = '--target is empty' if not name.strip() else f'--target={name}'
        refuse(f'{what}: expected tpu or a TPU slice of --devices={devices} chips: '
               f'{", ".join(fits)}')  # fmt: skip
    if not libtpu_installed():
        refuse(f'--target={name} compiles with the TPU compiler, libtpu, which is not installed '
               'here: pip install -e ".[tpu]"')  # fmt: skip


def corpus_line(fuzz: Fuzz, interrupted: bool = False) -> str:
    n, total = len(fuzz.replayed), len(fuzz.entries)
    skipped = f' ({total - n} not for this run)' if total > n and not interrupted else ''
    cut = ' (interrupted)' if interrupted else ''
    return f'corpus: {n} entries replayed in {fuzz.corpus_seconds:.0f} s{skipped}{cut}'


def summary(fuzz: Fuzz, interrupted: bool = False) -> str:
    """The search's own line: its draws, its time (shrinking included; the corpus's replay is
    its own line) and its rate."""
    c = fuzz.counts
    n = sum(c[k] for k in ('refused', 'passed', 'failed', 'known'))
    rate = f'{100 * c["refused"] / n:.0f}%' if n else '-'
    median = f'{statistics.median(fuzz.seconds):.1f} s' if fuzz.seconds else '-'
    per_minute = f'{60 * n / sum(fuzz.seconds):.1f}' if fuzz.seconds else '-'
    cut = ' (interrupted)' if interrupted else ''
    return (f'search: {n} draws in {fuzz.search_seconds:.0f} s{cut}: {c["passed"]} passed, '
            f'{c["refused"]} refused ({rate}), {c["known"]} known, {c["failed"]} failed; '
            f'{c["checkpoints"]} with a checkpoint round trip; median {median} a draw, '
            f'{per_minute} draws/minute')  # fmt: skip
