"""Every error merlin_flow raises, under one base class.

The tree is shallow and split by who must act::

    MerlinError                  base of everything below
    ├── InputError               the user's input is wrong (CLI exit code 2)
    │   ├── TaskListError        a TaskList file is invalid
    │   ├── ConfigError          merlin.toml is invalid (unknown tier, missing script...)
    │   ├── RepositoryError      --repo is not a usable git work tree or git URL
    │   ├── JobNotFoundError     no job has the given id
    │   ├── SandboxUnavailable   the configured sandbox (bwrap) cannot run here
    │   ├── AgentFileError       an agent file is invalid, or its imports form a cycle
    │   ├── NoModelAvailable     no configured tier has its credentials or server
    │   └── PlanRefused          a GitHub thread's plan block is missing, altered or foreign
    ├── StoreError               the database cannot be used (schema not upgraded...)
    │   └── RecordInDoubt        a write's connection was lost: whether it landed is unknown
    ├── GitError                 a git command failed unexpectedly
    │   └── RemoteUnavailable    a job's git remote cannot be reached (retried later)
    ├── GitHubError              the GitHub API refused or failed a call
    ├── SetupFailed              the project's environment could not be built (job fails)
    ├── DiskFull                 no space left under MERLIN_HOME: the step waits for space
    ├── StepFailure              a run failure of one attempt, recorded on the attempt
    │   ├── AgentError           the agent could not finish (turn limit, model error)
    │   │   ├── ModelUnreachable the tier's model cannot be used (no key, no server)
    │   │   └── ModelRefused     the model declined, or a provider's filter stopped it
    │   ├── ToolSourceError      an MCP server could not start or list its tools
    │   ├── ReplayDiverged       a replay asked for a call the original job never made
    │   └── PlanUnreadable       a planner's answer holds no plan in a format merlin reads
    ├── TransitionRefused        a status change asked of a row in a state it does not fit
    ├── BudgetExceeded           control flow: the job's budget is spent; the job stops
    ├── JobCancelled             control flow: `merlin cancel`; the running step stops
    └── LeaseLost                control flow: another worker owns the step now

User mistakes (``InputError``) are reported and nothing is enqueued. Run failures
(``StepFailure``) never escape a task: they are written to the attempt row and drive the
fix / escalate decision. ``LeaseLost`` stops a task that must not continue.
"""

from __future__ import annotations


class MerlinError(Exception):
    """Base class of every error raised by merlin_flow."""

    exit_code = 1


class InputError(MerlinError):
    """The user's input is wrong; nothing was enqueued or written."""

    exit_code = 2


class TaskListError(InputError):
    """A TaskList file cannot be read or does not validate."""


class ConfigError(InputError):
    """The configuration (merlin.toml, environment) is invalid."""


class RepositoryError(InputError):
    """--repo is not a git work tree with a commit, nor a git URL merlin can clone."""


class JobNotFoundError(InputError):
    """No job with the given id exists in the store."""


class SandboxUnavailable(InputError):
    """`[sandbox] mode = "bwrap"` is configured but bubblewrap cannot run on this machine."""


class AgentFileError(InputError):
    """An agent file (or a file it imports) cannot be read or does not validate."""


class NoModelAvailable(InputError):
    """No configured tier has its credentials or its server: no attempt could succeed."""


class PlanRefused(InputError):
    """A GitHub thread's plan block is missing, unsigned, signed with another key or altered."""


class StoreError(MerlinError):
    """The database is unreachable or its schema is not at the current revision."""

    exit_code = 2


class RecordInDoubt(StoreError):
    """A write's connection was lost during its commit, and whether it landed is unknown."""

    exit_code = 1


class GitError(MerlinError):
    """A git command failed where it was expected to succeed."""


class RemoteUnavailable(GitError):
    """A job's git remote did not answer after retries; the task is recovered later."""


class GitHubError(MerlinError):
    """The GitHub API refused or failed a call (a token without the permission, a 5xx)."""


class SetupFailed(MerlinError):
    """The project's environment (`[environment] setup`) failed to build; the job fails."""


class DiskFull(MerlinError):
    """The disk under MERLIN_HOME is full: the step is parked until space returns."""


class StepFailure(MerlinError):
    """One attempt of a step failed; the reason is recorded on the attempt."""


class AgentError(StepFailure):
    """The agent loop ended without finishing: turn limit, model error, no scripted reply."""


class ModelUnreachable(AgentError):
    """A tier's model cannot be used at all (missing key, refused connection, bad login).

    Never retried as transient and never given a fix attempt: the step goes to the next
    tier, or fails naming the tier, the model and what is missing.
    """


class ModelRefused(AgentError):
    """The model declined the request, or its provider's filter stopped the reply.

    A reply was paid for (``completion``, an ``llm.Completion``) but holds nothing to act
    on. The message is the provider's reason when it gives one.
    """

    def __init__(self, reason: str, completion: object = None) -> None:
        """A refusal for ``reason``, in the reply ``completion``."""
        super().__init__(reason)
        self.completion = completion


class ToolSourceError(StepFailure):
    """An MCP server could not be started, or did not list its tools; the attempt fails."""


class ReplayDiverged(StepFailure):
    """A replay asked for a model call the original job never made."""


class PlanUnreadable(StepFailure):
    """A planner's answer holds no plan merlin can read (expected input: repair, fallback)."""


class TransitionRefused(MerlinError):
    """A status change was asked of a job, step or attempt in a state it does not apply to.

    Raised by ``merlin_flow.engine.lifecycle`` before anything is written: a race the
    caller lost, or a bug. The transaction it was raised in is rolled back.
    """


class BudgetExceeded(MerlinError):
    """The job's budget cannot pay for the next model call; the job stops."""


class LeaseLost(MerlinError):
    """Another worker holds the step's lease, so this task must stop."""


class JobCancelled(MerlinError):
    """The job ended (cancelled) while its step ran: the step stops at its next boundary."""
