"""TLS contexts for bookie connections: the server's (optionally requiring client
certificates: mutual TLS) and the client's (verifying the bookie against a CA).

Theory of operation
-------------------
TLS sits in the network seam (``net.TcpNetwork`` takes the contexts), so nothing above it
changes: frames, limits and backpressure are the same over TLS. A client verifies the
bookie's certificate against ``tls_ca_file`` and checks that it names the host of the bookie's
address (an IP address needs an IP subject alternative name). A bookie started with
``--tls-client-ca`` refuses every client that presents no certificate signed by that CA.

A plain client talking to a TLS bookie sends a frame the bookie's TLS layer cannot parse: the
bookie closes the connection, and the client's error says that TLS may be what is missing
(``client/bookie_client.py``).
"""

from __future__ import annotations

import ssl

from .errors import ConfigError

# A TLS session of a well-behaved client is set up in milliseconds; one that is not (a plain
# client, a stalled peer) holds a connection slot for at most this long.
HANDSHAKE_TIMEOUT_S = 10.0


def server_context(
    cert_file: str, key_file: str, client_ca_file: str | None = None
) -> ssl.SSLContext:
    """The bookie's context: its certificate chain and key; with ``client_ca_file``, clients
    must present a certificate that CA signed.

    Raises:
        ConfigError: a file cannot be read or does not hold what it should.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_file, key_file)
    if client_ca_file is not None:
        _load_ca(context, client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca_file: str, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client's context: trusts ``ca_file`` only and checks host names; with ``cert_file``
    and ``key_file`` it presents that certificate (for a bookie that requires one).

    Raises:
        ConfigError: a file cannot be read or does not hold what it should.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, ca_file)
    if cert_file is not None:
        _load_chain(context, cert_file, key_file)
    return context


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str | None) -> None:
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load TLS certificate {cert_file}, key {key_file}: {exc}"
        ) from exc


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS CA file {ca_file}: {exc}") from exc
