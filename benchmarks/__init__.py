"""Benchmarks: ``python -m benchmarks --help``. Results are ratios against baselines measured
in the same run (the disk's raw group-commit limit), never absolute pass/fail thresholds."""
