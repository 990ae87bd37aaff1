"""What the compiler inserted: every collective in the compiled train step of each twin, with the
line that put it there and what it would cost. The inspector lives in inspector/ (its own
package); this module keeps `python -m parity_tests.collectives` as its entry point.

    python -m parity_tests.collectives --model=mlp --cpu_devices=8
    python -m parity_tests.collectives --model=transformer --strategy=tp --mesh=4x2 --cpu_devices=8
    python -m parity_tests.collectives --strategy=fsdp --html=/tmp/fsdp.html --cpu_devices=8
"""

from shard_parity.inspector.cli import main, run  # noqa: F401  (main: absl's entry, as before)
from shard_parity.inspector.twins import differences, inspect  # noqa: F401

if __name__ == '__main__':
    run()
