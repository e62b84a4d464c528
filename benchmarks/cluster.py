"""The cluster a client benchmark runs against: its own etcd + bookie processes on 127.0.0.1
(stopped whatever happens: errors, Ctrl-C), or an existing one given by ``--metadata URI``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import BookieProcess, Cluster, wait_registered


class ClusterStartError(RuntimeError):
    """The local cluster did not come up (the message carries the failing process's log)."""


@dataclass
class Target:
    """Where a benchmark sends its load, and a scratch dir on the same disk."""

    uri: str
    scratch: Path
    bookies: list[BookieProcess] = field(default_factory=list)  # empty with --metadata


@contextlib.asynccontextmanager
async def local_cluster(
    root: Path,
    bookies: int,
    engine: str = "rocksdb",
    *extra: str,
    per_bookie: Callable[[int], list[str]] | None = None,
) -> AsyncIterator[Cluster]:
    """etcd (one member) + ``bookies`` bookie processes, registered and writable;
    ``per_bookie(i)``: more flags for bookie ``i`` (its own HTTP port, say).

    Raises:
        ClusterStartError: a process did not start, or bookies did not register.
    """
    cluster = Cluster(root, bookies, engine, *extra)
    if per_bookie is not None:
        for i, bookie in enumerate(cluster.bookies):
            bookie.extra += per_bookie(i)
    try:
        try:
            cluster.etcd.start()
            async with open_metadata_store(cluster.uri) as store:
                await store.init_cluster()
            for bookie in cluster.bookies:
                bookie.start()
            await wait_registered(cluster.uri, bookies)
        except (RuntimeError, TimeoutError) as exc:
            raise ClusterStartError(f"the local cluster did not start: {exc}") from exc
        yield cluster
    finally:
        cluster.stop()


@contextlib.asynccontextmanager
async def target(
    metadata: str | None, directory: str | None, bookies: int, engine: str, *extra: str
) -> AsyncIterator[Target]:
    """``metadata`` if given, else a local cluster in a temporary dir under ``directory``."""
    with tempfile.TemporaryDirectory(dir=directory, prefix="bench-") as tmp:
        scratch = Path(tmp)
        if metadata:
            yield Target(metadata, scratch)
            return
        async with local_cluster(scratch / "cluster", bookies, engine, *extra) as cluster:
            yield Target(cluster.uri, scratch, cluster.bookies)


def mode_target(args: argparse.Namespace) -> AbstractAsyncContextManager[Target]:
    """:func:`target` for a client mode's arguments: ``--metadata``, or its own cluster of
    ``--bookies`` (default: the ensemble size) ``--engine`` bookies with ``--bookie-set``."""
    extra = [arg for item in args.bookie_set for arg in ("--set", item)]
    bookies = args.bookies or args.ensemble
    return target(args.metadata, args.dir, bookies, args.engine, *extra)
