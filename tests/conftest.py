"""Shared fixtures: one real etcd server for the whole session."""

from __future__ import annotations

import uuid

import pytest

from bookkeeper_aio.etcd_server import EtcdServer


@pytest.fixture(scope="session")
def etcd():
    """A real etcd on 127.0.0.1 (no fsync: test data only), stopped after the session."""
    with EtcdServer(unsafe_no_fsync=True) as server:
        yield server


@pytest.fixture
def etcd_uri(etcd):
    """A metadata URI with a root no other test uses."""
    return etcd.uri(f"test-{uuid.uuid4().hex[:12]}")
