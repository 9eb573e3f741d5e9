"""What a run's plan was, as data: written into the run folder beside plan.txt (``plan.json``), and read back
by ``launch ui`` and ``report``. plan.txt stays for people; nothing reads its wording."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from launch.core.layout import PLAN_FACTS, read_json
from launch.core.plan import LaunchPlan


@dataclass(frozen=True, kw_only=True)
class PlanFacts:
    """A plan's facts; a run folder without them (or from before they were written) reads as unknown ("?", 0)."""

    profile: str = "?"
    strategy: str = "?"
    nodes: int = 0
    procs_per_node: int = 0
    device: str = "?"
    backend: str = "?"
    snapshot: str = ""  # "ROOT (KIND, N files, SIZE), sha256 DIGEST", or "" without a snapshot
    snapshot_digest: str = ""  # the snapshot's whole sha256

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def facts_of(plan: LaunchPlan) -> PlanFacts:
    profile = plan.profile
    return PlanFacts(profile=profile.name, strategy=plan.strategy, nodes=profile.nodes,
                     procs_per_node=profile.procs_per_node, device=profile.device, backend=plan.job.backend,
                     snapshot=plan.snapshot.describe() if plan.snapshot else "",
                     snapshot_digest=plan.snapshot.digest if plan.snapshot else "")


def facts_record(plan: LaunchPlan) -> dict[str, object]:
    """plan.json's content."""
    return asdict(facts_of(plan))


def read_facts(run_dir: Path) -> PlanFacts:
    """The facts of the run in ``run_dir``; what its plan.json lacks, or holds of the wrong type, stays unknown."""
    recorded = read_json(run_dir / PLAN_FACTS) or {}
    known = {field.name: recorded[field.name] for field in fields(PlanFacts)
             if isinstance(recorded.get(field.name), type(field.default))}
    return PlanFacts(**known)
