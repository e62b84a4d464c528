"""Spark jobs' records in the metadata store, and the commit and abort decisions: pure code.

Theory of operation
-------------------
A Spark job writing to a log (docs/spark.md) keeps two kinds of keys::

    spark/jobs/<job id>                                        JobRecord
    spark/attempts/<job id>/<stage>.<partition>/<task attempt>  AttemptRecord

A task attempt creates its attempt record (CREATING) before it creates a ledger, records the
ledger (WRITING) before writing to it, and marks the record DONE once the ledger is closed. The
driver's commit seals the job (OPEN -> SEALED: no attempt may join), lists the attempts, takes
the attempts Spark accepted, one per partition (:func:`plan_commit`), records the ledgers it
will append (COMMITTING), tombstones every other attempt (ABORTED) and deletes its ledgers,
appends the winners' ledgers to the log in one compare-and-swap, then deletes the records.
Abort tombstones every attempt and deletes every ledger. Records change only by compare-and-
swap, so a task and a committer racing over one attempt are ordered: either the task recorded
its ledger first (the committer deletes it), or the tombstone came first (the task's next
compare-and-swap fails and it deletes the ledger itself). An attempt found CREATING may have
created a ledger it never recorded (its task died in between): the sweep then looks for the
job's tag on ledgers (``tag_scan``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import IncorrectParameterError, MetadataFormatError, SparkJobError

FORMAT_VERSION = 1
JOBS_PREFIX = "spark/jobs/"
ATTEMPTS_PREFIX = "spark/attempts/"
# Custom metadata on every ledger a task attempt creates: what the sweeper looks for.
TAG_JOB, TAG_PARTITION, TAG_ATTEMPT, TAG_LOG = (
    "spark-job",
    "spark-partition",
    "spark-attempt",
    "spark-log",
)
BATCH_PROPERTY_PREFIX = "spark-batch/"  # + query id: a stream's last committed batch id
_JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_QUERY_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class JobState(enum.Enum):
    OPEN = "OPEN"  # tasks may add attempts
    SEALED = "SEALED"  # no attempt may join; the driver is choosing (nothing appended yet)
    COMMITTING = "COMMITTING"  # the driver chose its ledgers (JobRecord.ledgers)
    ABORTING = "ABORTING"  # everything the job wrote is being deleted


class AttemptState(enum.Enum):
    CREATING = "CREATING"  # may have created a ledger not recorded yet
    WRITING = "WRITING"  # writing its recorded ledgers
    DONE = "DONE"  # every ledger closed, rows counted: a candidate for the commit
    ABORTED = "ABORTED"  # tombstone: its ledgers are (being) deleted, it may not move on


JOB_TRANSITIONS = frozenset(
    {
        (JobState.OPEN, JobState.SEALED),
        (JobState.SEALED, JobState.COMMITTING),
        (JobState.OPEN, JobState.ABORTING),
        (JobState.SEALED, JobState.ABORTING),
        (JobState.COMMITTING, JobState.ABORTING),  # the append failed for sure, or cleanup
    }
)
ATTEMPT_TRANSITIONS = frozenset(
    {
        (AttemptState.CREATING, AttemptState.WRITING),
        (AttemptState.CREATING, AttemptState.DONE),  # an empty partition: no ledger
        (AttemptState.WRITING, AttemptState.DONE),
        (AttemptState.CREATING, AttemptState.ABORTED),
        (AttemptState.WRITING, AttemptState.ABORTED),
        (AttemptState.DONE, AttemptState.ABORTED),  # a losing copy of a partition
    }
)


def _check_move(what: str, old: enum.Enum, new: enum.Enum, table: frozenset) -> None:
    if (old, new) not in table:
        raise SparkJobError(f"{what}: {old.value} -> {new.value} is not allowed")


def check_job_id(job_id: object) -> str:
    """Raises IncorrectParameterError unless ``job_id`` is 1-128 of ``[A-Za-z0-9_.-]``."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise IncorrectParameterError(f"job id {job_id!r}: 1-128 characters of [A-Za-z0-9_.-]")
    return job_id


def job_key(job_id: str) -> str:
    return JOBS_PREFIX + check_job_id(job_id)


def attempts_prefix(job_id: str) -> str:
    return f"{ATTEMPTS_PREFIX}{check_job_id(job_id)}/"


def attempt_key(job_id: str, stage: int, partition: int, task_attempt: int) -> str:
    """The key of one task attempt; keys sort by stage, then partition, then attempt."""
    for name, value in (("stage", stage), ("partition", partition), ("task", task_attempt)):
        if type(value) is not int or value < 0:
            raise IncorrectParameterError(f"{name} id {value!r} is not an int >= 0")
    return f"{attempts_prefix(job_id)}{stage:010d}.{partition:010d}/{task_attempt:020d}"


def batch_property(query_id: str) -> str:
    """The log property that holds a streaming query's last committed batch id."""
    if not isinstance(query_id, str) or not _QUERY_ID.fullmatch(query_id):
        raise IncorrectParameterError(f"query id {query_id!r}: 1-128 of [A-Za-z0-9_.:-]")
    return BATCH_PROPERTY_PREFIX + query_id


def _int(value: object, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise IncorrectParameterError(f"{what} {value!r} is not an int >= {low}")
    return value


class _JsonRecord:
    """Readable JSON for a frozen record with an enum ``state`` and a tuple of ``ledgers``
    (what ``etcdctl get`` shows)."""

    WHAT: ClassVar[str]
    STATES: ClassVar[type[enum.Enum]]

    def to_json_bytes(self) -> bytes:
        doc = dataclasses.asdict(self)  # type: ignore[call-overload]  # (a dataclass's mixin)
        doc.update(state=doc["state"].value, ledgers=list(doc["ledgers"]))
        doc["format_version"] = FORMAT_VERSION
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Any:
        """Raises MetadataFormatError: not such a record."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            version = doc.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise MetadataFormatError(f"{cls.WHAT}: unknown format version {version!r}")
            doc["state"] = cls.STATES(doc["state"])
            doc["ledgers"] = tuple(doc["ledgers"])
            return cls(**doc)
        except MetadataFormatError:
            raise
        except (KeyError, TypeError, ValueError, IncorrectParameterError) as exc:
            raise MetadataFormatError(f"invalid {cls.WHAT}: {exc}") from exc


@dataclass(frozen=True)
class JobRecord(_JsonRecord):
    """A job: which log it writes, how its ledgers are replicated, and where it stands.

    ``partitions`` is how many partitions a whole job has when the driver knows it;
    ``query``/``batch`` identify a micro-batch of a streaming query; ``ledgers`` are the
    ones a COMMITTING job appends, in order.
    """

    job_id: str
    log: str
    created_ms: int
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    state: JobState = JobState.OPEN
    partitions: int | None = None
    query: str | None = None
    batch: int | None = None
    ledgers: tuple[int, ...] = ()
    WHAT: ClassVar[str] = "job record"
    STATES: ClassVar[type[enum.Enum]] = JobState

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if not isinstance(self.log, str) or not self.log:
            raise IncorrectParameterError(f"job {self.job_id}: log name {self.log!r}")
        _int(self.created_ms, "created_ms")
        for value in (self.ensemble_size, self.write_quorum, self.ack_quorum):
            _int(value, "quorum size", 1)
        if not isinstance(self.state, JobState):
            raise IncorrectParameterError(f"unknown job state {self.state!r}")
        if self.partitions is not None:
            _int(self.partitions, "partitions")
        if (self.query is None) != (self.batch is None):
            raise IncorrectParameterError("a stream job has both a query and a batch id")
        if self.query is not None:
            batch_property(self.query)
            _int(self.batch, "batch id")
        for ledger_id in self.ledgers:
            _int(ledger_id, "ledger id")
        if self.ledgers and self.state in (JobState.OPEN, JobState.SEALED):
            raise IncorrectParameterError(f"a {self.state.value} job has chosen no ledgers yet")

    def sealed(self) -> JobRecord:
        """SEALED: tasks that record an attempt from now on find the job closed (once: the
        committer that seals a job is its only one)."""
        _check_move(f"job {self.job_id}", self.state, JobState.SEALED, JOB_TRANSITIONS)
        return dataclasses.replace(self, state=JobState.SEALED)

    def committing(self, ledgers: Sequence[int]) -> JobRecord:
        """COMMITTING with the ledgers it will append, in order."""
        _check_move(f"job {self.job_id}", self.state, JobState.COMMITTING, JOB_TRANSITIONS)
        return dataclasses.replace(self, state=JobState.COMMITTING, ledgers=tuple(ledgers))

    def aborting(self) -> JobRecord:
        if self.state is JobState.ABORTING:
            return self
        _check_move(f"job {self.job_id}", self.state, JobState.ABORTING, JOB_TRANSITIONS)
        return dataclasses.replace(self, state=JobState.ABORTING)

    def age_s(self, now_ms: int) -> float:
        return max(0, now_ms - self.created_ms) / 1000


@dataclass(frozen=True)
class AttemptRecord(_JsonRecord):
    """One task attempt: its place in the job, its ledgers, and (DONE) what it wrote."""

    stage: int
    partition: int
    task_attempt: int  # Spark's task attempt id: unique within the application
    attempt_number: int  # 0 for a task's first attempt (for people reading it)
    created_ms: int
    state: AttemptState = AttemptState.CREATING
    ledgers: tuple[int, ...] = ()
    rows: int = 0
    bytes: int = 0
    WHAT: ClassVar[str] = "attempt record"
    STATES: ClassVar[type[enum.Enum]] = AttemptState

    def __post_init__(self) -> None:
        for name in ("stage", "partition", "task_attempt", "attempt_number", "created_ms"):
            _int(getattr(self, name), name)
        _int(self.rows, "rows")
        _int(self.bytes, "bytes")
        if not isinstance(self.state, AttemptState):
            raise IncorrectParameterError(f"unknown attempt state {self.state!r}")
        for ledger_id in self.ledgers:
            _int(ledger_id, "ledger id")
        if len(set(self.ledgers)) != len(self.ledgers):
            raise IncorrectParameterError(f"attempt lists a ledger twice: {self.ledgers}")

    @property
    def slot(self) -> tuple[int, int]:
        """(stage, partition): what the attempt is a copy of."""
        return self.stage, self.partition

    def _moved(self, state: AttemptState, **changes: Any) -> AttemptRecord:
        what = f"attempt {self.task_attempt} of partition {self.partition}"
        _check_move(what, self.state, state, ATTEMPT_TRANSITIONS)
        return dataclasses.replace(self, state=state, **changes)

    def writing(self, ledger_id: int) -> AttemptRecord:
        """WRITING, with one more ledger recorded (before anything is written to it)."""
        if self.state is AttemptState.WRITING:
            return dataclasses.replace(self, ledgers=(*self.ledgers, ledger_id))
        return self._moved(AttemptState.WRITING, ledgers=(*self.ledgers, ledger_id))

    def done(self, rows: int, size_bytes: int) -> AttemptRecord:
        return self._moved(AttemptState.DONE, rows=rows, bytes=size_bytes)

    def aborted(self) -> AttemptRecord:
        if self.state is AttemptState.ABORTED:
            return self
        return self._moved(AttemptState.ABORTED)


@dataclass(frozen=True)
class CommitPlan:
    """What a commit does: ``winners`` (attempt keys, in log order) whose ``append`` ledgers
    go to the log; ``losers`` are tombstoned and their ledgers deleted; ``tag_scan`` when a
    loser may hold a ledger it never recorded."""

    winners: tuple[str, ...]
    append: tuple[int, ...]
    losers: tuple[str, ...]
    tag_scan: bool
    rows: int
    bytes: int


def plan_commit(
    attempts: Mapping[str, AttemptRecord],
    winners: Sequence[str],
    partitions: int | None = None,
) -> CommitPlan:
    """The commit of the ``winners``: the attempts Spark accepted (the data source's commit
    messages; the adapter's accumulator), one per (stage, partition). Log order is key
    order: stage, then partition. Every other attempt is a loser — also one that finished
    (DONE) in a task that failed after it, or in a copy Spark killed.

    Raises:
        SparkJobError: a winner is unknown or not DONE, two winners copy one partition, or
            ``partitions`` is given and some partition has no winner.
    """
    picked = sorted(set(winners))
    for key in picked:
        if key not in attempts or attempts[key].state is not AttemptState.DONE:
            state = attempts[key].state.value if key in attempts else "missing"
            raise SparkJobError(f"the winning attempt {key} is {state}, not DONE")
    slots = [attempts[key].slot for key in picked]
    if len(set(slots)) != len(slots):
        raise SparkJobError(f"two winning attempts copy one partition: {picked}")
    if partitions is not None:
        stages = {record.stage for record in attempts.values()}
        _check_partitions([attempts[key] for key in picked], stages, partitions)
    chosen = set(picked)
    losers = tuple(key for key in sorted(attempts) if key not in chosen)
    return CommitPlan(
        winners=tuple(picked),
        append=tuple(ledger for key in picked for ledger in attempts[key].ledgers),
        losers=losers,
        tag_scan=any(attempts[k].state is AttemptState.CREATING for k in losers),
        rows=sum(attempts[key].rows for key in picked),
        bytes=sum(attempts[key].bytes for key in picked),
    )


def _check_partitions(records: Sequence[AttemptRecord], stages: set[int], partitions: int) -> None:
    """Every stage any attempt ran in has a winner for each of ``partitions``."""
    by_stage: dict[int, set[int]] = {stage: set() for stage in stages}
    for record in records:
        by_stage.setdefault(record.stage, set()).add(record.partition)
    complete = all(found == set(range(partitions)) for found in by_stage.values())
    if not complete or (partitions and not by_stage):
        found = {stage: sorted(parts) for stage, parts in by_stage.items()}
        raise SparkJobError(
            f"the job has {partitions} partitions but finished attempts cover only {found} "
            "(stage: partitions)"
        )


def plan_abort(attempts: Mapping[str, AttemptRecord]) -> CommitPlan:
    """Every attempt a loser: everything the job wrote is deleted."""
    losers = tuple(sorted(attempts))
    return CommitPlan(
        winners=(),
        append=(),
        losers=losers,
        tag_scan=any(attempts[k].state is AttemptState.CREATING for k in losers),
        rows=0,
        bytes=0,
    )


def committed_by_membership(
    ledgers: Sequence[int], in_log: set[int], existing: set[int]
) -> bool | None:
    """Whether a COMMITTING job's append landed, from where its ledgers are now.

    ``in_log``: the chosen ledgers the log lists (segments or trash); ``existing``: those
    whose metadata still exists. The append is one compare-and-swap, so either all of them
    went to the log or none did; a chosen ledger that no longer exists was deleted by the
    log's retention after it landed (nothing else deletes a COMMITTING job's chosen ledgers).
    True: it landed; False: it did not (the job can be rolled back); None: the records
    contradict that (left for a person).
    """
    chosen = set(ledgers)
    if not chosen:
        return True  # nothing to append: the commit only deletes records
    if chosen <= in_log | (chosen - existing):
        return True
    if not chosen & in_log and chosen <= existing:
        return False
    return None


def orphan_ledger(
    tags: Mapping[str, bytes],
    ctime_ms: int,
    now_ms: int,
    ttl_s: float,
    live_jobs: set[str],
    in_log: bool,
) -> bool:
    """Whether a ledger is a job's leftover that cleanup deletes: tagged by a job that has no
    record any more, not in its log, and older than the time-to-live."""
    job = tags.get(TAG_JOB)
    if job is None or in_log:
        return False
    return job.decode(errors="replace") not in live_jobs and (now_ms - ctime_ms) / 1000 > ttl_s


__all__ = [
    "ATTEMPTS_PREFIX",
    "JOBS_PREFIX",
    "AttemptRecord",
    "AttemptState",
    "CommitPlan",
    "JobRecord",
    "JobState",
    "attempt_key",
    "attempts_prefix",
    "batch_property",
    "check_job_id",
    "committed_by_membership",
    "job_key",
    "orphan_ledger",
    "plan_abort",
    "plan_commit",
]
