"""The order the suite runs in under pytest-xdist: the known-long tests first, dealt in turn
to the workers' first batches, so that the run ends on short tests and no worker idles at the
end while another finishes a long one (longest first: the usual cure for a parallel tail).

Why dealt, not just moved to the front: xdist's default scheduler (``--dist load``) gives
each worker a first batch of consecutive tests, a quarter of its share (``len(items) //
workers // 4``, at most ``--maxschedchunk``), then refills whichever worker runs low from the
front of what is left. Long tests all at the front would all land in the first worker's batch.

``LONGEST``: the tests over 4 s in ``python -m pytest -q -n 4 --durations=0`` (2026-11-28,
2 cores), longest first. A test that uses a costly module-scoped fixture (test_cluster_setup's
``ready``) stays out: moved away from its module, it would set that fixture up twice. A name
that is no longer collected is ignored; a new long test only needs its line here.
"""
from typing import List, Sequence

import pytest

LONGEST = (
    # marked ``alone`` (tests/conftest.py): first, so it waits only for the first few tests
    "tests/cluster/test_hundred_nodes.py::"
    "test_a_100_node_job_starts_loses_a_node_and_finishes_on_bounded_launcher_threads",
    "tests/cluster/test_cluster_setup.py::test_setup_from_a_bare_venv[3.11]",
    "tests/e2e/test_docs_run.py::test_example_outputs_are_what_the_commands_print",
    "tests/e2e/test_walk_failures.py::"
    "test_torch_hang_without_pyspy_has_a_verdict_from_the_flight_recorder_and_one_hint",
    "tests/cluster/test_slurm_preempt.py::test_time_limit_warning_checkpoints_and_requeues",
    "tests/e2e/test_hardening2_wheelhouse.py::"
    "test_27_7_the_wheel_builds_in_a_fresh_venv_from_an_editable_install",
    "tests/e2e/test_gpu_second_pass.py::test_one_gpu_check_dry_runs_on_the_double",
    "tests/e2e/test_hang_under_load.py::"
    "test_40_8_a_compute_bound_job_beside_cpu_hogs_is_never_stopped",
    "tests/cluster/test_blame.py::test_40_4_a_launcher_stopped_for_8s_ledgers_no_node",
    "tests/cluster/test_elastic.py::"
    "test_40_15_a_node_frozen_for_a_moment_rejoins_and_leaves_the_ledger",
    "tests/cluster/test_straggler_faults.py::"
    "test_sleeping_data_loader_under_mpirun_with_published_pages[torch]",
    "tests/e2e/test_hang_classes.py::test_unmodified_torch_ddp_script_desync_and_dead_peer",
    "tests/e2e/test_hang_classes.py::test_unmodified_paddle_script_dead_peer_and_desync",
    "tests/cluster/test_straggler_faults.py::"
    "test_sleeping_data_loader_in_a_submitted_slurm_job[torch]",
    "tests/e2e/test_hang_under_load.py::"
    "test_40_8_a_hang_whose_stack_signal_wakes_the_ranks_ends_as_a_hang",
    "tests/cluster/test_k8s_pod_requests.py::test_an_elastic_pytorchjob_runs_torchrun_in_every_pod",
    "tests/cluster/test_hang_partition.py::test_a_cut_link_a_frozen_node_and_a_cut_path_are_named",
    "tests/cluster/test_slurm_backend.py::test_unmodified_torch_ddp_script_inside_allocation",
    "tests/cluster/test_cluster.py::"
    "test_train_runs_a_shell_script_of_the_working_directory[fabric]",
    "tests/e2e/test_hang_classes.py::test_torch_collectives_count_as_progress_without_pyspy",
    "tests/cluster/test_slurm_preempt.py::test_scancel_signal_usr1_requeues_and_resumes",
    "tests/cluster/test_elastic.py::"
    "test_agent_killed_then_master_node_cut_off_beside_a_node_at_full_cpu",
    "tests/cluster/test_k8s_netns.py::test_torch_ddp_in_pytorchjob_pods",
    "tests/cluster/test_job_checkpoint_ssh.py::test_save_reaches_every_node_and_the_job_goes_on",
    "tests/cluster/test_k8s_netns.py::"
    "test_a_killed_pod_restarts_the_group_which_resumes_from_its_checkpoint[trainjob-None]",
    "tests/cluster/test_slurm_preempt.py::test_scontrol_requeue_resumes",
    "tests/cluster/test_diagnose_cluster.py::test_hang_under_mpirun_over_two_ssh_nodes",
    "tests/cluster/test_health_gate.py::"
    "test_health_gate_leaves_outliers_out_and_the_ledger_keeps_them_out",
    "tests/cluster/test_elastic.py::test_two_frozen_nodes_then_a_node_lost_during_the_restart",
    "tests/e2e/test_hardening2_wheelhouse.py::"
    "test_27_7_no_pip_command_names_fluidctl_and_an_installed_copy_is_packed",
    "tests/e2e/test_job_checkpoint_local.py::test_save_and_go_on_under_mpirun",
    "tests/e2e/test_hang_classes.py::test_runtime_script_each_class",
    "tests/e2e/test_report.py::test_report_opens_offline_with_one_line_per_rank_and_the_timeline",
    "tests/cluster/test_health_gate.py::test_deep_check_names_a_throttled_cpu_and_a_capped_link",
    "tests/e2e/test_hang_classes.py::test_unmodified_torch_script_gloo_size_mismatch",
    "tests/cluster/test_cluster.py::test_train_runs_a_shell_script_of_the_working_directory[ssh]",
    "tests/e2e/test_hardening2_wheelhouse.py::test_27_7_a_failed_build_shows_pip_s_real_error_line",
    "tests/cluster/test_straggler_faults.py::"
    "test_torch_script_sleeping_data_loader_is_slow_data_and_nothing_before",
    "tests/cluster/test_k8s_netns.py::"
    "test_a_killed_pod_restarts_the_group_which_resumes_from_its_checkpoint[mpijob-v2beta1]",
    "tests/cluster/test_slurm_backend.py::"
    "test_a_submitted_job_watches_for_hangs_in_its_own_allocation",
    "tests/e2e/test_peer_scripts.py::test_unmodified_torch_ddp_gloo_script",
    "tests/cluster/test_cluster.py::"
    "test_progress_lines_name_each_step_and_a_silent_node_while_waiting[setup]",
    "tests/cluster/test_top_ssh.py::test_top_over_ssh_marks_the_slow_rank_and_the_lost_node",
    "tests/e2e/test_job_checkpoint_local.py::test_save_and_go_on",
    "tests/cluster/test_slurm_resize.py::test_world_size_4_3_4_across_checkpoint_stops",
    "tests/e2e/test_hang_classes.py::test_unmodified_paddle_script_gloo_size_mismatch",
    "tests/cluster/test_diagnose_cluster.py::test_hang_over_ssh_names_every_rank_on_every_node",
    "tests/cluster/test_straggler_faults.py::"
    "test_paddle_script_rank_computing_more_is_slow_compute",
    "tests/cluster/test_slurm_preempt.py::test_time_limit_inside_an_allocation",
    "tests/e2e/test_observe_local.py::test_prometheus_scrapes_every_rank_and_the_straggler",
    "tests/cluster/test_k8s_netns.py::test_paddle_dataparallel_in_paddlejob_pods",
    "tests/cluster/test_straggler_faults.py::test_throttled_cpu_is_slow_compute_on_that_node",
    "tests/cluster/test_mpi_programs.py::test_two_ssh_nodes_every_path_sees_the_same_world",
    "tests/cluster/test_multinode.py::"
    "test_a_lost_connection_fails_the_job_and_the_node_stops_its_ranks",
    "tests/e2e/test_walk_torchrun.py::"
    "test_a_runtime_script_runs_under_torchrun[a-token-every-rank-was-given]",
    "tests/cluster/test_slurm_backend.py::"
    "test_a_hang_inside_an_allocation_is_diagnosed_on_every_node[py-spy]",
    "tests/cluster/test_slurm_backend.py::"
    "test_a_hang_inside_an_allocation_is_diagnosed_on_every_node[faulthandler]",
    "tests/cluster/test_k8s_pod_requests.py::"
    "test_the_checkpoint_annotation_saves_and_the_job_goes_on",
    "tests/cluster/test_cluster.py::"
    "test_a_node_without_sftp_is_not_ready_in_check_and_setup_dry_run",
    "tests/cluster/test_walk_ssh.py::"
    "test_a_py_script_missing_on_the_nodes_is_one_line_before_start",
    "tests/e2e/test_observe_local.py::test_top_on_an_mpi_job_reads_the_shared_directory",
    "tests/e2e/test_report.py::test_the_report_of_a_running_job_shows_it_so_far",
    "tests/e2e/test_peer_scripts.py::test_unmodified_paddle_dataparallel_script",
    "tests/cluster/test_elastic.py::test_fabric_agent_killed_the_spare_takes_its_place",
    "tests/cluster/test_top_slurm.py::test_top_and_metrics_of_a_submitted_slurm_job",
    "tests/cluster/test_netns_nodes.py::test_link_down_cuts_the_node_and_freeze_silences_it",
    "tests/e2e/test_diagnose.py::test_hang_under_mpirun_on_one_node",
    "tests/e2e/test_runtime_gpu.py::test_a_rank_that_never_calls_ends_the_others_at_the_timeout",
    "tests/cluster/test_blame.py::test_40_12_a_node_lost_on_the_last_allowed_attempt_is_ledgered",
    "tests/cluster/test_straggler_faults.py::test_healthy_job_beside_cpu_hogs_is_not_reported",
    "tests/cluster/test_k8s_netns.py::"
    "test_a_killed_pod_restarts_the_group_which_resumes_from_its_checkpoint[pytorchjob-None]",
    "tests/cluster/test_cluster.py::test_check_prints_install_advice_whole_and_fits_the_terminal",
    "tests/e2e/test_observe_local.py::test_top_in_tmux_marks_the_slow_rank_and_once_json_parses",
    "tests/e2e/test_hardening27.py::"
    "test_27_1_sync_round_waiting_for_a_slow_trainer_outlives_the_deadline",
    "tests/e2e/test_walk_failures.py::"
    "test_a_hang_without_any_collective_is_every_rank_idle_not_desync",
    "tests/e2e/test_gpu_second_pass.py::"
    "test_torch_process_group_beside_fluidctl_runtime_under_train",
    "tests/e2e/test_hang_classes.py::"
    "test_under_mpirun_a_script_without_fluidctl_answers_the_stack_signal",
    "tests/cluster/test_k8s_pod_requests.py::"
    "test_a_hang_is_reported_in_the_pods_logs_and_termination_message",
    "tests/e2e/test_runtime_collectives.py::test_a_rank_that_never_comes_times_out_by_name[shm]",
    "tests/cluster/test_cluster.py::"
    "test_progress_lines_name_each_step_and_a_silent_node_while_waiting[check]",
    "tests/cluster/test_straggler_faults.py::test_capped_link_is_a_slow_link_at_that_node",
    "tests/e2e/test_diagnose.py::test_hang_timeout_from_the_environment_and_bad_values",
    "tests/e2e/test_runtime_collectives.py::test_a_rank_that_never_comes_times_out_by_name[ring]",
    "tests/e2e/test_walk_torchrun.py::test_a_runtime_script_runs_under_torchrun[None]",
    "tests/e2e/test_docs_run.py::test_readme_quick_start_demos_run_as_written",
    "tests/cluster/test_straggler_faults.py::"
    "test_sleeping_data_loader_under_mpirun_with_published_pages[runtime]",
    "tests/cluster/test_mpi_programs.py::test_one_node_every_path_sees_the_same_world",
    "tests/cluster/test_multinode.py::test_mpi_backend_over_the_ssh_nodes",
    "tests/e2e/test_walk_failures.py::test_torch_ddp_exception_behind_rank_prefixes_is_explained",
    "tests/e2e/test_gpu_queue.py::"
    "test_the_launchers_hang_watchdog_counts_completed_gpu_collectives",
    "tests/e2e/test_diagnose.py::test_collectives_completing_in_silence_are_not_a_hang",
    "tests/e2e/test_pserver_cli.py::test_daemon_start_status_stop",
    "tests/e2e/test_hardening40.py::test_40_2_saves_back_to_back_never_lose_a_part_to_the_prune",
    "tests/e2e/test_diagnose.py::"
    "test_hang_is_diagnosed_with_both_stacks_and_exit_124[faulthandler]",
    "tests/e2e/test_diagnose.py::test_hang_is_diagnosed_with_both_stacks_and_exit_124[py-spy]",
    "tests/cluster/test_multinode.py::test_host_in_remote_dir_is_each_node_s_own_directory",
    "tests/cluster/test_cluster.py::test_unknown_host_keys_refused_unless_accepted",
    "tests/cluster/test_k8s_netns.py::"
    "test_runtime_script_gives_the_same_weights_as_fluidctl_train[mpijob-v2beta1]",
    "tests/e2e/test_env_bound_job.py::"
    "test_dry_run_of_8000_local_ranks_shows_no_environment_string_over_the_bound",
)


def first_batch(count: int, workers: int, maxschedchunk=None) -> int:
    """The size of each worker's first batch under ``--dist load`` (xdist 3's LoadScheduling)."""
    size = min((count // workers) // 4, maxschedchunk or count)
    return max(size, 2)


def longest_first(items: Sequence, workers: int, batch: int) -> List:
    """``items`` with the ``LONGEST`` ones dealt in turn to the front of each worker's first
    batch (worker w's batch starts at w * batch), the rest in their collection order."""
    by_id = {item.nodeid: item for item in items}
    long = [by_id[name] for name in LONGEST if name in by_id]
    chosen = set(map(id, long))
    rest = iter([item for item in items if id(item) not in chosen])
    ordered = []
    for worker in range(workers):
        mine = long[worker::workers]
        ordered += mine
        ordered += [item for _, item in zip(range(batch - len(mine)), rest)]
    ordered += list(rest)
    return ordered


class LongestFirst:
    """The plugin (registered by tests/conftest.py): reorders each worker's collection when
    xdist runs the suite with ``--dist load`` on more than one worker; else changes nothing.
    Last, so that it orders what ``-k``/``-m`` left (every worker orders alike: xdist checks
    that their collections agree)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """On the controller: a worker's own options say ``--dist no``, so tell it here."""
        node.workerinput["longest_first"] = {
            "dist": node.config.getoption("dist", "no"),
            "maxschedchunk": node.config.getoption("maxschedchunk", None)}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        workerinput = getattr(config, "workerinput", {})
        xdist = workerinput.get("longest_first", {})
        workers = workerinput.get("workercount", 1)
        if workers < 2 or xdist.get("dist") != "load":
            return
        batch = first_batch(len(items), workers, xdist.get("maxschedchunk"))
        items[:] = longest_first(items, workers, batch)
