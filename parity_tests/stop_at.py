"""A train CLI that is stopped where a test says, for the resume tests (test_resume_logs.py):

    python -m parity_tests.stop_at STEP MODULE FLAGS...         # e.g. 11 explicit.train --steps=20
    python -m parity_tests.stop_at kill@STEP@P MODULE FLAGS...  # e.g. kill@14@1 explicit.train ...

STEP: every process stops after step STEP as a SIGTERM delivered then stops it (the loop's
stop_requested says yes; the loop saves that step and exits 143), at a step a test chooses
rather than one a race chooses. kill@STEP@P: process P (jax.process_index()) kills itself with
SIGKILL after step STEP, once the newest checkpoint its --checkpoint_every makes by then is
complete on disk: a kill -9 after a periodic save, with nothing saved at the kill. MODULE is a
train CLI (explicit.train, ...); it runs as `python -m MODULE FLAGS` does, with launch.py too.
"""

import os
import pathlib
import runpy
import signal
import sys
import time


def flag(flags: list[str], name: str, default=None):
    found = [f.split('=', 1)[1] for f in flags if f.startswith(f'--{name}=')]
    return found[-1] if found else default


def kill_after(step: int, flags: list[str]) -> None:
    """SIGKILLs this process once the newest checkpoint at or before `step` is on disk."""
    every = int(flag(flags, 'checkpoint_every') or flag(flags, 'eval_every'))
    folder = pathlib.Path(flag(flags, 'workdir')) / 'checkpoints' / str(step - step % every)
    deadline = time.time() + 120
    while not (folder / 'state').is_dir() and time.time() < deadline:
        time.sleep(0.05)  # Orbax renames a save into place once it is complete
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    at, module, *flags = sys.argv[1:]
    import jax

    from shard_parity.runtime import loop

    original = loop.stop_requested
    kill = at.startswith('kill@')
    step, process = (int(x) for x in at.removeprefix('kill@').split('@')) if kill else (int(at), 0)

    def stop_requested(i: int) -> bool:
        if i == step and kill and jax.process_index() == process:
            kill_after(i, flags)
        if i == step and not kill:  # every process, at this step: as the sync point would say
            loop.SIGNALS.append(signal.SIGTERM)
            return True
        return original(i)

    loop.stop_requested = stop_requested
    sys.argv = [module, *flags]
    runpy.run_module(module, run_name='__main__', alter_sys=True)


if __name__ == '__main__':
    main()
