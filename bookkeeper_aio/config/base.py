"""What every configuration object shares: loading from TOML or a mapping with names and types
checked (:class:`_Config`), ranges, ``--set KEY=VALUE`` options, addresses and TLS file
combinations, and the units (bookkeeper_aio/config/__init__.py says how configuration works)."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from ..errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def parse_address(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets) into (host, port).

    Raises:
        ConfigError: not of that form, or the port is out of range.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def check_tls_files(
    owner: str, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> None:
    """A certificate needs its key (and the other way round); a client certificate is only
    sent over TLS, so it needs the CA that TLS verifies the server with.

    Raises:
        ConfigError: an incomplete combination.
    """
    if (cert_file is None) != (key_file is None):
        raise ConfigError(f"{owner}: tls_cert_file and tls_key_file go together")
    if cert_file is not None and ca_file is None:
        raise ConfigError(f"{owner}: tls_cert_file needs tls_ca_file (the server's CA)")


def set_options(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as config overrides: values in TOML syntax (``3``, ``true``,
    ``"x"``), anything else taken as a bare string.

    Raises:
        ConfigError: an item without ``=``.
    """
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key.strip()] = text
    return overrides


@dataclass(frozen=True)
class _Config:
    """Shared loading and validation of configuration dataclasses."""

    # Keys whose unit suffix would make them positive, but for which 0 means "at once".
    ZERO_ALLOWED: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "config") -> Self:
        """Build from a mapping of field names to values, checking names and types.

        Raises:
            ConfigError: an unknown key, a wrong type or an invalid value.
        """
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            valid = ", ".join(sorted(names))
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {valid}")
        converted = {k: _coerce(k, v, hints[k], source) for k, v in values.items()}
        config = cls(**converted)
        config.validate()
        return config

    @classmethod
    def from_file(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> Self:
        """Load a TOML file; ``overrides`` (e.g. command-line flags) win over the file.

        Raises:
            ConfigError: the file cannot be read or parsed, or a value is invalid.
        """
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        return cls.from_mapping({**values, **(overrides or {})}, source=str(path))

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed, validated."""
        config = dataclasses.replace(self, **changes)
        config.validate()
        return config

    def validate(self) -> None:
        """Check ranges; subclasses add their own rules. NaN and infinities are never valid
        (a comparison with NaN is always false, so ``value <= 0`` would let it through).

        Raises:
            ConfigError: a value is out of range.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
            positive = f.name.endswith(("_max", "_s", "_ms", "_bytes")) and not f.name.endswith(
                "_wait_ms"
            )
            if f.name in self.ZERO_ALLOWED and isinstance(value, int | float) and value < 0:
                raise ConfigError(f"{f.name} must be >= 0, got {value}")
            if f.name in self.ZERO_ALLOWED:
                continue
            if positive and isinstance(value, int | float) and value <= 0:
                raise ConfigError(f"{f.name} must be > 0, got {value}")


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check ``value`` against a field's type; accept ints for floats and lists for tuples."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: {key} must be a list of strings, got {value!r}")
        return tuple(value)
    if hint is float and type(value) is int:
        return float(value)
    if hint is bool and type(value) is str and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if type(value) is not hint:
        raise ConfigError(
            f"{source}: {key} must be {hint.__name__}, got {type(value).__name__} {value!r}"
        )
    return value
