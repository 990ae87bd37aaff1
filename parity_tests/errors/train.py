"""Rows of docs/errors.md's table (parity_tests/errors_table.py): The train CLI's flags and the model's shape: sizes, flags absl refuses, the data and
the transformer's divisibility.
"""

ROWS = [
    (
        'batch not divisible by the device count',
        'is not divisible by the 8 devices of the mesh',
        'test_cli.test_bad_flags_get_one_clear_line',
    ),
    (
        'more devices asked than exist',
        'but this process has 8 CPU devices: use 1..8',
        'test_cli.test_bad_flags_get_one_clear_line',
    ),
    (
        '--cpu_devices after JAX started',
        'came too late: JAX has already started with 8 devices',
        'test_cli.test_cpu_devices_after_jax_started_is_refused',
    ),
    (
        'unknown model',
        'flag --model=resnet: value should be one of <mlp|transformer>',
        'test_cli.test_bad_flags_get_one_clear_line',
    ),
    ('unknown flag', "Unknown command line flag 'nosuchflag'", 'test_bad_inputs.test_cli_row'),
    (
        'stray argument',
        "unexpected arguments ['stray']: every setting is a --flag",
        'test_cli.test_bad_flags_get_one_clear_line',
    ),
    (
        'zero or negative size',
        'flag --batch_size=-8: -8 is not a positive integer',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--num_kv_heads not dividing --num_heads',
        '--num_kv_heads=3 does not divide --num_heads=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--embed_dim not divisible by --num_heads',
        '--embed_dim=30 is not divisible by --num_heads=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--seq_len beyond the text',
        '--seq_len=200000 is longer than the validation text (111,540 bytes)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'data folder missing, downloads off',
        'is missing and downloading is off',
        'test_cli.test_missing_data_says_where_to_put_it',
    ),
    (
        'truncated or corrupt data file',
        'is not a readable gzip file',
        'test_cli.test_corrupt_data_names_the_file',
    ),
    ('unwritable workdir', 'is not writable', 'test_bad_inputs.test_cli_row'),
    (
        'incomplete multi-process settings',
        'multi-process needs --coordinator_address, --num_processes and --process_id',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'generating from a cp checkpoint (not an error)',
        'restored onto one device, exit 0',
        'test_cp.test_cli_trains_with_cp_and_its_checkpoint_generates',
    ),
    (
        '--learning_rate nan or inf',
        '--learning_rate=nan is not a finite number',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--batch_size beyond the training split',
        '--batch_size=100000 is larger than the MNIST training split',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--data_dir naming a file',
        'is a file: give the folder that holds',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'transformer flags with the MLP (a warning)',
        'only shape the transformer: --model=mlp ignores them',
        'test_cli.test_settings_that_change_nothing_warn_once',
    ),
    (
        'the default batch not splitting over every device (a warning)',
        'does not split over 8 devices: training on 6',
        'test_cli.test_the_transformer_defaults_run_on_8_emulated_devices',
    ),
    (
        '--attention=fused under a ring attention (explicit and typed cp; a warning)',
        "--attention=fused is ignored: this twin's cp.py runs its own ring attention",
        'test_cli.test_fused_attention_under_a_ring_says_it_is_ignored',
    ),
    (
        'a coordinator address nobody answers',
        'nobody answered within 2 s (--heartbeat_timeout): start process 0 first',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'unknown --remat_policy',
        'flag --remat_policy=some: value should be one of <none|full|dots|dots_no_batch>',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--remat_policy with the MLP',
        '--remat_policy=dots checkpoints transformer blocks; --model=mlp has none',
        'test_bad_inputs.test_cli_row',
    ),
    (
        "--gradient_accumulation_steps not dividing a row device's rows",
        "--gradient_accumulation_steps=3 does not divide the 8 rows each device of the mesh's row "
        'axes takes',
        'test_accumulation.test_a_bad_k_is_one_line_and_exit_2',
    ),
    (
        '--gradient_accumulation_steps with a pipeline (a stage axis)',
        'K windows of M would be the gradient of --microbatches=2 x M: raise that instead',
        'test_accumulation.test_a_pipeline_refuses_k_saying_why',
    ),
    (
        '--variable_length with the MLP',
        '--variable_length cuts text into documents: --model=transformer only',
        'test_accumulation.test_variable_length_is_the_transformers',
    ),
]
