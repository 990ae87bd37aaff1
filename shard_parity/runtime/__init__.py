"""Everything around the step: configs, flags, tasks (data, losses, evaluation), the training
loop, checkpoints, reports, and the train and generate CLIs that every twin runs."""
