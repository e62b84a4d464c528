"""etcd over TLS with authentication: a real etcd with a CA made here and a root user; the
metadata store and a bookie process reach it through ``etcds://user:pass@host:port/root``;
wrong or missing credentials, an untrusted server and plaintext are refused."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote

import pytest

from bookkeeper_aio.config import MetadataConfig
from bookkeeper_aio.errors import ConfigError, MetadataUnavailableError
from bookkeeper_aio.etcd_server import EtcdServer
from bookkeeper_aio.metadata.store import open_metadata_store, parse_metadata_uri
from bookkeeper_aio.sandbox import BookieProcess, wait_registered
from bookkeeper_aio.tls_certs import make_test_pki

pytestmark = pytest.mark.process
PASSWORD = "s3cret/with:odd@chars"
FAST = MetadataConfig(call_timeout_s=2, attempt_timeout_s=1, retries_max=2)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_etcd(pki):
    server = EtcdServer(unsafe_no_fsync=True, tls_cert_file=pki.server_cert_file,
                        tls_key_file=pki.server_key_file, tls_ca_file=pki.ca_file,
                        root_password=PASSWORD)  # fmt: skip
    with server:
        yield server


def _root() -> str:
    return f"sec-{uuid.uuid4().hex[:8]}"


def test_the_uri_carries_credentials_and_tls_files():
    parsed = parse_metadata_uri(f"etcds://root:{quote(PASSWORD, safe='')}@127.0.0.1:1/x"
                                "?tls_ca_file=/ca.pem")  # fmt: skip
    assert parsed.tls and (parsed.username, parsed.password) == ("root", PASSWORD)
    assert parsed.tls_files == (("tls_ca_file", "/ca.pem"),)
    for bad in ("etcd://127.0.0.1:1/x?tls_ca_file=/ca.pem", "etcds://127.0.0.1:1/x?ca=/ca.pem",
                "etcds://root@127.0.0.1:1/x"):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            parse_metadata_uri(bad)
        assert PASSWORD not in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_metadata_uri(f"etcdx://root:{PASSWORD}@127.0.0.1:1/x")
    assert PASSWORD not in str(info.value) and "***" in str(info.value)


async def test_tls_and_authentication_let_the_store_in(secure_etcd, pki):
    uri = secure_etcd.uri(_root())
    assert uri.startswith("etcds://root:")
    config = MetadataConfig(tls_ca_file=pki.ca_file)
    async with open_metadata_store(uri, config) as store:
        instance = await store.init_cluster()
        await store.put("probe", b"through TLS")
        assert (await store.get("probe")).value == b"through TLS"
    # The same through the URI alone (what processes and the shell are given).
    async with open_metadata_store(f"{uri}?tls_ca_file={pki.ca_file}") as store:
        assert await store.get_instance_id() == instance


async def test_bad_credentials_untrusted_servers_and_plaintext_are_refused(secure_etcd, pki):
    root = _root()
    good = secure_etcd.uri(root)
    endpoint = secure_etcd.endpoints[0]
    tls = MetadataConfig(tls_ca_file=pki.ca_file, call_timeout_s=2, attempt_timeout_s=1,
                         retries_max=2)  # fmt: skip
    cases = [
        (f"etcds://root:wrong@{endpoint}/{root}", tls, "authentication failed"),
        (f"etcds://{endpoint}/{root}", tls, "refused|user name is empty|permission denied"),
        (good, FAST, "unreachable"),  # the system's CAs do not know ours
        (good.replace("etcds://", "etcd://"), FAST, "unreachable"),  # plaintext to TLS
    ]
    for uri, config, message in cases:
        with pytest.raises(MetadataUnavailableError, match=message):
            async with open_metadata_store(uri, config) as store:
                await store.get_instance_id()


async def test_a_bookie_registers_through_tls_and_authentication(secure_etcd, pki, tmp_path):
    uri = f"{secure_etcd.uri(_root())}?tls_ca_file={pki.ca_file}"
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
    bookie = BookieProcess(tmp_path, "memory", "--metadata", uri, "--set", "lease_ttl_s=3")
    try:
        bookie.start()
        await wait_registered(uri, 1)
    finally:
        assert bookie.stop() == 0


async def test_etcd_requiring_client_certificates(pki, tmp_path):
    server = EtcdServer(tmp_path / "etcd", unsafe_no_fsync=True,
                        tls_cert_file=pki.server_cert_file, tls_key_file=pki.server_key_file,
                        tls_ca_file=pki.ca_file, client_cert_auth=True,
                        client_cert_file=pki.client_cert_file,
                        client_key_file=pki.client_key_file)  # fmt: skip
    with server:
        uri = server.uri("mtls")
        with_cert = MetadataConfig(tls_ca_file=pki.ca_file, tls_cert_file=pki.client_cert_file,
                                   tls_key_file=pki.client_key_file)  # fmt: skip
        async with open_metadata_store(uri, with_cert) as store:
            await store.init_cluster()
        without = MetadataConfig(tls_ca_file=pki.ca_file, call_timeout_s=2,
                                 attempt_timeout_s=1, retries_max=2)  # fmt: skip
        with pytest.raises(MetadataUnavailableError):
            async with open_metadata_store(uri, without) as store:
                await store.get_instance_id()


async def test_an_expired_auth_token_is_renewed(pki, tmp_path):
    server = EtcdServer(tmp_path / "etcd", unsafe_no_fsync=True, root_password=PASSWORD,
                        auth_token_ttl_s=1)  # fmt: skip
    with server:
        async with open_metadata_store(server.uri("ttl")) as store:
            await store.put("k", b"1")
            # Let etcd forget the token: what a quiet client meets after 5 minutes.
            deadline = asyncio.get_running_loop().time() + 30
            while store.statistics().get("reauthentications", 0) == 0:
                assert asyncio.get_running_loop().time() < deadline, "the token never expired"
                await asyncio.sleep(2)  # longer than the TTL: no use renews the token
                assert (await store.get("k")).value == b"1"
