"""Ledger metadata, bookie registry and cookies in a compare-and-swap store (docs/metadata.md)."""

from .model import LedgerMetadata, LedgerState, Versioned
from .store import BookieInfo, MetadataStore, open_metadata_store, update_ledger

__all__ = [
    "BookieInfo",
    "LedgerMetadata",
    "LedgerState",
    "MetadataStore",
    "Versioned",
    "open_metadata_store",
    "update_ledger",
]
