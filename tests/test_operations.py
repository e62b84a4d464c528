"""Operating it: /metrics scraped from a running bookie process and parsed with
prometheus_client's parser, the HTTP admin API, the client's metrics in the caller's registry
(docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import uuid

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.config import BookieConfig, ClientConfig
from bookkeeper_aio.digest import entry_digest, master_key
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.metadata.underreplication import Missing, mark_under_replicated
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    AddRequest,
    ListEntriesRequest,
    ReadRequest,
)
from bookkeeper_aio.sandbox import BookieProcess, free_port, wait_registered

KEY = master_key(b"ops")
CONFIG = ClientConfig(connect_timeout_s=5, request_timeout_s=20)


async def http(method: str, url: str, body: bytes | None = None) -> tuple[int, str, str]:
    """(status, content type, body text) of one request."""
    async with aiohttp.ClientSession() as session, session.request(method, url, data=body) as r:
        return r.status, r.content_type, await r.text()


async def wait_http(url: str, timeout_s: float = 30.0) -> None:
    """Wait until ``url`` answers at all (the admin API starts just after the bookie listens)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                await http("GET", url)
                return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)


def _digest(entry_id: int, payload: bytes) -> int:
    return entry_digest(7, entry_id, entry_id - 1, payload)


def metrics(text: str) -> dict[str, list]:
    """Family name -> samples, as prometheus_client's own parser reads the exposition."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


@pytest.mark.process
async def test_metrics_of_a_bookie_process_parse_and_count_its_work(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    bookie = BookieProcess(tmp_path, "rocksdb", "--http-listen", address).start()
    url = f"http://{address}/metrics"
    try:
        await wait_http(url)
        client = await BookieClient.connect(TcpNetwork(), bookie.address, CONFIG)
        try:
            payload = b"x" * 100
            adds = [
                client.request(AddRequest, 7, e, 0, KEY, e - 1, payload, _digest(e, payload))
                for e in range(50)
            ]
            await asyncio.gather(*adds)
            for e in range(10):
                await client.request(ReadRequest, 7, e, 0, None, -1, 0)
            # autorecovery's copies, ingested as a file once a listing syncs them
            copy = ADD_FLAG_RECOVERY | ADD_FLAG_DEFERRED_SYNC
            for e in range(5):
                digest = entry_digest(8, e, e - 1, payload)
                await client.request(AddRequest, 8, e, copy, KEY, e - 1, payload, digest)
            listed = await client.request(ListEntriesRequest, 8, 0, 100)
            assert listed.ranges == [[0, 4]]
        finally:
            await client.close()
        status, content_type, text = await http("GET", url)
    finally:
        assert bookie.stop() == 0
    assert status == 200 and content_type == "text/plain"
    m = metrics(text)
    assert (
        value(m["bookkeeper_bookie_entries_added"], "bookkeeper_bookie_entries_added_total") == 55
    )
    ingested = "bookkeeper_bookie_copy_files_ingested"
    assert value(m[ingested], ingested + "_total") == 1
    ingested = "bookkeeper_bookie_copy_bytes_ingested"
    assert value(m[ingested], ingested + "_total") > 5 * len(payload)
    add = m["bookkeeper_bookie_add_request_seconds"]
    # (the copies are answered before anything is durable: not timed there)
    assert value(add, "bookkeeper_bookie_add_request_seconds_count") == 50
    assert value(add, "bookkeeper_bookie_add_request_seconds_bucket", le="+Inf") == 50
    assert value(add, "bookkeeper_bookie_add_request_seconds_sum") > 0
    reads = m["bookkeeper_bookie_read_request_seconds"]
    assert value(reads, "bookkeeper_bookie_read_request_seconds_count") == 10
    batches = m["bookkeeper_bookie_journal_batch_records"]
    syncs = value(
        m["bookkeeper_bookie_journal_sync_seconds"], "bookkeeper_bookie_journal_sync_seconds_count"
    )
    assert syncs >= 1
    # Every add is a journal record (plus one for the ledger's master key), in some batch.
    assert value(batches, "bookkeeper_bookie_journal_batch_records_sum") >= 51
    assert value(m["bookkeeper_bookie_read_only"], "bookkeeper_bookie_read_only") == 0
    ledger_dir = str(tmp_path / "ledgers")
    free = value(
        m["bookkeeper_bookie_ledger_dir_free_bytes"],
        "bookkeeper_bookie_ledger_dir_free_bytes",
        dir=ledger_dir,
    )
    total = value(
        m["bookkeeper_bookie_ledger_dir_total_bytes"],
        "bookkeeper_bookie_ledger_dir_total_bytes",
        dir=ledger_dir,
    )
    assert 0 < free <= total
    assert value(m["bookkeeper_bookie_ledgers"], "bookkeeper_bookie_ledgers") == 2
    limit = BookieConfig().journal_queue_bytes_max
    name = "bookkeeper_bookie_journal_queue_bytes_max"
    assert value(m[name], name) == limit
    assert "process_cpu_seconds" in m  # the process's own metrics come along


def _config(tmp_path, **extra) -> BookieConfig:
    keys = {"http_listen": "127.0.0.1:0", **extra}
    return BookieConfig(
        listen=f"127.0.0.1:{free_port()}",
        journal_dir=str(tmp_path / "j"),
        ledger_dirs=(str(tmp_path / "l"),),
        engine="memory",
        **keys,
    )


async def test_admin_api_answers_json_and_json_errors(tmp_path):
    async with Bookie.serve(_config(tmp_path)) as bookie:
        base = f"http://{bookie.http_address}"
        status, _, text = await http("GET", base + "/heartbeat")
        assert (status, text) == (200, "OK")
        status, ctype, text = await http("GET", base + "/api/v1/bookie/info")
        info = json.loads(text)
        assert status == 200 and ctype == "application/json"
        assert {"free_bytes", "total_bytes", "read_only", "ledgers"} <= set(info)
        assert 0 < info["free_bytes"] <= info["total_bytes"]
        assert info["read_only"] is False and info["ledgers"] == 0
        status, _, text = await http("GET", base + "/api/v1/bookie/state")
        state = json.loads(text)
        assert status == 200 and state["running"] is True and state["read_only"] is False
        assert state["shutting_down"] is False and state["failed"] is None
        for method, path, body, expected in (
            ("GET", "/api/v1/bookie/info?verbose=1", None, 400),
            ("GET", "/no/such/path", None, 404),
            ("GET", "/api/v1/bookie/gc", None, 405),
            ("PUT", "/api/v1/bookie/gc", b"[1, 2]", 400),
            ("PUT", "/api/v1/bookie/gc", b"{not json", 400),
            ("PUT", "/api/v1/bookie/gc", b'{"unknown": true}', 400),
            ("PUT", "/api/v1/bookie/gc", b"x" * 100_000, 413),
        ):
            status, ctype, text = await http(method, base + path, body)
            assert (status, ctype) == (expected, "application/json"), (path, text)
            doc = json.loads(text)
            assert doc["status"] == expected and doc["error"], doc
        # Read-only shows in info, state and the metric.
        bookie.handler.read_only = True
        _, _, text = await http("GET", base + "/api/v1/bookie/info")
        assert json.loads(text)["read_only"] is True
        _, _, text = await http("GET", base + "/metrics")
        assert (
            value(metrics(text)["bookkeeper_bookie_read_only"], "bookkeeper_bookie_read_only") == 1
        )


async def test_admin_api_runs_garbage_collection_now(tmp_path):
    uri = f"memory://ops-{uuid.uuid4().hex[:8]}"
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
        async with Bookie.serve(_config(tmp_path, metadata_uri=uri, gc_interval_s=0)) as bookie:
            await wait_registered(uri, 1)
            async with BookKeeper.connect(uri, CONFIG) as bk:
                w = await bk.create_ledger(1, 1, 1, password=b"pw")
                for i in range(5):
                    await w.append(b"gc-%d" % i)
                await w.close()
                await bk.delete_ledger(w.ledger_id)
            url = f"http://{bookie.http_address}/api/v1/bookie/gc"
            status, ctype, text = await http("PUT", url)
            assert (status, ctype) == (200, "application/json"), text
            figures = json.loads(text)
            assert figures["ledgers_deleted"] == 1 and figures["delete_errors"] == 0, figures
            status, _, text = await http("PUT", url, b"{}")  # nothing left: an empty pass
            assert status == 200 and json.loads(text)["ledgers_deleted"] == 0
    async with Bookie.serve(_config(tmp_path / "plain")) as bookie:  # no metadata store
        status, _, text = await http("PUT", f"http://{bookie.http_address}/api/v1/bookie/gc")
        assert status == 501 and "metadata" in json.loads(text)["error"]


async def test_admin_api_listens_on_the_address_given_only(tmp_path):
    async with Bookie.serve(_config(tmp_path)) as bookie:
        port = int(bookie.http_address.rpartition(":")[2])
        status, _, _ = await http("GET", f"http://127.0.0.1:{port}/heartbeat")
        assert status == 200
        with socket.socket() as other:  # another loopback address of this machine
            other.settimeout(5)
            with pytest.raises(ConnectionRefusedError):
                other.connect(("127.0.0.2", port))
    with pytest.raises(aiohttp.ClientConnectionError):  # and it stops with the bookie
        await http("GET", f"http://127.0.0.1:{port}/heartbeat")


async def test_under_replicated_ledgers_are_listed_with_filters(tmp_path):
    uri = f"memory://ops-{uuid.uuid4().hex[:8]}"
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
        for ledger_id, bookie_id in ((11, "10.0.0.1:3181"), (12, "10.0.0.2:3181")):
            missing = Missing(bookie_id, ("lost",), 1_000)
            await mark_under_replicated(store, ledger_id, [missing], now_ms=1_000)
        async with Bookie.serve(_config(tmp_path, metadata_uri=uri)) as bookie:
            await wait_registered(uri, 1)
            base = f"http://{bookie.http_address}/api/v1/autorecovery/list_under_replicated_ledger"
            _, _, text = await http("GET", base)
            doc = json.loads(text)
            assert doc["count"] == 2
            assert [d["ledger_id"] for d in doc["under_replicated_ledgers"]] == [11, 12]
            first = doc["under_replicated_ledgers"][0]
            assert first["missing_replicas"] == [{"bookie": "10.0.0.1:3181", "entries": None}]
            _, _, text = await http("GET", base + "?missingreplica=10.0.0.2:3181")
            assert [d["ledger_id"] for d in json.loads(text)["under_replicated_ledgers"]] == [12]
            _, _, text = await http(
                "GET", base + "?excludingmissingreplica=10.0.0.2:3181&printmissingreplica=false"
            )
            only = json.loads(text)["under_replicated_ledgers"]
            assert [d["ledger_id"] for d in only] == [11] and "missing_replicas" not in only[0]
            status, _, text = await http("GET", base + "?printmissingreplica=maybe")
            assert status == 400 and "printmissingreplica" in json.loads(text)["error"]


async def test_client_metrics_go_to_the_callers_registry(tmp_path):
    uri = f"memory://ops-{uuid.uuid4().hex[:8]}"
    registry = CollectorRegistry()
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
        configs = [
            _config(tmp_path / f"b{i}", metadata_uri=uri, http_listen=None) for i in range(3)
        ]
        bookies = [Bookie(c) for c in configs]
        try:
            for b in bookies:
                await b.start()
            async with BookKeeper.connect(uri, CONFIG, metrics_registry=registry) as bk:
                w = await bk.create_ledger(2, 2, 2)
                for i in range(20):
                    await w.append(b"%d" % i)
                m = metrics(generate_latest(registry).decode())
                assert (
                    value(
                        m["bookkeeper_client_adds_completed"],
                        "bookkeeper_client_adds_completed_total",
                    )
                    == 20
                )
                # One add at a time: every add was timed.
                assert (
                    value(m["bookkeeper_client_add_seconds"], "bookkeeper_client_add_seconds_count")
                    == 20
                )
                assert (
                    value(m["bookkeeper_client_pending_adds"], "bookkeeper_client_pending_adds")
                    == 0
                )
                stats = bk.statistics()
                assert stats["adds_completed"] == 20 and stats["writers_open"] == 1
                assert 0 < stats["add_latency_s_p50"] <= stats["add_latency_s_p99"]
                first = w.metadata.ensembles[0][1][0]
                await next(b for b in bookies if b.config.bookie_id == first).stop()
                await w.append(b"after")  # the writer replaces the stopped bookie
                await w.close()
                m = metrics(generate_latest(registry).decode())
                assert (
                    value(
                        m["bookkeeper_client_ensemble_changes"],
                        "bookkeeper_client_ensemble_changes_total",
                    )
                    == 1
                )
                reader = await bk.open_ledger(w.ledger_id)  # closed: no recovery needed
                assert reader.last_add_confirmed == 20
            assert "bookkeeper_client_adds_completed" not in metrics(
                generate_latest(registry).decode()
            )  # unregistered with the client
        finally:
            for b in bookies:
                await b.stop()


async def test_the_dashboard_uses_metrics_that_exist(tmp_path):
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).parent.parent / "docs/grafana-dashboard.json").read_text()
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = set(re.findall(r"bookkeeper_(?:bookie|client|autorecovery)_[a-z_]+", exprs))
    uri = f"memory://ops-{uuid.uuid4().hex[:8]}"
    registry = CollectorRegistry()
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
        async with (
            Bookie.serve(_config(tmp_path, metadata_uri=uri)) as bookie,
            BookKeeper.connect(uri, CONFIG, metrics_registry=registry),
        ):
            _, _, text = await http("GET", f"http://{bookie.http_address}/metrics")
            exported = set()
            for source in (text, generate_latest(registry).decode()):
                for family in text_string_to_metric_families(source):
                    exported |= {s.name for s in family.samples} | {family.name}
                    if family.type == "counter":  # one with no sample yet (a label per reason)
                        exported.add(family.name + "_total")
    source = (Path(__file__).parent.parent / "bookkeeper_aio/metrics/autorecovery.py").read_text()
    for name in sorted(used):
        if name.startswith("bookkeeper_autorecovery_"):
            key = name.removeprefix("bookkeeper_autorecovery_").removesuffix("_total")
            assert f'"{key}' in source, name  # only an auditor exports some: check the source
        else:
            assert name in exported, name
