"""Profiles: bundled files load, ``extends:`` merges, and every bad input is one clear line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launch.backends import load_profile
from launch.cli import main
from launch.core.profile_loader import BUNDLED_DIR, bundled_profile_names
from launch.errors import ConfigError
from tests.helpers import run_cli


def test_every_bundled_profile_loads_and_documents_itself() -> None:
    names = bundled_profile_names()
    assert {"local-cpu", "local-2gpu", "slurm-2x4", "slurm-local-2x2"} <= set(names)
    assert any(load_profile(name).kind == "tpu" for name in names)
    for name in names:
        profile = load_profile(name)
        assert profile.name == name and profile.description
        text = (BUNDLED_DIR / f"{name}.yaml").read_text()
        assert text.startswith("#"), f"{name}.yaml should explain itself in comments"


def test_bundled_shapes() -> None:
    cpu, slurm, test_cluster = load_profile("local-cpu"), load_profile("slurm-2x4"), load_profile("slurm-local-2x2")
    assert (cpu.kind, cpu.nodes, cpu.procs_per_node, cpu.device, cpu.dist_backend) == ("local", 1, 2, "cpu", "gloo")
    assert (slurm.nodes, slurm.procs_per_node, slurm.device, slurm.dist_backend) == (2, 4, "cuda", "nccl")
    assert slurm.slurm is not None and slurm.slurm.gpus_per_node == 4
    assert (test_cluster.nodes, test_cluster.procs_per_node, test_cluster.device) == (2, 2, "cpu")


def test_load_by_path_and_extends_merges_nested_sections(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: slurm-2x4\ndescription: my site\nslurm:\n  partition: a100\n"
                         "  account: ml\nenv:\n  NCCL_DEBUG: INFO\n", name="site.yaml")
    profile = load_profile(str(path))
    assert profile.name == "site" and profile.description == "my site"
    assert profile.slurm is not None
    assert (profile.slurm.partition, profile.slurm.account, profile.slurm.gpus_per_node) == ("a100", "ml", 4)
    assert profile.nodes == 2 and profile.env == {"NCCL_DEBUG": "INFO"}
    assert profile.source == str(path)


def test_extends_a_sibling_file_by_relative_path(write_profile) -> None:  # type: ignore[no-untyped-def]
    write_profile("kind: local\nprocs_per_node: 3\n", name="base.yaml")
    child = write_profile("extends: base.yaml\ndescription: child\n", name="child.yaml")
    assert load_profile(str(child)).procs_per_node == 3


def test_profiles_command_lists_and_resolves() -> None:
    listing = run_cli("profiles")
    assert listing.returncode == 0
    lines = listing.stdout.splitlines()
    assert any(line.startswith("local-cpu ") and "CPU" in line for line in lines)
    assert len(lines) == len(bundled_profile_names())
    shown = run_cli("profiles", "slurm-2x4")
    assert shown.returncode == 0
    resolved = yaml.safe_load(shown.stdout)
    assert resolved["slurm"]["gpus_per_node"] == 4 and resolved["nodes"] == 2


BAD_PROFILES = [
    ("kind: slurm\nslurm:\n  time_min: 2\n  signal_delay_s: 100\n",
     ["slurm.signal_delay_s: 100 s before the end of a 2 min job", "use at most 60"]),
    ("kind: local\nsecrets: HF_TOKEN\n", ["secrets: expected a list of strings"]),
    ("kind: local\nsecrets: [MY TOKEN, RANK]\n", ["secrets[0]: 'MY TOKEN' is not a valid environment variable",
                                                   "secrets[1]: set by launch for every worker"]),
    ("kind: [local\n", ["invalid YAML", ":1:"]),
    ("kind: local\nprocs_per_nod: 2\n", ["procs_per_nod: unknown key", "did you mean 'procs_per_node'?"]),
    ("kind: slurm\nslurm:\n  partiton: gpu\n", ["slurm.partiton: unknown key", "did you mean 'partition'?"]),
    ("kind: local\nnodes: two\n", ["nodes: expected an integer, got a string 'two'"]),
    ("kind: local\nnodes: 0\n", ["nodes: must be between 1 and 10000, got 0"]),
    ("kind: local\nprocs_per_node: -1\n", ["procs_per_node: must be between 1 and 1024, got -1"]),
    ("kind: slurm\nnodes: 2\n", ["slurm: required for kind slurm"]),
    ("kind: lokal\n", ["kind: 'lokal' is not allowed", "did you mean 'local'?", "allowed: local, slurm, tpu"]),
    ("kind: local\ndevice: gpu\n", ["device: 'gpu' is not allowed", "allowed: cuda, cpu, xla"]),
    ("kind: local\nenv:\n  OMP_NUM_THREADS: 1\n", ["env.OMP_NUM_THREADS: expected a string", 'quote it']),
    ("kind: local\nkind: slurm\n", ["duplicate key 'kind'"]),
    ("nodes: 1\n", ["kind: required; allowed: local, slurm, tpu"]),
    ("", ["empty profile"]),
    ("kind: local\nnodes: 2\n", ["nodes: kind local runs on this machine"]),
    ("kind: local\ndevice: cpu\nbackend: nccl\n", ["backend: nccl needs device cuda"]),
    ("kind: slurm\nnodes: 2\nprocs_per_node: 4\ndevice: cuda\nslurm:\n  gpus_per_node: 2\n",
     ["slurm.gpus_per_node: 2 GPUs per node cannot serve procs_per_node 4"]),
    ("kind: local\nslurm: {}\n", ["slurm: only allowed with kind slurm"]),
    ("kind: local\nrendezvous:\n  timeout: 5\n", ["rendezvous.timeout: unknown key", "did you mean 'timeout_s'?"]),
    ("kind: tpu\ndevice: xla\nnodes: 4\ntpu:\n  name: t\n", ["tpu.zone: required", "tpu.accelerator_type: required"]),
    ("extends: tpu-v4-32\ntpu:\n  name: My_TPU\n  zone: us central\n  accelerator_type: v4\n",
     ["tpu.name: 'My_TPU' must be lowercase letters", "tpu.zone: 'us central' is not a zone name",
      "tpu.accelerator_type: 'v4' is not a TPU type (for example v4-8, v5p-32)"]),
    ("extends: tpu-v4-32\ntpu:\n  remote: false\n", ["tpu.remote: false runs on this machine, but a pod slice"]),
    ("extends: tpu-v4-32\nenv:\n  HF_TOKEN: hf_abc\n", ["env.HF_TOKEN: looks like a secret, which launch never "
                                                         "puts on gcloud's command line"]),
    ("extends: tpu-v4-32\ntpu:\n  workdir: ''\n", ["tpu.workdir: must be a non-empty single line"]),
    ("extends: tpu-v4-32\ntpu:\n  wokdir: x\n", ["tpu.wokdir: unknown key", "did you mean 'workdir'?"]),
    ("extends: tpu-v4-8\ndevice: cpu\n", ["device: xla goes with kind tpu"]),
    ("extends: no-such-profile\n", ["extends: unknown profile 'no-such-profile'"]),
    ("extends: [a]\nkind: local\n", ["extends: expected a profile name or path"]),
    ("kind: local\n? [a, b]\n: c\n", ["invalid YAML", "keys must be plain words"]),
    ("kind: local\nenv:\n  null: x\n", ["env: the key None is read by YAML as nothing (null)"]),
    ("kind: local\nenv:\n  MASTER_PORT: '1'\n", ["env.MASTER_PORT: set by launch for every worker"]),
    ("kind: local\nname: ../../escape\n", ["name: '../../escape' must be letters, digits"]),
    ("kind: local\nnetwork_interface: ''\n", ["network_interface: '' is not an interface name"]),
    ("kind: slurm\nslurm:\n  partition: \"gpu\\ntouch /tmp/pwned\"\n",
     ["slurm.partition: must be a single line"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    nodes: '9'\n", ["slurm.extra_sbatch.nodes: set by launch from nodes"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    \"mail-type=ALL --wrap=id\": x\n",
     ["not an sbatch long option name"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    comment: \"x\\nid\"\n",
     ["slurm.extra_sbatch.comment: must be a single line"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    partitio: debug\n",
     ["slurm.extra_sbatch.partitio: set by launch from slurm.partition"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    gres: gpu:4\n", ["slurm.extra_sbatch.gres: set by launch"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    mail-typ: ALL\n",
     ["slurm.extra_sbatch.mail-typ: not an sbatch option; did you mean 'mail-type'?"]),
    ("kind: slurm\nnodes: 3000000\nslurm: {}\n", ["nodes: must be between 1 and 10000, got 3000000"]),
    ("kind: slurm\nslurm:\n  mem_gb: 0\n", ["slurm.mem_gb: must be more than 0, or all (every node's whole memory"]),
    ("kind: slurm\nslurm:\n  mem_gb: everything\n", ["slurm.mem_gb: expected a number or 'all', got a string"]),
    ("kind: slurm\nslurm:\n  mem_gb: 8\n  mem_per_cpu_gb: 2\n",
     ["slurm.mem_per_cpu_gb: SLURM takes one of mem_gb, mem_per_gpu_gb and mem_per_cpu_gb; slurm.mem_gb is set too"]),
    ("kind: slurm\nslurm:\n  gpu_type: a100\n", ["slurm.gpu_type: names the GPUs asked for, and this profile asks "
                                                  "for none"]),
    ("kind: slurm\nslurm:\n  output: logs/my job.out\n", ["slurm.output: 'logs/my job.out' cannot hold spaces"]),
    ("kind: slurm\nprefix: [-x, nsys]\nslurm: {}\n", ["prefix[0]: '-x': the prefix is a command and its words"]),
    ("kind: slurm\nslurm:\n  job_name: \"my job\"\n", ["slurm.job_name: 'my job' must be letters, digits"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    job-name: x\n",
     ["slurm.extra_sbatch.job-name: set by launch from slurm.job_name"]),
    ("kind: slurm\nslurm:\n  srun_args: [--cpu-bnd=none]\n",
     ["slurm.srun_args[0]: --cpu-bnd is not an srun option; did you mean 'cpu-bind'?"]),
    ("kind: slurm\nslurm:\n  srun_args: [--label, -N2]\n", ["slurm.srun_args[1]: '-N2' is not a long srun option"]),
    ("kind: slurm\nslurm:\n  srun_args: [--output=x.log]\n",
     ["slurm.srun_args[0]: --output is set by the run folder; leave it out"]),
    ("kind: slurm\nslurm:\n  srun_args: --label\n", ["slurm.srun_args: expected a list of strings"]),
    ("kind: slurm\nslurm:\n  requeue_signal: SIGUSR1\n",
     ["slurm.requeue_signal: 'SIGUSR1' is not allowed; did you mean 'USR1'? allowed: USR1, USR2"]),
    ("kind: slurm\nslurm:\n  extra_sbatch:\n    signal: USR1@90\n",
     ["slurm.extra_sbatch.signal: set by launch from slurm.requeue_signal and slurm.signal_delay_s"]),
    ("kind: local\nmodule: [gcc/12]\n", ["module: unknown key; did you mean 'modules'?"]),
    ("kind: local\nmodules: gcc/12\n", ["modules: expected a list of strings"]),
    ("kind: local\nmodules: ['gcc/12 cuda/12']\n", ["modules[0]: 'gcc/12 cuda/12' is not a module name"]),
    ("kind: local\nmodules: [--force]\n", ["modules[0]: '--force' is not a module name"]),
    ("kind: local\nmodule_purge: yes please\n", ["module_purge: expected a boolean (true/false), got a string"]),
    ("kind: local\nsetup:\n  - echo \"a: b\"\n", ["setup[0]: expected a string, got a mapping", "put the line in quotes"]),
    ("kind: local\nafter: [true]\n", ["after[0]: expected a string, got a boolean", "put it in quotes"]),
    ("kind: local\nsetup: ['']\n", ["setup[0]: an empty line; remove it"]),
    ("kind: local\nnode_setup: [\"echo \\x01\"]\n", ["node_setup[0]: holds a control character"]),
    ("kind: local\nnode_setpu: [ls]\n", ["node_setpu: unknown key; did you mean 'node_setup'?"]),
    ("kind: local\npython: ''\n", ["python: must be a non-empty single line"]),
    ("kind: local\npython: -c\n", ["python: must be a non-empty single line, not starting with '-'"]),
    ("kind: ssh\nnodes: 1\npython: /opt/venv/bin/python\nssh:\n  hosts: [a]\n  python: python3\n",
     ["ssh.python: 'python3' is the old spelling of python ('/opt/venv/bin/python'); keep python only"]),
]


@pytest.mark.parametrize(("text", "expected"), BAD_PROFILES, ids=[e[0] for _, e in BAD_PROFILES])
def test_bad_profile_is_one_line_naming_file_and_key(write_profile, capsys, text: str,  # type: ignore[no-untyped-def]
                                                     expected: list[str]) -> None:
    path = write_profile(text)
    status = main(["render", "--profile", str(path), "--strategy", "ddp"])
    error = capsys.readouterr().err
    assert status == 2
    assert len(error.strip().splitlines()) == 1, error
    assert str(path) in error
    for fragment in expected:
        assert fragment in error


def test_a_mistake_in_an_extended_file_is_blamed_on_that_file(write_profile, capsys) -> None:  # type: ignore[no-untyped-def]
    base = write_profile("kind: local\ncolour: red\n", name="base.yaml")
    child = write_profile("extends: base.yaml\n", name="child.yaml")
    assert main(["profiles", str(child)]) == 2
    error = capsys.readouterr().err
    assert f"{base}: colour: unknown key" in error and str(child) not in error


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"kind: local\ndescription: caf\xe9\n")
    assert main(["profiles", str(path)]) == 2
    assert f"{path}: not UTF-8 text" in capsys.readouterr().err


def test_a_folder_or_a_bundled_name_with_yaml_suffix_is_explained(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["profiles", str(tmp_path) + "/"]) == 2
    assert "is a folder, not a profile file" in capsys.readouterr().err
    assert main(["profiles", "local-cpu.yaml"]) == 2
    assert "did you mean the bundled profile 'local-cpu'?" in capsys.readouterr().err


def test_profiles_command_prints_a_user_profile_resolved(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: slurm-2x4\nslurm:\n  partition: a100\n", name="site.yaml")
    shown = run_cli("profiles", str(path))
    assert shown.returncode == 0, shown.stderr
    resolved = yaml.safe_load(shown.stdout)
    assert resolved["name"] == "site" and resolved["slurm"]["partition"] == "a100"
    assert resolved["slurm"]["gpus_per_node"] == 4 and "extends" not in resolved


def test_extends_cycle_is_reported(write_profile) -> None:  # type: ignore[no-untyped-def]
    write_profile("extends: b.yaml\nkind: local\n", name="a.yaml")
    b = write_profile("extends: a.yaml\n", name="b.yaml")
    with pytest.raises(ConfigError, match="extends: cycle .*a.yaml -> .*b.yaml"):
        load_profile(str(b))


def test_all_problems_of_a_file_are_reported_together(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("kind: local\nnodes: 0\nprocs_per_node: x\ncolour: red\n")
    with pytest.raises(ConfigError) as caught:
        load_profile(str(path))
    message = str(caught.value)
    assert "procs_per_node: expected an integer" in message and "colour: unknown key" in message


@pytest.mark.parametrize(("args", "expected"), [
    (["--profile", "loca-cpu", "--strategy", "ddp"], ["unknown profile 'loca-cpu'", "did you mean 'local-cpu'?"]),
    (["--profile", "local-cpu", "--strategy", "dpp"], ["unknown strategy 'dpp'", "did you mean 'ddp'?"]),
    (["--profile", "nowhere/x.yaml", "--strategy", "ddp"], ["nowhere/x.yaml: no such profile file"]),
    (["--profile", "local-cpu", "--strategy", "ddp", "--", "--epochs", "0"], ["TRAIN_ARGS: argument --epochs"]),
    (["--profile", "local-cpu", "--strategy", "ddp", "--", "--epoch", "2"], ["did you mean '--epochs'?"]),
    (["--profile", "local-cpu", "--strategy", "ddp", "--", "--run-dir", "x"], ["--run-dir is set by launch"]),
    (["--profile", "local-cpu", "--script", "nope.py"], ["--script nope.py: no such file"]),
    (["--profile", "local-cpu", "--script", "tests"], ["--script tests: is a folder, not a script"]),
    (["--profile", "local-cpu", "--module", "no_such_pkg.train"],
     ["--module no_such_pkg.train: does not import", "No module named 'no_such_pkg'"]),
    (["--profile", "local-cpu", "--strategy", "trainer", "--script", "bench/handwritten_ddp.py"],
     ["runs the bundled example launch_examples.trainer only", "use --strategy ddp"]),
    (["--profile", "local-cpu", "--script", "a.py", "--module", "b"], ["not allowed with argument"]),
])
def test_bad_command_line_exits_2_with_one_line_and_no_traceback(args: list[str], expected: list[str]) -> None:
    result = run_cli("render", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in expected:
        assert fragment in result.stderr


def test_a_missing_profile_file_named_as_such(tmp_path: Path) -> None:
    result = run_cli("profiles", str(tmp_path / "gone.yaml"))
    assert result.returncode == 2 and "gone.yaml: no such profile file" in result.stderr


def test_keys_are_read_as_written_not_as_yaml_booleans(write_profile) -> None:  # type: ignore[no-untyped-def]
    """YAML 1.1 reads `on`, `off`, `yes`, `no` as booleans; a profile's keys are words (notify.on, a variable ON)."""
    from launch.backends import load_profile

    profile = load_profile(str(write_profile("extends: local-cpu\nenv:\n  ON: '1'\n  no: '0'\nnotify:\n"
                                             "  webhook: https://hooks.example.com/x\n  on: [failed]\n")))
    assert profile.env["ON"] == "1" and profile.env["no"] == "0"
    assert profile.notify is not None and profile.notify.on == ("failed",)
