"""scontrol's output parsed from recorded text."""
from fluidctl.backends.slurm import slurmctl


def test_scontrol_parsing():
    line = ("JobId=7 JobName=t UserId=root(0) JobState=FAILED Reason=NonZeroExitCode "
            "Dependency=(null) ExitCode=3:0 NodeList=127.0.0.[2-3] Command=/x/job.sbatch")
    fields = slurmctl.parse_scontrol(line)
    assert fields["JobState"] == "FAILED" and fields["NodeList"] == "127.0.0.[2-3]"
    assert slurmctl.exit_code_of("FAILED", fields["ExitCode"]) == 3
    assert slurmctl.exit_code_of("CANCELLED", "0:15") == 143
    assert slurmctl.exit_code_of("COMPLETED", "0:0") == 0
    assert slurmctl.exit_code_of("TIMEOUT", "0:0") == 1
