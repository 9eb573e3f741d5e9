"""What a profile's ``tpu:`` section may say: names as gcloud accepts them, and hosts reachable the way the
profile says; each problem as one line naming its key."""

from __future__ import annotations

import re
from pathlib import Path

from launch.core.profile import Profile, TpuSection
from launch.core.secrets import looks_secret
from launch.core.site_shell import check_section_python
from launch.errors import CONTROL_CHARACTERS

_TPU_NAMES = (  # what gcloud compute tpus tpu-vm accepts
    ("name", re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z"),
     "must be lowercase letters, digits and '-', starting with a letter (the TPU's name in gcloud)"),
    ("zone", re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]\Z"), "is not a zone name (for example us-central2-b)"),
    ("project", re.compile(r"[a-z][-a-z0-9.:]{4,62}[a-z0-9]\Z"), "is not a Google Cloud project id"),
    ("accelerator_type", re.compile(r"v[0-9]+[a-z]*-[0-9]+\Z"), "is not a TPU type (for example v4-8, v5p-32)"),
)


def completed(profile: Profile, source: Path) -> Profile:
    return profile  # the section names nothing elsewhere


def check(profile: Profile, tpu: TpuSection) -> list[str]:
    """Names as gcloud accepts them, and hosts reachable the way the profile says."""
    problems = check_section_python(profile, "tpu", tpu.python)
    problems += [f"tpu.{key}: {getattr(tpu, key)!r} {rule}" for key, pattern, rule in _TPU_NAMES
                 if getattr(tpu, key) is not None and not pattern.match(getattr(tpu, key))]
    if tpu.workers != profile.nodes:
        problems.append(f"tpu.workers: must equal nodes (one node per TPU host), got {tpu.workers} "
                        f"workers and {profile.nodes} nodes")
    if not tpu.workdir or CONTROL_CHARACTERS.search(tpu.workdir):
        problems.append("tpu.workdir: must be a non-empty single line")
    if tpu.remote is False and tpu.workers > 1:
        problems.append(f"tpu.remote: false runs on this machine, but a pod slice of {tpu.workers} hosts is "
                        "reached through gcloud; remove it or set it to true")
    if tpu.via_gcloud:  # the hosts get the plan's variables on gcloud's command line: no secret may ride there
        problems += [f"env.{name}: looks like a secret, which launch never puts on gcloud's command line; set it "
                     "in each TPU host's own environment instead" for name in profile.env if looks_secret(name,
                                                                                                 profile.secrets)]
    return problems
