"""Rows of docs/errors.md's table (parity_tests/errors_table.py): A run's life: workdirs, checkpoints, resuming, interrupts and signals, full disks, the
launcher's processes, the data files, exit codes, the install.
"""

ROWS = [
    (
        'data missing and the host unreachable (offline)',
        'offline or host unreachable',
        'test_datasets.test_offline_error_names_the_expected_path',
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
        'corrupt or truncated checkpoint',
        'is corrupt or truncated',
        'test_resume.test_corrupt_checkpoint_is_reported_and_older_ones_stay',
    ),
    (
        'checkpoint of other settings',
        'was trained with other settings: --embed_dim: checkpoint 16, requested 32',
        'test_resume.test_other_model_settings_are_refused_naming_the_fields',
    ),
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
        'a checkpoint whose bytes changed on disk (bit rot)',
        'does not match the checksum written when it was saved',
        'test_faults.test_flipped_bits_in_a_checkpoint_are_refused_naming_the_intact_ones',
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
        "an unknown flag in any CLI (train, generate, compare, bisect, launch, inspector, benchmarks; margins in argparse's words; exit 2)",
        '(--help lists the flags)',
        'test_exit_codes.test_every_cli_refuses_an_unknown_flag_and_a_bad_input_in_one_line_exit_2',
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
        'a resumed run whose checkpoint was saved before checkpoints kept the averaging window '
        '(its first train line says how many steps it averages; not an error)',
        '"train_steps_averaged": 3',
        'test_resume_logs.test_a_checkpoint_without_its_window_resumes_and_says_so',
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
]
