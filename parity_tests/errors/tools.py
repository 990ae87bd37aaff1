"""Rows of docs/errors.md's table (parity_tests/errors_table.py): the user's tools: generate,
compare, the bisector and margins (the inspector's and the benchmarks' rows: inspector.py; the
fuzzer's: fuzz.py).
"""

ROWS = [
    (
        'missing checkpoint',
        'no checkpoint in',
        'test_generate.test_cli_without_a_checkpoint_says_so',
    ),
    (
        'prompt longer than the context',
        "longer than the model's context of 16 bytes",
        'test_generate.test_prompt_longer_than_the_context_is_refused',
    ),
    (
        'generating from an MLP checkpoint',
        'generation needs --model=transformer',
        'test_bad_inputs.test_cli_row',
    ),
    ('--top_k outside 1..256', 'flag --top_k=0: 0 is not', 'test_bad_inputs.test_cli_row'),
    (
        'non-UTF-8 output bytes (not an error)',
        'printed as \\xNN, exit 0',
        'test_generate.test_cli_prints_non_utf8_bytes_and_handles_an_empty_prompt',
    ),
    ('unknown benchmark section', "--sections has ['foo']", 'test_bad_inputs.test_cli_row'),
    (
        'bisect: a strategy module that cannot be imported',
        "--twins: cannot import 'nosuch.module'",
        'test_bisect.test_bad_twins_get_one_line',
    ),
    (
        'bisect: a strategy module without a function of the interface',
        '--twins: parity_tests.helpers has no loss_and_grads()',
        'test_bisect.test_bad_twins_get_one_line',
    ),
    (
        'bisect: two run directories of other settings',
        'were trained with other settings: --embed_dim: A 16, B 32',
        'test_bisect.test_run_directories_of_other_settings_or_without_checkpoints_are_refused',
    ),
    (
        'bisect: no checkpoint before the divergence (exit 1: the runs differ)',
        'share no checkpoint before it',
        'test_bisect.test_run_directories_of_other_settings_or_without_checkpoints_are_refused',
    ),
    (
        'non-UTF-8 --prompt (not an error)',
        'its raw bytes are the prompt, exit 0',
        'test_generate.test_cli_streams_a_non_utf8_prompt_and_its_continuation',
    ),
    (
        'compare: runs of other settings (another --steps, --seed, ...; exit 2)',
        'were trained with other settings: --learning_rate: A 0.001, B 0.01',
        'test_compare.test_other_settings_are_named_and_refused_unless_allowed',
    ),
    (
        'compare: steps only one run reached (a note)',
        'logged steps in',
        'test_compare.test_steps_one_run_only_reached_are_reported',
    ),
    (
        'compare or bisect: a torn config.json',
        'is not a readable config.json',
        'test_compare.test_other_settings_are_named_and_refused_unless_allowed',
    ),
    (
        'bisect: one run directory given twice',
        'are the same directory: give two different runs',
        'test_bisect.test_run_directories_given_twice_or_garbled_are_one_line',
    ),
    (
        'bisect: torn or garbled metrics.jsonl lines (a warning)',
        'skipped 3 torn or garbled line(s) of',
        'test_bisect.test_run_directories_given_twice_or_garbled_are_one_line',
    ),
    (
        'bisect: a strategy, model or mesh the train CLI refuses (exit 2)',
        '--strategy=cp splits sequences, and --model=mlp has none',
        'test_bisect.test_cli_checks_its_input_as_the_train_cli_does_and_exits_2_or_3',
    ),
    (
        'bisect: a strategy module that fails to trace (exit 3)',
        'B (my_broken_dp) fails to trace at',
        'test_bisect.test_a_side_that_fails_to_trace_is_named_with_its_line',
    ),
    (
        '--seed beyond 2**31 - 1',
        'is not an integer in the range [0, 2147483647]',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--temperature nan or inf',
        '--temperature must be a finite number',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a named mesh with an unknown axis (the inspector)',
        "--mesh=data:2,tensor:4: unknown axis 'tensor'; the axes are data, fsdp, stage, expert, "
        'seq, model',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a named mesh with an axis given twice (bisect: exit 2)',
        "--mesh=data:2,data:4: the axis 'data' is given twice; name each axis once",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'compare: a run without its final line (exit 2)',
        'has no final line: did it finish?',
        'test_compare.test_every_error_is_one_line',
    ),
    (
        'margins: a file that is not a parity test',
        'is not a parity test file (one that compares within a tolerance)',
        'test_margins.test_a_refused_input_is_one_line_and_exit_2',
    ),
    (
        "compare: a train line averaged over other steps than its partner's (another --log_every, "
        'or train_steps_averaged; marked *, left out of the verdict)',
        'or one resumed a checkpoint that kept no averaging window',
        'test_compare.test_a_line_averaged_over_fewer_steps_after_a_resume_is_paired_with_nothing',
    ),
    (
        'compare piped into a reader that stops early (`| head -n 1`; exit 141, 128 + SIGPIPE)',
        'nothing printed, exit 141',
        'test_compare.test_a_reader_that_stops_early_ends_compare_quietly',
    ),
    (
        'generate piped into a reader that stops early (`| head -c 5`; exit 141, 128 + SIGPIPE)',
        'nothing printed, exit 141',
        'test_generate.test_cli_on_a_closed_pipe_a_sigterm_and_a_long_prompt',
    ),
    (
        'generate: SIGTERM (exit 143; Ctrl-C 130: 128 + the signal)',
        'what was printed stays, exit 143',
        'test_generate.test_cli_on_a_closed_pipe_a_sigterm_and_a_long_prompt',
    ),
    (
        '--temperature below ~1e-37, where the logits divided by it overflow float32 (greedy; not '
        'an error)',
        'sampled greedily, exit 0',
        'test_generate.test_a_temperature_so_small_that_the_logits_overflow_samples_greedily',
    ),
    (
        'generate: a prompt longer than the context, refused before anything is echoed',
        "--prompt is 17 bytes, longer than the model's context of 16 bytes",
        'test_generate.test_cli_on_a_closed_pipe_a_sigterm_and_a_long_prompt',
    ),
    (
        'bisect: --reduce_dtype=bfloat16 with auto or typed among --twins (exit 2)',
        'before any line of the twin can cast it; bisect --twins=one_device,explicit',
        'test_bisect.test_cli_checks_its_input_as_the_train_cli_does_and_exits_2_or_3',
    ),
    (
        'bisect: two run directories of other settings: what to run instead',
        "--allow_other_settings, or bisect their twins under B's settings: python -m tools.bisect",
        'test_bisect.test_runs_of_other_settings_are_told_what_to_run_instead',
    ),
    (
        'bisect --from: a folder with no checkpoint',
        'first (--checkpoint_every=N saves every N steps)',
        'test_bisect_from.test_bad_from_is_one_line',
    ),
    (
        'bisect --from: a step that was not saved (the saved ones named)',
        'step 3 was not saved; saved steps: [2, 4, 6]',
        'test_bisect_from.test_bad_from_is_one_line',
    ),
    (
        "bisect --from: flags of another model or training than the checkpoint's (each field named)",
        'is of another model or training than the flags say: --model: checkpoint mlp, given transformer',
        'test_bisect_from.test_bad_from_is_one_line',
    ),
    (
        'bisect --from: a STEP after @ that is not a number',
        "'last' after @ is not a step number",
        'test_bisect_from.test_bad_from_is_one_line',
    ),
    (
        'bisect --from with two run directories: no step, or a step not both saved',
        'step 4 was not saved by both runs; saved steps both hold: [2, 6]',
        'test_bisect_from.test_with_two_run_directories_from_picks_the_checkpoint_to_replay_from',
    ),
    (
        'bisect: `--recorded` other than A or B (exit 2)',
        'flag --recorded=C: value should be one of <A|B>',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: `--recorded` without two run directories (exit 2)',
        'names which of two run directories is read from its checkpoints: give RUN_A RUN_B',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: a recorded run (another platform, or `--recorded`) without checkpoint s+1 (exit 2; its saved steps named)',
        'is recorded, its steps read from its checkpoints: step 2 -> 3 needs checkpoints 2..3, and it saved [0, 1, 2]',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: a recorded run with `--from=RUN` and no step (exit 2)',
        'with a recorded run --from picks the step it judges',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: a recorded run with `--tolerance=f32` or `--x64` (exit 2)',
        'a recorded run saved its steps, not its gradients, in its own precision',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: both runs trained on another platform than this host (a note; both replayed here)',
        'both runs trained on another platform than this host',
        'test_bisect_recorded.test_bad_input_about_a_recorded_run_is_one_line_exit_2',
    ),
    (
        'bisect: --partial_window that is no partial window (P of K = 1, P >= K, or with two run '
        'directories)',
        '--partial_window=2: a partial window of K=2 microbatches holds 1 to K-1 (1) of them',
        'test_fuzz.test_a_partial_window_that_is_none_is_one_line_exit_2',
    ),
]
