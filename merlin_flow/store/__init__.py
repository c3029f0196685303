"""merlin's state: the SQL models and the database that holds them."""

from merlin_flow.store.database import Database, open_database, upgrade
from merlin_flow.store.models import Attempt, Base, Event, Job, LlmCall, Step, utcnow

__all__ = [
    "Attempt",
    "Base",
    "Database",
    "Event",
    "Job",
    "LlmCall",
    "Step",
    "open_database",
    "upgrade",
    "utcnow",
]
