"""Train with compiler-inserted collectives: `python -m auto.train --model=mlp --cpu_devices=8`.

The loop, flags and outputs are shared with `explicit.train` (shard_parity/train.py); only the
train step differs: see auto/train_step.py.
"""

from absl import app

from auto import train_step
from shard_parity.train import main

if __name__ == '__main__':
    app.run(main(train_step))
