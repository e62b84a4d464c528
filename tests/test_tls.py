"""TLS on bookie connections with a CA made here: a client that trusts it writes and reads,
one that does not (or speaks plain TCP) is refused with a clear error; mutual TLS refuses a
client without a certificate (docs/operations.md)."""

from __future__ import annotations

import pytest

from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.digest import entry_digest, master_key
from bookkeeper_aio.errors import BookieUnavailableError, ConfigError, StatusCode
from bookkeeper_aio.net import client_network
from bookkeeper_aio.protocol import AddRequest, ReadRequest
from bookkeeper_aio.sandbox import BookieProcess
from bookkeeper_aio.tls_certs import make_test_pki

pytestmark = pytest.mark.process
KEY = master_key(b"tls")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory):
    return make_test_pki(tmp_path_factory.mktemp("other-pki"))


def _tls_bookie(root, pki, *extra: str) -> BookieProcess:
    flags = ("--tls-cert", pki.server_cert_file, "--tls-key", pki.server_key_file, *extra)
    return BookieProcess(root, "memory", *flags).start()


async def _write_and_read(address: str, config: ClientConfig) -> None:
    client = await BookieClient.connect(client_network(config), address, config)
    try:
        payloads = [b"entry %d over TLS" % e for e in range(20)]
        for e, p in enumerate(payloads):
            r = await client.request(AddRequest, 3, e, 0, KEY, e - 1, p,
                                     entry_digest(3, e, e - 1, p))  # fmt: skip
            assert r.status == StatusCode.OK
        for e, p in enumerate(payloads):
            r = await client.request(ReadRequest, 3, e, 0, None, -1, 0)
            assert r.status == StatusCode.OK and r.payload == p
    finally:
        await client.close()


def _client(pki, *, cert: bool = False) -> ClientConfig:
    keys = {"tls_cert_file": pki.client_cert_file, "tls_key_file": pki.client_key_file}
    return ClientConfig(connect_timeout_s=5, tls_ca_file=pki.ca_file, **(keys if cert else {}))


async def test_a_client_with_the_ca_writes_and_reads_others_are_refused(tmp_path, pki, other_pki):
    bookie = _tls_bookie(tmp_path, pki)
    try:
        await _write_and_read(bookie.address, _client(pki))
        with pytest.raises(BookieUnavailableError, match="certificate verify failed"):
            await _write_and_read(bookie.address, _client(other_pki))  # trusts another CA
        with pytest.raises(BookieUnavailableError, match="requires TLS"):
            await _write_and_read(bookie.address, ClientConfig(connect_timeout_s=5))  # plain
    finally:
        assert bookie.stop() == 0


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path, pki, other_pki):
    bookie = _tls_bookie(tmp_path, pki, "--tls-client-ca", pki.ca_file)
    try:
        await _write_and_read(bookie.address, _client(pki, cert=True))
        with pytest.raises(BookieUnavailableError, match="requires client certificates"):
            await _write_and_read(bookie.address, _client(pki))  # no certificate
        stranger = ClientConfig(connect_timeout_s=5, tls_ca_file=pki.ca_file,
                                tls_cert_file=other_pki.client_cert_file,
                                tls_key_file=other_pki.client_key_file)  # fmt: skip
        with pytest.raises(BookieUnavailableError):
            await _write_and_read(bookie.address, stranger)  # signed by another CA
    finally:
        assert bookie.stop() == 0


def test_tls_settings_are_checked(tmp_path, pki):
    with pytest.raises(ConfigError, match="go together"):
        ClientConfig(tls_ca_file=pki.ca_file, tls_cert_file=pki.client_cert_file).validate()
    with pytest.raises(ConfigError, match="needs tls_ca_file"):
        ClientConfig(
            tls_cert_file=pki.client_cert_file, tls_key_file=pki.client_key_file
        ).validate()
    with pytest.raises(ConfigError, match="cannot load TLS CA file"):
        client_network(ClientConfig(tls_ca_file=str(tmp_path / "missing.pem")))
    bad = BookieProcess(tmp_path, "memory", "--tls-cert", str(tmp_path / "nope.pem"),
                        "--tls-key", str(tmp_path / "nope.key"))  # fmt: skip
    with pytest.raises(RuntimeError, match="cannot load TLS certificate"):
        bad.start(timeout_s=20)
