"""Machines over ssh: ssh and scp commands, the job spec, the fan-out here that starts every host and watches
them, and the host guard that runs on each host and ends its processes when the fan-out is gone."""
