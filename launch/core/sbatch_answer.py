"""What sbatch answers: the job id ``--parsable`` prints, or its refusal as one line."""

from __future__ import annotations

import re
import subprocess

from launch.errors import SubmitError


def sbatch_reason(text: str) -> str:
    """sbatch's first error line, wherever it sits in the text (sbatch's stderr, or submitit's message)."""
    errors = re.findall(r"sbatch: error: (.+)", text)
    if errors:
        return errors[0].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def sbatch_job_id(done: subprocess.CompletedProcess[str], where: str = "") -> str:
    """The job id that ``sbatch --parsable`` printed; its refusal, or an answer without an id, as one line
    (``where``: " on HOST", where it ran)."""
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job{where}: {sbatch_reason(done.stderr)}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch{where} printed no job id: {done.stdout.strip()!r}")
    return job_id
