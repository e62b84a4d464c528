"""The HTTP admin API of the bookie and the autorecovery process (aiohttp; endpoints modelled
on BookKeeper's; docs/operations.md lists them)."""
