"""Benchmarks: measured figures, never assertions. Run `python -m benchmarks.run`."""

# the sections of `python -m benchmarks.run`, in the report's order (its flags: options.py)
SECTIONS = [
    'chip_memory', 'twins', 'sweep', 'attention', 'generation', 'nanogpt', 'mfu', 'strategies',
    'context', 'cli', 'memory', 'memory_101m', 'remat',
]  # fmt: skip
# what a run without --sections runs, per --platform (the others are asked for by name)
DEFAULT_SECTIONS = ['twins', 'sweep', 'attention', 'generation', 'nanogpt', 'strategies']
TPU_SECTIONS = ['chip_memory', 'twins', 'attention', 'nanogpt', 'mfu']  # chip_memory first: its
# peaks are read from a process whose peak only rises (benchmarks/chip.py)
CHIP_ONLY = ('mfu', 'chip_memory')  # GPT-2 small's step; memory_stats(), which XLA:CPU has not


class SectionFailed(Exception):
    """A section that could not run (a child process's own one-line error, passed on): the
    run prints the line and exits with `status`."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status
