"""Cluster profiles: frozen dataclasses, loaded strictly from YAML (see ``launch.core.profile_loader``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from launch.core.devices import default_dist_backend

Kind = Literal["local", "slurm", "tpu", "ssh"]
Device = Literal["cuda", "cpu", "xla"]
Collectives = Literal["nccl", "gloo", "auto"]  # torch.distributed's backend: the library of collectives


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where the workers meet: a fixed port, or None for one chosen per job (free port, job-id formula)."""

    port: int | None = None
    timeout_s: int = 300
    address: str | None = None  # ssh profiles: the head's address as the other hosts reach it (else the first host)


@dataclass(frozen=True, kw_only=True)
class LoginSection:
    """The cluster's login host, when launch runs elsewhere (a laptop): reached with the OpenSSH client, as
    ``~/.ssh/config`` knows it; the code and the plan's files are shipped into ``workdir`` there, and the job is
    submitted and followed from there. The profile's ``python`` names the cluster's interpreter (python3)."""

    host: str  # [user@]host[:port], as ssh and ~/.ssh/config know it
    workdir: str  # the project folder on the cluster's shared file system (absolute); the job starts there
    identity_file: str | None = None  # ssh -i
    jump_host: str | None = None  # ssh -J (ProxyJump)
    options: dict[str, str] = field(default_factory=dict)  # ssh -o KEY=VALUE
    runs_dir: str = "runs"  # run folders on the cluster live here (relative: to workdir)


@dataclass(frozen=True, kw_only=True)
class EnvironmentSection:
    """The Python environment launch builds on the cluster with uv, from the project's own dependency file, once
    per content (``launch.core.python_env``); the job then runs its interpreter, with this machine's launch."""

    source: str = field(metadata={"key": "from"})  # pyproject.toml, uv.lock or a requirements file (relative: to
    # the submitting folder)
    index_url: str | None = None  # where uv finds packages (uv's default: its own configuration, else PyPI)
    wheels: str | None = None  # a folder of wheels here, shipped to the cluster: the only source (offline)
    inherit: bool = False  # the packages of the profile's python stay importable beneath the environment's own
    uv: str = "uv"  # uv on the cluster: a path, or a name on its PATH


@dataclass(frozen=True, kw_only=True)
class SlurmSection:
    """The allocation asked of SLURM; field names follow sbatch's long options."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int | None = None  # None: the partition's default time limit
    cpus_per_task: int | None = None
    mem_gb: float | Literal["all"] | None = None  # "all": every node's whole memory (sbatch --mem=0)
    mem_per_gpu_gb: float | None = None  # instead of mem_gb: memory per GPU (sbatch --mem-per-gpu)
    mem_per_cpu_gb: float | None = None  # instead of mem_gb: memory per CPU (sbatch --mem-per-cpu)
    gpus_per_node: int | None = None  # None: one per process on cuda; 0: none asked (the partition gives them)
    gpu_type: str | None = None  # the GPU model SLURM knows (gres type): --gpus-per-node=TYPE:N
    constraint: str | None = None
    exclusive: bool = False
    signal_delay_s: int = 90  # the requeue signal this long before the time limit: the ranks checkpoint and stop
    max_timeouts: int = 3  # requeues after running into the time limit (preemptions do not count)
    requeue_signal: str = "USR2"  # the signal that means 'checkpoint, then stop' (USR1, USR2)
    # After the ranks stopped at the time limit: the job requeues itself, the run goes on in a job queued behind
    # this one at its start (sites without requeue; sbatch launcher), or the run stops there.
    on_time_limit: Literal["requeue", "chain", "stop"] = "requeue"
    max_chain: int = 10  # on_time_limit chain: the most jobs of one run, the first included
    max_node_failures: int = 3  # times a run goes on elsewhere after nodes failed it; then it fails, naming them
    spare_nodes: int = 0  # nodes asked for beyond `nodes` (sbatch launcher): the health gate's first fit ones train,
    # the others are given back as training starts
    job_name: str | None = None  # None: the profile's name and what runs ("slurm-2x4-ddp")
    output: str | None = None  # where SLURM writes the batch log, for sites that require a place (sbatch's
    # --output pattern); None: the run folder. Either way launch reads it from the run folder.
    srun_args: tuple[str, ...] = ()  # srun options for the job's step, as "--name=value" or "--flag"
    extra_sbatch: dict[str, str] = field(default_factory=dict)  # "" for a flag-only option ("overcommit": "")
    login: LoginSection | None = None  # submit through this login host over ssh (else: sbatch is here)


HealthCheck = Literal["devices", "memory", "disk", "versions", "reach", "all_reduce", "gpu", "dcgm"]
# the default checks: dcgm (dcgmi diag -r 1, tens of seconds) only where a profile asks for it
HEALTH_CHECKS: tuple[HealthCheck, ...] = ("devices", "memory", "disk", "versions", "reach", "all_reduce", "gpu")


@dataclass(frozen=True, kw_only=True)
class HealthSection:
    """The health gate: one short step per node as every SLURM job (and every requeue) starts, before the
    training, which decides the nodes that are fit (``launch.runtime.health_gate``). A node that fails it is
    avoided, and the run goes on without it."""

    enabled: bool = True
    checks: tuple[HealthCheck, ...] = HEALTH_CHECKS
    budget_s: float = 10.0  # a node that has not answered (or reached the others) by then is unfit
    min_free_memory_gb: float = 1.0  # on the node (MemAvailable)
    min_free_disk_gb: float = 1.0  # where the run folder and its checkpoints are
    avoid_hours: float = 24.0  # how long this user's next jobs on the cluster avoid a node that failed


NotifyEvent = Literal["start", "failed", "hung", "finished"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("start", "failed", "hung", "finished")


@dataclass(frozen=True, kw_only=True)
class NotifySection:
    """A Slack-compatible webhook told of the run's events (``launch.core.notify``): once each, from rank 0 as it
    starts, and from whoever records its end. The URL's path, where its secret is, is masked wherever it is shown."""

    webhook: str  # http:// or https://
    on: tuple[NotifyEvent, ...] = NOTIFY_EVENTS


@dataclass(frozen=True, kw_only=True)
class WandbTracking:
    """Weights & Biases: the run is the run folder's (its id, group and directory), resumed where the job is."""

    project: str
    entity: str | None = None
    group: str | None = None  # default: the sweep's name for a sweep's point, else the run's own


@dataclass(frozen=True, kw_only=True)
class MlflowTracking:
    """MLflow: one MLflow run per launch run, its id kept in the run folder and continued by a resumed job."""

    tracking_uri: str  # http(s)://server, sqlite:///path.db, databricks, ...
    experiment: str


@dataclass(frozen=True, kw_only=True)
class TrackingSection:
    """Experiment trackers ``job.log_metrics`` also logs to, from the main process (``launch.runtime.trackers``)."""

    wandb: WandbTracking | None = None
    mlflow: MlflowTracking | None = None


@dataclass(frozen=True, kw_only=True)
class TpuSection:
    """A Cloud TPU VM or pod slice, addressed the way ``gcloud compute tpus tpu-vm`` does."""

    name: str
    zone: str
    accelerator_type: str
    workers: int = 1  # hosts in the slice: 1 for a single TPU VM
    project: str | None = None  # gcloud's configured project when None
    runtime_version: str | None = None  # the VM image the TPU was created with (a record; not checked)
    python: str | None = None  # the profile's python: under its old name; default python3 on every host
    workdir: str = "launch"  # the project's folder on every host (relative: to the ssh user's home)
    remote: bool | None = None  # through gcloud from here; None: yes for a pod slice, no for a single VM

    @property
    def via_gcloud(self) -> bool:
        """Whether ``submit`` reaches the hosts with ``gcloud ... ssh --worker=all`` (else: this is the TPU VM)."""
        return self.remote if self.remote is not None else self.workers > 1


@dataclass(frozen=True, kw_only=True)
class SshSection:
    """Machines without a scheduler, reached with the OpenSSH client: one node per host, in rank order."""

    hosts: tuple[str, ...] = ()  # [user@]host[:port], as ssh and ~/.ssh/config know them; node 0 is the head
    hostfile: str | None = None  # instead of hosts: a file of them, one per line (relative to the profile's folder)
    identity_file: str | None = None  # ssh -i
    jump_host: str | None = None  # ssh -J (ProxyJump)
    options: dict[str, str] = field(default_factory=dict)  # ssh -o KEY=VALUE, for every host
    python: str | None = None  # the profile's python: under its old name; default python3 on every host
    workdir: str | None = None  # the project folder on every host; None: the same path as the submitting folder
    runs_dir: str = "runs"  # run folders on every host live here (relative: to workdir)


@dataclass(frozen=True, kw_only=True)
class ContainerSection:
    """The image every process runs in, and the runtime that starts it (launch.core.containers)."""

    image: str  # pyxis: a registry image or .sqsh file; apptainer/singularity: a .sif or docker://...; podman: a name;
    # shifter: docker:IMAGE:TAG; edf: your environment file (a path, or a name in the EDF search path)
    runtime: Literal["pyxis", "apptainer", "singularity", "podman", "shifter", "edf"]
    mounts: tuple[str, ...] = ()  # "src:dst" or "src:dst:ro"; the run folder and the submitting folder are added
    workdir: str | None = None  # where the processes start inside; None: the submitting folder's own path
    options: tuple[str, ...] = ()  # more options for the runtime (srun with pyxis), one word each


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One cluster profile after ``extends:`` is resolved; ``source`` is the file it came from."""

    name: str
    description: str = ""
    kind: Kind
    nodes: int = 1
    procs_per_node: int = 1
    device: Device = "cpu"
    # Its YAML key is `backend:` (torch's word); in the code "backend" is where a plan runs (launch.backends).
    collectives: Collectives = field(default="auto", metadata={"key": "backend"})
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # more variable names to treat as secrets (masked everywhere, never on disk)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    network_interface: str | None = None
    python: str | None = None  # the interpreter on the nodes: a path, or a name found on PATH after modules and
    # setup; None: this machine's own (local, SLURM) or python3 (ssh, TPU hosts)
    modules: tuple[str, ...] = ()  # environment modules loaded before setup (module load ...)
    module_purge: bool = False  # module purge before loading them
    prefix: tuple[str, ...] = ()  # words before every rank's python (nsys profile ..., numactl ...), one argv
    setup: tuple[str, ...] = ()  # shell lines, in the shell that starts the processes, before they start
    node_setup: tuple[str, ...] = ()  # shell lines once on every node before any rank starts there
    after: tuple[str, ...] = ()  # shell lines once after the processes end, whatever the outcome
    hang_timeout_s: int | None = None  # no progress from any rank this long: the job is ended as hung (0: never;
    # None: 1800 once the code reports a step through launch.job, never for code that reports none)
    restart_on_hang: bool = False  # a hung job may be restarted like a failed one (torchrun's --max-restarts)
    container: ContainerSection | None = None  # the image the processes run in
    environment: EnvironmentSection | None = None  # built with uv on the cluster; the nodes run its python
    accelerate_config: str | None = None  # the user's own accelerate config file (relative: to this file)
    slurm: SlurmSection | None = None
    health: HealthSection = field(default_factory=HealthSection)  # SLURM jobs (sbatch launcher)
    notify: NotifySection | None = None  # a webhook told of the run's start, failure, hang and finish
    tracking: TrackingSection | None = None  # W&B, MLflow: the run folder is the tracker's run
    tpu: TpuSection | None = None
    ssh: SshSection | None = None
    source: str = field(default="", metadata={"yaml": False})

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def has_shell(self) -> bool:
        """Whether the user's shell surrounds the job (modules, setup, node_setup or after)."""
        return bool(self.modules or self.module_purge or self.setup or self.node_setup or self.after)

    def node_python(self, default: str) -> str:
        """The interpreter the nodes run: the profile's, its ssh or tpu section's (the old spelling), or
        ``default``."""
        section = self.ssh or self.tpu
        if self.container is not None:  # in the image: the profile's, else the image's python3
            return self.python or "python3"
        return self.python or (section.python if section is not None else None) or default

    @property
    def dist_backend(self) -> str:
        """The torch.distributed backend: the profile's choice, or the usual one for its device."""
        return self.collectives if self.collectives != "auto" else default_dist_backend(self.device)
