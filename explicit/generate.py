"""Generate bytes: `python -m explicit.generate --workdir=runs/explicit_transformer`.

The sampling loop and flags are shared with the other twin (shard_parity/generate.py); this twin
only places the restored parameters, as explicit/train_step.py does.
"""

from absl import app

from explicit import train_step
from shard_parity.generate import main

if __name__ == '__main__':
    app.run(main(train_step))
