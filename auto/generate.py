"""Generate bytes: `python -m auto.generate --workdir=runs/auto_transformer`.

The sampling loop and flags are shared with the other twin (shard_parity/generate.py); this twin
only places the restored parameters, as auto/train_step.py does.
"""

from absl import app

from auto import train_step
from shard_parity.generate import main

if __name__ == '__main__':
    app.run(main(train_step))
