"""Why a job failed or stopped moving: the hang watch, stack taking, progress counters, failure
triage and the failure record. The runtime writes progress counters through this package too."""
