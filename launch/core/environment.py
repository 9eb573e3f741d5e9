"""The environment variables launch sets in every process of a job: the one table of their names, read by the
planner that sets them and by ``launch.job`` in the job that reads them (the README's table is checked
against it)."""

from launch.core.secrets import PLAN_ENV_VARIABLE, SECRET_NAMES_VARIABLE

RUN_DIR = "LAUNCH_RUN_DIR"
CHECKPOINT_DIR = "LAUNCH_CHECKPOINT_DIR"
RESUME = "LAUNCH_RESUME"
PROFILE = "LAUNCH_PROFILE"
DEVICE = "LAUNCH_DEVICE"
DIST_BACKEND = "LAUNCH_DIST_BACKEND"
RENDEZVOUS_TIMEOUT = "LAUNCH_RENDEZVOUS_TIMEOUT"
STOP_SIGNALS = "LAUNCH_STOP_SIGNALS"
EXPAND_ARGS = "LAUNCH_EXPAND_ARGS"
HANG_TIMEOUT = "LAUNCH_HANG_TIMEOUT"
RESTART_ON_HANG = "LAUNCH_RESTART_ON_HANG"
TRACKING = "LAUNCH_TRACKING"
PLAN_ENV = PLAN_ENV_VARIABLE
SECRET_NAMES = SECRET_NAMES_VARIABLE

ENVIRONMENT: tuple[tuple[str, str], ...] = (
    (RUN_DIR, "the run folder (absolute): rank logs, metrics.jsonl, result.json"),
    (CHECKPOINT_DIR, "where checkpoints go (the run folder's checkpoints/)"),
    (RESUME, "1: continue from the last complete checkpoint there, if any (set on every launch)"),
    (PROFILE, "the profile's name"),
    (DEVICE, "the profile's device: cpu, cuda or xla"),
    (DIST_BACKEND, "the profile's collective backend: gloo, nccl or xla"),
    (RENDEZVOUS_TIMEOUT, "seconds a rank waits for the others when the process group is made"),
    (STOP_SIGNALS, "the signals that mean 'checkpoint, then stop' on this backend (SLURM: SIGUSR2,SIGTERM)"),
    (EXPAND_ARGS, "1 (submit --expand-args): ${NAME} in the code's arguments is expanded in each process"),
    (HANG_TIMEOUT, ("seconds without progress before the hang watchdog ends the job as hung (0: never; unset: "
                    "1800 once the code reports a step)")),
    (RESTART_ON_HANG, "1 (profile restart_on_hang): a hung job may be restarted like a failed one"),
    (TRACKING, "the trackers job.log_metrics also logs to (profile tracking:): wandb, mlflow"),
    (PLAN_ENV, "the names of the variables the plan added"),
    (SECRET_NAMES, "the names the profile marks secret (masked in logs and results)"),
)
