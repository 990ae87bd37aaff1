"""Train with hand-written collectives: `python -m explicit.train --model=mlp --cpu_devices=8`.

The loop, flags and outputs are shared with `auto.train` (shard_parity/train.py); only the
train step differs: see explicit/train_step.py.
"""

from absl import app

from explicit import train_step
from shard_parity.train import main

if __name__ == '__main__':
    app.run(main(train_step))
