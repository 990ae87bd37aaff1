"""What the two twins share: models, losses, config, the optimizer, the loop and the CLI.

Nothing in this package knows how the batch is split across devices. The parallelism lives in
`auto/train_step.py` (compiler-inserted collectives) and `explicit/train_step.py` (hand-written
ones); everything here is imported by both, so a difference between them can only come from there.
"""


class UsageError(Exception):
    """An expected bad input: the CLI prints its one-line message and exits non-zero."""
