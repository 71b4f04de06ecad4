"""The suite never touches the user's real state: tests/conftest.py's session fixture points
FLUIDCTL_STATE_DIR at a directory of the run, and every state path follows it."""
import os
from pathlib import Path

from fluidctl import paths


def test_every_state_path_is_in_the_runs_directory_not_the_users_home(isolated_state):
    assert os.environ[paths.STATE_ENV] == str(isolated_state)
    home = Path.home() / ".fluidctl"
    for path in (paths.state_dir(), paths.jobs_dir(), paths.bad_nodes_ledger(),
                 paths.user_secret_file(), paths.pserver_pid_file(6170)):
        assert Path(isolated_state) in (path, *path.parents), path
        assert home not in path.parents, path
