"""The table of docs/errors.md, row by row: (what goes wrong, the message fragment the user sees,
the test that shows it). test_bad_inputs.py checks that every row is in the docs and names a test
that exists, and runs the rows whose test is its test_cli_row (CLI_ROWS there: each one's
command); the other rows point at the test file that owns them. A new row goes at the end, here
and in docs/errors.md's table.
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
        'warm-up as long as the schedule',
        '--warmup_steps=100 must be below the length of the schedule',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'data folder missing, downloads off',
        'is missing and downloading is off',
        'test_cli.test_missing_data_says_where_to_put_it',
    ),
    (
        'data missing and the host unreachable (offline)',
        'offline or host unreachable',
        'test_datasets.test_offline_error_names_the_expected_path',
    ),
    (
        'truncated or corrupt data file',
        'is not a readable gzip file',
        'test_cli.test_corrupt_data_names_the_file',
    ),
    (
        'data file whose IDX header disagrees with its size',
        'but its IDX header',
        'test_datasets.test_idx_size_mismatch_names_the_file',
    ),
    (
        'wrong checksum on download',
        'md5 mismatch for',
        'test_datasets.test_wrong_checksum_leaves_no_file',
    ),
    (
        'interrupted download',
        'truncated download from',
        'test_datasets.test_truncated_response_leaves_no_file',
    ),
    (
        'missing checkpoint',
        'no checkpoint in',
        'test_generate.test_cli_without_a_checkpoint_says_so',
    ),
    (
        'corrupt or truncated checkpoint',
        'is corrupt or truncated',
        'test_resume.test_corrupt_checkpoint_is_reported_and_older_ones_stay',
    ),
    (
        'checkpoint of other settings',
        'was trained with other settings: --embed_dim: checkpoint 16, requested 32',
        'test_resume.test_other_model_settings_are_refused_naming_the_fields',
    ),
    ('unwritable workdir', 'is not writable', 'test_bad_inputs.test_cli_row'),
    (
        'disk full while saving',
        'could not save the checkpoint of step 10',
        'test_bad_inputs.test_disk_full_while_saving_keeps_the_earlier_checkpoints',
    ),
    (
        'NaN or inf loss',
        'training stopped',
        'test_resume.test_a_diverging_loss_stops_without_saving_nan',
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
    (
        'incomplete multi-process settings',
        'multi-process needs --coordinator_address, --num_processes and --process_id',
        'test_bad_inputs.test_cli_row',
    ),
    ('unknown benchmark section', "--sections has ['foo']", 'test_bad_inputs.test_cli_row'),
    (
        'malformed --mesh',
        '--mesh=4by2: expected DATAxMODEL, two positive integers such as 4x2',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--mesh and --num_devices disagree',
        '--num_devices=4 and --mesh=4x2 (8 devices) disagree',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'heads not divisible by the model axis (tp)',
        "--num_heads=4 is not divisible by the mesh's model axis (8)",
        'test_bad_inputs.test_cli_row',
    ),
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
        '--seq_len not divisible by the sequence axis (cp)',
        "--seq_len=30 is not divisible by the mesh's sequence axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--seq_len not divisible by 2 x the sequence axis (cp, zigzag layout)',
        '--seq_len=36 is not divisible by 2 x the sequence axis (8)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=cp with the MLP',
        '--strategy=cp splits sequences, and --model=mlp has none',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--experts_per_token above --num_experts',
        '--experts_per_token=5 must be between 1 and --num_experts=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--num_experts not divisible by the expert axis (ep)',
        "--num_experts=6 is not divisible by the mesh's expert axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=ep without experts',
        '--strategy=ep splits the experts of a mixture-of-experts transformer',
        'test_ep.test_bad_expert_settings_are_refused',
    ),
    (
        '--capacity_factor of 0 or below with experts on',
        '--capacity_factor=0.0 must be above 0 with --num_experts=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--num_experts under a strategy other than dp or ep',
        '--strategy=pp with --num_experts=4: the mixture of experts runs under --strategy=dp '
        'or ep, or on a named mesh',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a sequence axis of 1 (cp; a warning, not an error)',
        'splits no sequence: it runs as dp',
        'test_cp.test_a_sequence_axis_of_1_warns_and_bad_inputs_are_refused',
    ),
    (
        '--num_layers not divisible by the stage axis (pp)',
        "--num_layers=6 is not divisible by the mesh's stage axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--batch_size not divisible into the microbatches (pp)',
        '--batch_size=12 does not split into --microbatches=4 on each of the 2 devices',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=pp with the MLP',
        '--strategy=pp splits a stack of equal layers into stages, and --model=mlp has none',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a stage axis of 1 (pp; a warning, not an error)',
        'makes no pipeline: one stage holds every layer',
        'test_pp.test_a_stage_axis_of_1_warns_and_bad_inputs_are_refused',
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
        'inspector: --program not MODULE:FUNCTION',
        '--program=mymod: expected MODULE:FUNCTION, e.g. mypkg.mymod:build',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --program module not importable',
        "--program: cannot import 'nosuchmodule'",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: unknown --hardware',
        'flag --hardware=a100: value should be one of',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a second trainer in the same workdir',
        'is in use by another trainer (pid',
        'test_faults.test_a_second_trainer_is_refused_naming_the_holder',
    ),
    (
        'disk full in the background save',
        (
            'could not save the checkpoint of step 10: No space left on device; the checkpoints '
            'of steps 5 are intact'
        ),
        'test_faults.test_a_failed_background_save_is_one_error_and_the_rerun_resumes',
    ),
    (
        'disk full while appending to metrics.jsonl',
        'its earlier lines are intact',
        'test_faults.test_a_line_the_disk_cuts_short_is_taken_back',
    ),
    (
        'torn, garbled or missing metrics.jsonl on resume (a warning)',
        'dropped 3 torn or unparsable line(s)',
        'test_faults.test_a_torn_garbled_or_missing_log_never_blocks_a_resume',
    ),
    (
        'rerunning a finished run (exit 0)',
        'already holds step 20',
        'test_faults.test_finished_and_ahead_runs_touch_nothing',
    ),
    (
        '--steps below the newest checkpoint',
        '--steps=10 is below the newest checkpoint',
        'test_faults.test_finished_and_ahead_runs_touch_nothing',
    ),
    (
        'Ctrl-C or SIGTERM (exit 130 or 143)',
        '; rerun the same command to resume',
        'test_interrupts.test_an_interrupted_run_saves_and_resumes_to_the_same_parameters',
    ),
    (
        'tp on a mesh whose model axis is 1 (a warning)',
        "on a mesh whose 'model' axis is 1 splits nothing over it",
        'test_cli.test_settings_that_change_nothing_warn_once',
    ),
    (
        'transformer flags with the MLP (a warning)',
        'only shape the transformer: --model=mlp ignores them',
        'test_cli.test_settings_that_change_nothing_warn_once',
    ),
    (
        'non-UTF-8 --prompt (not an error)',
        'its raw bytes are the prompt, exit 0',
        'test_generate.test_cli_streams_a_non_utf8_prompt_and_its_continuation',
    ),
    (
        'a checkpoint whose bytes changed on disk (bit rot)',
        'does not match the checksum written when it was saved',
        'test_faults.test_flipped_bits_in_a_checkpoint_are_refused_naming_the_intact_ones',
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
        'the default batch not splitting over every device (a warning)',
        'does not split over 8 devices: training on 6',
        'test_cli.test_the_transformer_defaults_run_on_8_emulated_devices',
    ),
    (
        'a strategy the twin does not have, or none of that name',
        'value should be one of <dp|fsdp|tp|fsdp_tp',
        'test_cli.test_each_train_cli_offers_exactly_its_twins_strategies',
    ),
    (
        '--seed beyond 2**31 - 1',
        'is not an integer in the range [0, 2147483647]',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--mesh with non-ASCII digits',
        '--mesh=²x1: expected DATAxMODEL',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--temperature nan or inf',
        '--temperature must be a finite number',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a metrics line whose step is not an integer ({"step": 1e400}; a warning)',
        'dropped 3 torn or unparsable line(s)',
        'test_faults.test_a_torn_garbled_or_missing_log_never_blocks_a_resume',
    ),
    (
        'a second trainer after `.lock` was deleted',
        'is in use by another trainer',
        'test_faults.test_the_lock_survives_its_file_being_deleted_and_a_full_disk_leaves_none',
    ),
    (
        'a new workdir on a full disk',
        'cannot write',
        'test_faults.test_the_lock_survives_its_file_being_deleted_and_a_full_disk_leaves_none',
    ),
    (
        '--attention=fused under a ring attention (explicit and typed cp; a warning)',
        "--attention=fused is ignored: this twin's cp.py runs its own ring attention",
        'test_cli.test_fused_attention_under_a_ring_says_it_is_ignored',
    ),
    (
        'launch: the command without -- before it',
        'put -- before the command',
        'test_launch.test_a_forgotten_double_dash_is_named',
    ),
    (
        'launch: every process hangs (--timeout; exit 124)',
        's passed; stopping the processes',
        'test_launch.test_timeout_stops_processes_that_all_hang',
    ),
    (
        'a coordinator address nobody answers',
        'nobody answered within 2 s (--heartbeat_timeout): start process 0 first',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'SIGTERM to several processes (each, or the launcher; exit 143)',
        'interrupted at step',
        'test_multiprocess.test_sigterm_stops_every_process_at_one_step_and_the_rerun_ends_bitwise',
    ),
    (
        'a second Ctrl-C or SIGTERM, even during the first compile (exit 130 or 143 at once)',
        'interrupted again: stopped at once, saving nothing new',
        'test_interrupts.test_a_second_ctrl_c_during_the_first_compile_exits_at_once',
    ),
    (
        'processes that do not all join (a note after 5 s; Ctrl-C exits 130 at once)',
        'waiting for all 2 processes to join at',
        'test_multiprocess.test_ctrl_c_works_while_process_0_waits_for_the_others',
    ),
    (
        "launch: gloo's connection lines and each pid: printed only with --verbose (not an error)",
        '[Gloo] Rank 0 is connected',
        'test_launch.test_gloo_lines_and_pids_only_with_verbose',
    ),
    (
        "Orbax's notice about a step a kill -9 left without _CHECKPOINT_METADATA: never printed (not an error)",
        'Metadata file does not exist',
        'test_faults.test_a_step_cut_short_by_a_kill_leaks_no_orbax_notice',
    ),
    (
        'a named mesh whose sizes do not multiply to the device count',
        '--mesh=data:2,fsdp:2 has 4 devices (2 x 2), but 8 are in use: the sizes must multiply to 8',
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
        'heads not divisible by a named mesh\'s model axis',
        "--num_heads=3 is not divisible by the mesh's model axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'KV heads not divisible by a named mesh\'s model axis',
        "--num_kv_heads=1 is not divisible by the mesh's model axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'layers not divisible by a named mesh\'s stage axis',
        "--num_layers=3 is not divisible by the mesh's stage axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'experts not divisible by a named mesh\'s expert axis',
        "--num_experts=3 is not divisible by the mesh's expert axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the sequence not divisible by a named mesh\'s seq axis',
        "--seq_len=31 is not divisible by the mesh's sequence axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the batch not divisible by a named mesh\'s row axes',
        "--batch_size=6 is not divisible by the 4 devices of the mesh's row axes ('data' x 'fsdp')",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the batch not splitting into the microbatches on a named mesh',
        '--batch_size=8 does not split into --microbatches=4 on each of the 4 devices of the '
        "mesh's row axes ('data' x 'fsdp')",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'benchmarks: a --mesh that names no axes',
        '--mesh=4x2: name the axes, e.g. data:2,fsdp:2,model:2',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --hosts not dividing the devices',
        '--hosts=3: the 8 devices of the mesh data:4,model:2 do not split evenly over 3 hosts; '
        'give one of 1, 2, 4, 8',
        'test_bad_inputs.test_cli_row',
    ),
    (
        "inspector: a mesh whose inner axes do not fit in a host (--hosts)",
        '--hosts=2: 3 devices a host, but the inner axes of the mesh data:3,model:2 do not fit '
        'in a host',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: unknown --target',
        'flag --target=tpu-v9-8: value should be one of',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --target with --hardware (a target is priced on its own hardware)',
        "--hardware=h100x8 with --target=tpu-v5e-8: a target's program is priced on its own "
        'hardware (tpu-v5e-8); drop --hardware',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --target=tpu-* without libtpu',
        'compiles with the TPU compiler, libtpu, which is not installed here: '
        'pip install -e ".[tpu]"',
        'test_target.test_without_libtpu_target_says_what_to_install',
    ),
    (
        "inspector: --target=h200x8 before a GPU's target config is captured",
        '--target=h200x8: no target config has been captured yet for this GPU',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: a mesh larger than the target',
        '--num_devices=8, but the target has 4 TPU devices: use 1..4',
        'test_target.test_cli_writes_json_and_html_naming_the_target_and_keeps_libtpu_quiet',
    ),
    (
        "inspector: a program the target's HBM cannot hold (--program; a twin's step is "
        'reported `DOES NOT FIT` beside the others)',
        'the program does not fit tpu-v5e-1: needs',
        'test_target.test_a_program_the_chips_hbm_cannot_hold_is_named_not_fitting',
    ),
    (
        '--pp_virtual without --pp_schedule=interleaved',
        '--pp_virtual=2 needs --pp_schedule=interleaved (it is --pp_schedule=1f1b)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'layers not divisible by the stage axis x --pp_virtual',
        '--num_layers=4 is not divisible by the stage axis x --pp_virtual (2 x 4 = 8)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'fewer microbatches than stages under 1f1b',
        '--microbatches=2 is fewer than the stage axis (4): 1F1B reaches its steady state',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'interleaved microbatches not a multiple of the stage axis',
        '--microbatches=3 is not a multiple of the stage axis (2)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_schedule other than gpipe on a mesh without a stage axis',
        '--pp_schedule=1f1b orders the microbatches of a pipeline, and --strategy=dp has no stage axis',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_virtual=1 under --pp_schedule=interleaved',
        '--pp_virtual=1 must be 2 or more: each stage runs V chunks (V = 1 is --pp_schedule=1f1b)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_schedule other than gpipe on a composed named mesh',
        '--pp_schedule=1f1b on --mesh=data:2,stage:2,model:2: the composed step pipelines with gpipe only',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--mesh not name:size pairs separated by commas',
        "--mesh=data:2;model:4: 'data:2;model:4' is not name:size; expected name:size pairs separated by commas",
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        '--strategy=composed without a --mesh',
        '(their sizes multiplying to the 8 devices), and no --mesh was given',
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        'an expert axis on a dense model',
        'the expert axis of --mesh=expert:8 splits the experts of a mixture-of-experts transformer',
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        "an unknown flag in any CLI (train, generate, compare, bisect, launch, inspector, benchmarks; margins in argparse's words; exit 2)",
        '(--help lists the flags)',
        'test_exit_codes.test_every_cli_refuses_an_unknown_flag_and_a_bad_input_in_one_line_exit_2',
    ),
    (
        'compare: a run without its final line (exit 2)',
        'has no final line: did it finish?',
        'test_compare.test_every_error_is_one_line',
    ),
    (
        "bisect and the benchmarks (section cli) without the data: the train CLI's line (exit 1)",
        'is missing and could not be downloaded',
        'test_exit_codes.test_every_cli_that_reads_data_says_the_train_clis_line_without_it',
    ),
    (
        'margins without pytest (the test extra), or outside an install of a checkout (exit 2)',
        'pytest, which is not installed: pip install -e',
        'test_install.test_every_readme_command_runs_from_any_directory_with_and_without_pytest',
    ),
    (
        'margins: a file that is not a parity test',
        'is not a parity test file (one that compares within a tolerance)',
        'test_margins.test_a_refused_input_is_one_line_and_exit_2',
    ),
    (
        'inspector: a --program module that raises at import or has a SyntaxError (exit 2)',
        "--program: importing 'mine' raised",
        'test_exit_codes.test_a_program_of_yours_that_fails_is_refused_naming_its_line',
    ),
    (
        'inspector: a --program function that raises (exit 2)',
        '--program: mine:build() raised ValueError: no mesh at',
        'test_exit_codes.test_a_program_of_yours_that_fails_is_refused_naming_its_line',
    ),
    (
        'inspector: a --program function returning anything but (jitted function, tuple of its arguments)',
        'must return (jitted function, tuple of its arguments)',
        'test_exit_codes.test_a_program_of_yours_that_fails_is_refused_naming_its_line',
    ),
    (
        'inspector: a --program function that fails to trace (exit 2)',
        'returned fails to trace: TypeError',
        'test_exit_codes.test_a_program_whose_function_fails_to_trace_is_refused_naming_its_line',
    ),
    (
        "launch: every process refusing its input (exit 2, the processes' own status)",
        'error: processes [0, 1] failed',
        'test_launch.test_the_processes_status_is_the_launchers_where_they_agree',
    ),
    (
        'inspector: --html or --trace naming a folder (checked before the inspection)',
        'is a folder: name the file to write, e.g.',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector: --html or --trace in a folder that does not exist',
        '/missing does not exist',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector: --html or --trace in a folder it cannot write',
        '--html=/sys/r.html: cannot write in /sys',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector --target: a row of expected against compiled bytes no mechanism found '
        'in the program explains (a surprise, not an error)',
        'no mechanism found in the program accounts for the difference',
        'test_target.test_a_planted_bug_stays_a_surprise_on_a_tpu',
    ),
    (
        'benchmarks: an empty --sections',
        '--sections is empty: name one or more of',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        'benchmarks: an --out it cannot write (before the first section)',
        '--out=/sys/x: cannot write in /sys',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        'benchmarks: an --out that is a file',
        'is a file, not a folder',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        "benchmarks: a bad input in section cli's child process (its line, passed on)",
        'section cli: ',
        'test_benchmark_run.test_section_clis_child_passes_on_its_one_line',
    ),
    (
        "benchmarks: Ctrl-C (exit 130; the finished sections' tables printed, nothing written)",
        'interrupted during section nanogpt (Ctrl-C): nothing written',
        'test_benchmark_run.test_ctrl_c_is_one_line_and_exit_130',
    ),
    (
        'benchmarks: a run of some sections into recorded results (a note: merged, not '
        'replaced)',
        'merged section(s) context into',
        'test_benchmark_run.test_a_run_of_one_section_merges_into_the_recorded_results',
    ),
    (
        'benchmarks: --target without --out (a note: nothing written into the checkout)',
        'nothing written (the tables follow)',
        'test_benchmark_run.test_a_target_run_leaves_the_checkout_alone_and_names_its_target',
    ),
    (
        'a resumed run whose checkpoint was saved before checkpoints kept the averaging window '
        '(its first train line says how many steps it averages; not an error)',
        '"train_steps_averaged": 3',
        'test_resume_logs.test_a_checkpoint_without_its_window_resumes_and_says_so',
    ),
    (
        "compare: a train line averaged over other steps than its partner's (another --log_every, "
        'or train_steps_averaged; marked *, left out of the verdict)',
        'or one resumed a checkpoint that kept no averaging window',
        'test_compare.test_a_line_averaged_over_fewer_steps_after_a_resume_is_paired_with_nothing',
    ),
    (
        'bisect: train lines averaged over other steps (a note; not compared)',
        'average over different steps',
        'test_resume_logs.test_a_checkpoint_without_its_window_resumes_and_says_so',
    ),
    (
        'compare or bisect: a run that moved meshes (each segment named; not an error)',
        'moved meshes',
        'test_segments.test_compare_shows_each_runs_segments_and_a_verdict_for_each_stretch',
    ),
    (
        "compare or bisect: a stretch of steps where the two runs' plans differ (said; not an "
        'error)',
        'different plans',
        'test_segments.test_compare_shows_each_runs_segments_and_a_verdict_for_each_stretch',
    ),
    (
        'compare: a train mean over steps of two segments (a run moved inside its window; marked '
        '~)',
        'averaged over steps of two segments',
        'test_segments.test_compare_shows_each_runs_segments_and_a_verdict_for_each_stretch',
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
        'rerunning a finished run in a read-only workdir (exit 0, nothing written)',
        'nothing to do: ',
        'test_faults.test_a_finished_run_in_a_read_only_workdir_has_nothing_to_do',
    ),
    (
        'a dangling symbolic link as --workdir',
        'is a symbolic link to',
        'test_faults.test_a_dangling_link_or_a_folder_in_a_files_place_is_named',
    ),
    (
        'a folder where the run writes metrics.jsonl or config.json',
        'is a folder, not a file: the run writes its metrics.jsonl there',
        'test_faults.test_a_dangling_link_or_a_folder_in_a_files_place_is_named',
    ),
    (
        'bisect: a run directory whose metrics.jsonl is a folder',
        'is a folder, not the file a train run writes',
        'test_faults.test_a_dangling_link_or_a_folder_in_a_files_place_is_named',
    ),
    (
        'an empty (0-byte) MNIST .gz (a data fault, exit 1)',
        'too few for an IDX header',
        'test_datasets.test_an_empty_file_a_folder_and_zero_images_are_data_faults_naming_the_file',
    ),
    (
        'an MNIST file of 0 images (a data fault, exit 1; it was blamed on --batch_size)',
        'holds 0 images',
        'test_datasets.test_an_empty_file_a_folder_and_zero_images_are_data_faults_naming_the_file',
    ),
    (
        'a data file that is a folder (input.txt; a data fault, exit 1)',
        'is a folder, not a file: move it aside',
        'test_datasets.test_an_empty_file_a_folder_and_zero_images_are_data_faults_naming_the_file',
    ),
    (
        "a process killed (-9) under the launcher (the rerun resumes to the undisturbed run's log)",
        'process 1 was killed by SIGKILL',
        'test_resume_logs.test_under_1f1b_a_killed_process_resumes_to_the_undisturbed_log',
    ),
    (
        'fuzz: --twins with nothing to compare with one device',
        'name a twin or module to compare with one_device',
        'test_fuzz.test_a_bad_twins_flag_is_one_line_exit_2',
    ),
]
