"""merlin's state: the SQL models and the database that holds them."""

from merlin_flow.store.database import Database, open_database, upgrade
from merlin_flow.store.models import (
    Attempt,
    Base,
    BudgetHold,
    Event,
    Job,
    LlmCall,
    Step,
    WorkerBeat,
    utcnow,
)
from merlin_flow.store.status import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    OPEN_ATTEMPT_STATUSES,
    RESUMABLE_JOB_STATUSES,
    AttemptStatus,
    JobStatus,
    Phase,
    StepStatus,
)

__all__ = [
    "FINAL_JOB_STATUSES",
    "FINISHED_STEP_STATUSES",
    "OPEN_ATTEMPT_STATUSES",
    "RESUMABLE_JOB_STATUSES",
    "Attempt",
    "AttemptStatus",
    "Base",
    "BudgetHold",
    "Database",
    "Event",
    "Job",
    "JobStatus",
    "LlmCall",
    "Phase",
    "Step",
    "StepStatus",
    "WorkerBeat",
    "open_database",
    "upgrade",
    "utcnow",
]
