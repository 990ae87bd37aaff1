"""The train CLI of one twin on many command lines, in one process, for the tests of refusals:

    python -m parity_tests.refusals TWIN -- ARGS... -- ARGS...

Each argument list goes through what `python -m TWIN.train ARGS...` runs (its flag parsing, then
its main), and one JSON line per list says what that command would have exited with and printed
on stdout and stderr (captured at the file descriptors, absl's lines too). JAX starts once,
with 8 CPU devices, instead of once per command: test_bad_inputs.py runs its hostile meshes
through every twin in seconds. An exception the CLI does not catch is reported as status
'traceback', with its traceback.
"""

import importlib
import json
import os
import sys
import tempfile
import traceback

from absl import flags


def each(args: list[str]) -> list[list[str]]:
    """The argument lists between the `--` separators."""
    out = []
    for a in args:
        if a == '--':
            out.append([])
        else:
            out[-1].append(a)
    return out


def captured(call) -> tuple[object, str, str]:
    """(call()'s exit status, what it wrote on stdout and on stderr, from fds 1 and 2)."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile('w+') as out, tempfile.TemporaryFile('w+') as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            call()
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except Exception:
            traceback.print_exc()
            status = 'traceback'
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        out.seek(0), err.seek(0)
        return status, out.read(), err.read()


def main():
    twin_name, *rest = sys.argv[1:]
    from shard_parity.devices import configure_jax
    from shard_parity.runtime import parse_flags, train

    configure_jax(8)  # once: the CLI's own call would come too late for the second command
    train.configure_jax = lambda *a, **k: None
    twin = importlib.import_module(f'shard_parity.{twin_name}')
    run = train.main(twin)
    for args in each(rest):
        flags.FLAGS.unparse_flags()
        status, out, err = captured(lambda: run(parse_flags([f'{twin_name}.train', *args])))
        print(json.dumps({'args': args, 'status': status, 'stdout': out, 'stderr': err}))


if __name__ == '__main__':
    main()
