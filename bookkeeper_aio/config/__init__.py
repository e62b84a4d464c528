"""Every limit and timeout in one place, with units in the names.

Theory of operation
-------------------
Configuration objects are frozen dataclasses. Each field has a default, a type, and (where it
matters) a range checked by :meth:`_Config.validate`. Files are TOML whose keys are exactly the
field names; an unknown key, a wrong type or an out-of-range value raises
:class:`~bookkeeper_aio.errors.ConfigError` naming the key, so a typo never silently falls back
to a default.

The objects, one per kind of process, each in the module of its own: ``base.py`` (what they
share), ``bookie.py`` (``BookieConfig``, ``AutorecoveryConfig`` and the autorecovery keys both
read), ``client.py`` (``ClientConfig``, ``MetadataConfig``), ``services.py`` (``KafkaConfig``,
``SparkConfig``). Import them from here (and ``ConfigError``, which they raise).
"""

from ..errors import ConfigError
from .base import GiB, KiB, MiB, check_tls_files, parse_address, set_options
from .bookie import AutorecoveryConfig, AutorecoverySettings, BookieConfig
from .client import ClientConfig, MetadataConfig
from .services import KafkaConfig, SparkConfig

__all__ = [
    "AutorecoveryConfig",
    "AutorecoverySettings",
    "BookieConfig",
    "ClientConfig",
    "ConfigError",
    "GiB",
    "KafkaConfig",
    "KiB",
    "MetadataConfig",
    "MiB",
    "SparkConfig",
    "check_tls_files",
    "parse_address",
    "set_options",
]
