"""`fluidctl train` inputs a user can get wrong, and words of the one-line error each gets: the
in-process CLI (tests/unit) and the real command (tests/e2e) are held to the same table.
Placeholders: {behave} a script, {busy} a port in use, {tmp} a directory."""

# errors the in-process CLI gives as the real command does
TRAIN_BAD_INPUT = [
    (["--nproc", "two", "{behave}"], "'two' is not a valid integer"),
    (["--gpus", "0;1", "{behave}"], "malformed --gpus"),
    (["--env", "NOVALUE", "{behave}"], "malformed --env 'NOVALUE'"),
    (["--env", "1X=2", "{behave}"], "malformed --env '1X=2'"),
    (["--env-file", "nope.env", "{behave}"], "--env-file nope.env does not exist"),
    (["--started-port", "{busy}", "--nproc", "1", "{behave}"], "is busy"),
    (["--log-dir", "afile", "{behave}"], "log dir afile is a file"),
    (["--bogus", "{behave}"], "No such option '--bogus'"),
    (["--json", "{behave}"], "--json only works with --dry-run"),
    (["--tee", "some", "{behave}"], "Invalid value for '--tee'"),
    (["--max-restarts", "-1", "{behave}"], "--max-restarts: must be >= 0"),
    (["--grace-period", "-1", "{behave}"], "--grace-period -1.0 is not a number of seconds"),
    (["--pservers", "2", "{behave}"], "need --mode pserver"),
    (["--mode", "pserver", "--pserver-endpoints", "nohost", "{behave}"],
     "malformed pserver endpoint"),
    (["--health-gate", "{behave}"], "--health-gate measures the nodes of --hostfile/--hosts"),
    (["--backend", "slurm", "--health-gate", "{behave}"],
     "--health-gate measures the nodes of --hostfile/--hosts over SSH"),
    (["{tmp}"], "is a directory"),
    ([], "Missing argument 'SCRIPT'"),
    (["--backend", "k8s", "--image", "i", "{behave}"], "--backend k8s needs --kind"),
    (["--backend", "k8s", "--kind", "jobset", "{behave}"], "--backend k8s needs --image"),
    (["--kind", "jobset", "{behave}"], "--kind is a Kubernetes option"),
    (["--backend", "k8s", "--kind", "pytorchjob", "--image", "i", "--mode", "pserver",
      "{behave}"], "--mode pserver has no replica set in a pytorchjob"),
    (["--backend", "k8s", "--kind", "jobset", "--image", "i", "{behave}"],
     "add --dry-run to print the YAML, or --apply"),
    (["--backend", "k8s", "--kind", "jobset", "--image", "i", "--namespace", "Bad_NS",
      "--dry-run", "{behave}"], "is not a Kubernetes namespace name"),
]

# errors checked on the real command only (a missing script or program, GPU discovery,
# --nproc ranges)
TRAIN_BAD_INPUT_E2E = [
    (["missing.py"], "SCRIPT missing.py does not exist"),
    (["./not-here.sh"], "does not exist"),
    (["no-such-program-xyz"], "neither a file nor a program on PATH"),
    (["--nproc", "0", "{behave}"], "--nproc: must be >= 1"),
    (["--nproc", "-2", "{behave}"], "--nproc: must be >= 1"),
    (["--gpus", "2", "{behave}"], "no GPUs found"),
    (["--gpus", "0,1", "{behave}"], "no GPUs found"),
]
