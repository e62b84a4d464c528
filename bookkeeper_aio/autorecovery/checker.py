"""The replicas check of one ledger: every fragment, which bookie lacks which entries.

Theory of operation
-------------------
For each closed fragment (fragments.py) and each bookie of its ensemble, the entries the
bookie must hold are compared with what it says it holds (LIST_ENTRIES, paged: BookKeeper's
GET_LIST_OF_ENTRIES_OF_LEDGER replicas check). The answer per bookie is one of:

* ``ok`` — it holds every entry;
* ``missing`` — it lacks some (or, NO_SUCH_LEDGER, all): a :class:`Missing` to mark;
* ``lost`` — autorecovery declared it lost (or it is being decommissioned): all of it, and
  it is replaced even in a fragment where it holds no entry (a short striped fragment), so
  that no ensemble names it any more;
* ``error`` — it answered LIST_ENTRIES with an error (a failed ledger dir): all of it;
* ``unreachable`` — not registered, or no answer: not marked here, because a bookie that is
  merely restarting must not be re-replicated; the auditor's lost-bookie delay decides that.

The last fragment of an open ledger is not checked (its end is the writer's). The same
function serves the auditor's periodic check, ``shell audit`` and ``shell ledger-check``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..client.context import ClientContext
from ..client.reads import request
from ..errors import StatusCode
from ..metadata.model import LedgerMetadata
from ..metadata.underreplication import Missing
from ..protocol import ListEntriesRequest, ListEntriesResponse
from . import fragments as fr

LIST_PAGE_ENTRIES = 100_000


@dataclass(frozen=True)
class Row:
    """One bookie of one fragment: what it must hold and what it lacks."""

    first: int
    last: int | None
    index: int
    bookie: str
    expected: int
    missing: fr.Ranges | None  # None: unknown (unreachable) or not checked (open fragment)
    status: str  # ok | missing | lost | error | unreachable | open


@dataclass(frozen=True)
class LedgerCheck:
    ledger_id: int
    rows: tuple[Row, ...]

    @property
    def complete(self) -> bool:
        """Every checked copy is there (unreachable bookies make it not complete either)."""
        return all(r.status in ("ok", "open") for r in self.rows)

    def missing(self, reason: str, now_ms: int) -> list[Missing]:
        """What to mark: per bookie, the entries it lacks (``all`` when lost or failing)."""
        by_bookie: dict[str, Missing] = {}
        for r in self.rows:
            if r.status == "missing" and r.missing:
                m = Missing(r.bookie, (reason,), now_ms, r.missing)
            elif r.status in ("lost", "error"):
                m = Missing(r.bookie, (r.status if r.status == "lost" else reason,), now_ms)
            else:
                continue
            old = by_bookie.get(r.bookie)
            by_bookie[r.bookie] = m if old is None else old.merged(m)
        return [by_bookie[b] for b in sorted(by_bookie)]


async def list_present(ctx: ClientContext, bookie: str, ledger_id: int) -> fr.Ranges | str:
    """The entries ``bookie`` holds for the ledger, or ``"error"`` / ``"unreachable"``."""
    ranges: list[tuple[int, int]] = []
    start = 0
    while True:
        answer = await request(ctx, bookie, ListEntriesRequest, ledger_id, start, LIST_PAGE_ENTRIES)
        if type(answer) is not ListEntriesResponse:
            return "unreachable"
        if answer.status == StatusCode.NO_SUCH_LEDGER:
            return ()
        if answer.status != StatusCode.OK:
            return "unreachable" if answer.status == StatusCode.TOO_MANY_REQUESTS else "error"
        ranges.extend((int(a), int(b)) for a, b in answer.ranges)
        if answer.next_entry_id < 0 or answer.next_entry_id <= start:
            return fr.normalize(ranges)
        start = answer.next_entry_id


async def check_ledger(
    ctx: ClientContext,
    md: LedgerMetadata,
    registered: Collection[str],
    gone: Collection[str] = (),
) -> LedgerCheck:
    """Check every closed fragment of ``md`` (see the module docstring). ``registered``: the
    live bookies; ``gone``: bookies declared lost or being decommissioned."""
    present: dict[str, fr.Ranges | str] = {}
    rows = []
    for f in fr.fragments(md):
        for index, bookie in enumerate(f.ensemble):
            if f.last is None:
                rows.append(Row(f.first, None, index, bookie, 0, None, "open"))
                continue
            runs = fr.normalize(
                fr.index_runs(index, f.first, f.last, md.ensemble_size, md.write_quorum)
            )
            rows.append(await _row(ctx, md, f, index, bookie, runs, registered, gone, present))
    return LedgerCheck(md.ledger_id, tuple(rows))


async def _row(
    ctx: ClientContext,
    md: LedgerMetadata,
    f: fr.Fragment,
    index: int,
    bookie: str,
    runs: fr.Ranges,
    registered: Collection[str],
    gone: Collection[str],
    present: dict[str, fr.Ranges | str],
) -> Row:
    expected = fr.count(runs)
    if bookie in gone:  # even without entries here: a lost bookie leaves every ensemble
        return Row(f.first, f.last, index, bookie, expected, runs, "lost")
    if not expected:
        return Row(f.first, f.last, index, bookie, 0, (), "ok")
    if bookie not in registered:
        return Row(f.first, f.last, index, bookie, expected, None, "unreachable")
    if bookie not in present:  # one listing per bookie and ledger, for all its fragments
        present[bookie] = await list_present(ctx, bookie, md.ledger_id)
    held = present[bookie]
    if isinstance(held, str):
        return Row(f.first, f.last, index, bookie, expected, runs if held == "error" else None,
                   held)  # fmt: skip
    missing = fr.subtract(runs, held)
    return Row(f.first, f.last, index, bookie, expected, missing, "missing" if missing else "ok")
