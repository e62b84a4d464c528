"""Opening the rocksdb engine's DB and the options of its column families: small memtables and
no block compression (``_open_db``), level 0 (``_level0``), flushes and compactions paced by
RocksDB's rate limiter (``_pace_writes``), the payload families (``_payload_options``), blob
files and, in ``copies``, their garbage collection (``_copies_options``, ``_collect_copies``).
Each setting's comment or docstring has the runs behind it (engines/rocksdb.py says how the
engine works as a whole, docs/engines.md §3 why; engines/rocksdb_keys.py has the keys).
"""

from __future__ import annotations

import errno

from rocksdict import (
    BlockBasedOptions,
    BottommostLevelCompaction,
    CompactOptions,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
)

from bookkeeper_aio.direct_io import supports_direct_io

from .rocksdb_keys import BATCHES_CF, COPIES_CF, INFOS_CF, SINGLES_CF

BLOB_BYTES_MIN = 256  # with blob files: records this long or longer go to them (header: 24)
# Memtables per family (the active one and those waiting for their flush). RocksDB slows writes
# down once MEMTABLES_MAX - 1 wait, and the bookie stops reading requests at _IMMUTABLE_PAUSE
# (write_pressure): the requests read before that lands have two memtables of room.
_MEMTABLES_MAX = 6
_IMMUTABLE_PAUSE = 3
_L0_FILES_COMPACTED = 16  # level-0 SSTs that start a compaction (_level0)
_L0_FILES_SLOWDOWN = 40
_L0_FILES_STOP = 64
_RATE_REFILL_US = 2000  # the rate limiter's period: a burst is 2 ms of the rate (_pace_writes)
_BLOB_GC_AGE_CUTOFF = 0.25  # COPIES_CF: RocksDB's default, the oldest quarter's payloads move


def _open_db(
    directory: str, memtable_bytes: int, direct_io: bool, blob_files: bool, write_rate: int
) -> Rdict:
    opts = Options(raw_mode=True)  # bytes keys in bytewise order; no pickling
    opts.create_if_missing(True)
    # Small memtables (RocksDB's default is 64 MiB): each flush writes and fsyncs its SST while
    # the journal fdatasyncs on the same disk, and a 64 MiB flush stalled journal syncs for
    # 20-50 ms (open-loop p99 ~110 ms at 30k adds/s; with 8 MiB ~40-50 ms, throughput the same).
    # Several of them, so a slow flush does not stop writes: RocksDB's slowdown sleeps in the
    # writing thread, the bookie's event loop. Before it, the bookie stops reading requests
    # (write_pressure). With 4 (until 2026-11-27) a bookie filled with 256 KiB entries on a
    # busy disk slowed down for seconds: its clients' requests timed out, its lease lapsed.
    opts.set_write_buffer_size(memtable_bytes)
    opts.set_max_write_buffer_number(_MEMTABLES_MAX)
    # No block compression (RocksDB's default is Snappy): entries are the client's bytes,
    # which a client that wants it compresses itself (Pulsar compresses its batches), and
    # Snappy on incompressible entries cost ~0.4 µs per 1 KiB entry for nothing (benchmarks
    # writes with distinct random payloads: 47.7k -> 49.5k entries/s, 3 alternated runs).
    opts.set_compression_type(DBCompressionType.none())
    # Flushes and compactions write their SSTs with O_DIRECT: new page-cache pages cost ~1.8 µs
    # of kernel time per KiB on the benchmarks' VM (bookkeeper_aio/direct_io.py), and these
    # writes are never read back through the page cache soon (recent entries are in the
    # memtables). `benchmarks writes`: each bookie 8.1 -> 6.0-6.5 µs per entry.
    if direct_io and supports_direct_io(directory):
        opts.set_use_direct_io_for_flush_and_compaction(True)
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())  # the default; we rely on it
    _level0(opts)
    if write_rate > 0:
        _pace_writes(opts, write_rate)
    if blob_files:
        # Entry records of BLOB_BYTES_MIN or more go to blob files at flush; SSTs keep keys and
        # blob references. With many ledgers written at once every flushed SST spans them all,
        # so compactions never stop, and they now rewrite ~30 bytes per entry instead of the
        # entry: 100 ledgers 21-23k -> 28-29k entries/s, the compaction thread 16 -> 5 % of a
        # core. One ledger loses 4-8 % (its SSTs are only moved, never compacted; writing
        # blob files costs the flush more). No blob GC: it rewrote live payloads at every
        # compaction (the gain fell to 3 %); a blob file goes once all its entries are deleted.
        opts.set_enable_blob_files(True)
        opts.set_min_blob_size(BLOB_BYTES_MIN)
    # A Bloom filter: a point lookup of an absent entry key skips the data blocks (which may
    # hold a neighbour's megabytes).
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    # Ledger infos and batch keys in column families of their own (INFOS_CF, BATCHES_CF).
    opts.create_missing_column_families(True)
    infos = Options(raw_mode=True)
    infos.set_write_buffer_size(1 << 20)  # infos are a few dozen bytes each
    batches = Options(raw_mode=True)
    batches.set_write_buffer_size(1 << 20)  # 25 bytes per batch
    singles = _payload_options(memtable_bytes)
    singles.set_block_based_table_factory(table)  # the Bloom filter: absent entry keys
    families = {
        INFOS_CF: infos,
        BATCHES_CF: batches,
        COPIES_CF: _copies_options(memtable_bytes),
        SINGLES_CF: singles,
    }
    try:
        return Rdict(directory, opts, column_families=families)
    except Exception as e:  # rocksdict raises a bare Exception("IO error: ... lock ...")
        if "lock" in str(e).lower():
            raise OSError(
                errno.EBUSY, f"ledger dir {directory} is in use by another process ({e})"
            ) from e
        raise


def _collect_copies(copies: Rdict, live_ratio_min: float) -> None:
    """When less than ``live_ratio_min`` of COPIES_CF's blob bytes is live, compact all of it
    with every blob file open to garbage collection: the live payloads move to new blob files
    and the old ones go (BookKeeper's major compaction of entry logs, over the whole family:
    RocksDB gives no figures per blob file). A blob file holds the copies of the few ledgers
    copied at the same time, so those of a deleted ledger wait here for the others' deletion,
    or for the oldest quarter's collection when later copies compact."""
    total = copies.property_int_value("rocksdb.total-blob-file-size") or 0
    garbage = copies.property_int_value("rocksdb.live-blob-file-garbage-size") or 0
    if not total or (total - garbage) / total >= live_ratio_min:
        return
    options = CompactOptions()
    # The last level too: files already there are otherwise skipped, and so are their blobs.
    options.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    options.set_exclusive_manual_compaction(False)  # the copies' own compactions go on
    copies.set_options({"blob_garbage_collection_age_cutoff": "1.0"})
    try:
        copies.compact_range(None, None, options)
    finally:
        copies.set_options({"blob_garbage_collection_age_cutoff": str(_BLOB_GC_AGE_CUTOFF)})


def _level0(options: Options) -> None:
    """Let level 0 hold ``_L0_FILES_COMPACTED`` flushed SSTs before compacting them into level 1
    (RocksDB's default: 4). With many ledgers written at once every flushed SST spans all of
    them and so overlaps all of level 1: each level-0 compaction rewrites level 1 whole, and
    merging 16 flushes at a time instead of 4 rewrites it a quarter as often (one ledger's SSTs
    do not overlap and are only moved down either way). `benchmarks writes --ledgers 100`,
    alternated, 30 s: 6.8k / 6.0k -> 11.3k / 9.3k entries/s, the bookies' CPU 79 -> 63 µs per
    entry; 8 s: 8.8k / 9.5k -> 12.6k / 13.4k; one ledger unchanged (docs/engines.md). The
    slowdown and stop triggers move up with it (RocksDB's 20 and 36 would slow writes, by
    sleeping in the bookie's event loop, before a compaction of 16 could catch up)."""
    options.set_level_zero_file_num_compaction_trigger(_L0_FILES_COMPACTED)
    options.set_level_zero_slowdown_writes_trigger(_L0_FILES_SLOWDOWN)
    options.set_level_zero_stop_writes_trigger(_L0_FILES_STOP)


def _pace_writes(options: Options, rate: int) -> None:
    """Flushes and compactions write at most ``rate`` bytes a second, in bursts of what
    ``_RATE_REFILL_US`` holds (flushes first: RocksDB's rate limiter), so that the journal's
    fdatasyncs, on the same disk, do not wait behind them. On the benchmarks' VM an fdatasync
    waits for every write the disk holds: a flush written at full speed (8 MiB in 1 MiB
    writes) made a journal loop's records beside it wait 30-60 ms for their sync at p99 (a
    standalone script; 1 ms without), the same bytes spread at 64 MiB/s 3 ms. At 64 MiB/s,
    alternated: `benchmarks breakdown --rate 8000` p99 72-112 -> 16-85 ms, one ledger's peak
    `writes` +15 %, 100 ledgers' -7-12 % (their compactions share the limit; none with blob
    files). 32 MiB/s capped one ledger at 29k entries/s, the flushes' own rate. RocksDB's
    auto-tuned limiter adapts too slowly (+5 % per 100 refills): peak writes fell to 19k
    (docs/performance.md, "The engine's writes, paced").

    The burst matters as much as the rate: a flush's write is one burst (RocksDB cuts its
    writes to what the limiter grants), and the fdatasync after it waits for it. At 10,000
    adds/s (one ledger, `breakdown`, alternated, 2026-11-28) the slowest 1 % of adds spent
    18-27 ms in their fdatasync with 4 ms bursts (256 KiB), 11-12 ms with 2 ms, 7-12 ms with
    1 ms; the adds' p99 was 70-123, 43-50 and 30-46 ms. A higher rate undoes it (1 ms bursts
    at 96 and 128 MiB/s: p99 43-59 and 61-70 ms). Shorter periods lose rate under load: a
    flush alone wrote 51 MiB/s at 4 ms, 46 at 1 ms, 42 at 0.5; beside the bookies' busy loops
    one at 1 ms fell behind `writes --outstanding 1000`'s ~25 MB/s per bookie and paused the
    bookies' reads 18 times (3.2 s in all), our reading being that a refill that wakes late
    still adds one period's bytes. 2 ms paused them never (one ledger 5 s, 100 ledgers 5 and
    20 s); the bookies' CPU per entry +0-3 µs."""
    options.set_ratelimiter(rate, _RATE_REFILL_US, 10)  # 10: RocksDB's default fairness


def _payload_options(memtable_bytes: int) -> Options:
    """A family of entry payloads: the entries' family's memtables and level 0, no
    compression (``_open_db``)."""
    options = Options(raw_mode=True)
    options.set_write_buffer_size(memtable_bytes)
    options.set_max_write_buffer_number(_MEMTABLES_MAX)
    options.set_compression_type(DBCompressionType.none())
    _level0(options)
    return options


def _copies_options(memtable_bytes: int) -> Options:
    """COPIES_CF's options: payloads in blob files, with blob garbage collection
    (docs/engines.md, "Why copies have a column family of their own")."""
    copies = _payload_options(memtable_bytes)
    copies.set_enable_blob_files(True)
    copies.set_min_blob_size(BLOB_BYTES_MIN)
    copies.set_enable_blob_gc(True)
    copies.set_blob_gc_age_cutoff(_BLOB_GC_AGE_CUTOFF)
    copies.set_blob_gc_force_threshold(0.5)  # ... and compacted for once half of it is garbage
    return copies
