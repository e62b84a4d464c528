"""Ledger metadata, bookie registry and cookies in a compare-and-swap store (docs/metadata.md)."""

from .model import LedgerMetadata, LedgerState, Versioned
from .registration import BookieInfo, BookieRegistration
from .store import MetadataStore, open_metadata_store, parse_metadata_uri, update_ledger

__all__ = [
    "BookieInfo",
    "BookieRegistration",
    "LedgerMetadata",
    "LedgerState",
    "MetadataStore",
    "Versioned",
    "open_metadata_store",
    "parse_metadata_uri",
    "update_ledger",
]
