"""The one way every DSL's typed ``TilingConfig`` is built from a plain mapping (a YAML entry of
``configs/tiling/*.yaml``, a JSON row, keyword overrides)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


class ConfigError(ValueError):
    """A tiling config that is wrong in itself, whatever the shape: an unknown key or a bad value. Not the same
    as a config that cannot serve one shape (registers, shared memory, cluster coverage: a plain ValueError,
    recorded ``unsupported``): a ConfigError is a mistake in the configuration that should stop a sweep.
    Subclasses ValueError, so callers that catch ValueError keep working."""


def no_overrides(config) -> bool:
    """True for None or an empty mapping: the caller asked for no tiling overrides, so an op may pick its own
    default (e.g. one that fits the shape) instead of the config class's field defaults."""
    return config is None or (isinstance(config, Mapping) and not config)


def config_from_mapping(cls, d):
    """``cls()`` for None, ``d`` itself for an instance of ``cls``, else ``cls(**d)`` with lists turned into
    tuples (configs are frozen and hashable). Raises TypeError for anything else (not a mapping), and
    ``ConfigError`` naming the valid keys for an unknown key, or carrying the dataclass's own message for a bad
    value (``__post_init__`` checks the values; its ValueError or TypeError becomes a ConfigError)."""
    if d is None:
        return cls()
    if isinstance(d, cls):
        return d
    if not isinstance(d, Mapping):
        raise TypeError(f"config must be None, a {cls.__name__} or a mapping, got {type(d).__name__}")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) for k in d if k not in valid)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} key(s) {unknown}; valid keys: {', '.join(valid)}")
    try:
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {cls.__name__} {dict(d)}: {e}") from e


class TilingConfigBase:
    """Mixin for every DSL's frozen ``@dataclass TilingConfig``: ``from_dict`` (via ``config_from_mapping``),
    ``to_dict`` (JSON-able: tuples become lists; round-trips through ``from_dict``) and ``fields``."""

    @classmethod
    def from_dict(cls, d):
        """Build a config from None (defaults), an instance (returned as is) or a mapping of field overrides
        (lists become tuples). ``ConfigError`` (a ValueError) for an unknown key (listing the valid keys) or a
        value that breaks a constraint (checked by the dataclass), TypeError for anything else."""
        return config_from_mapping(cls, d)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    def field_type_errors(self, optional: tuple[str, ...] = ()) -> list[str]:
        """Type errors of the fields: a ``bool`` field must hold a bool, every other field a positive int (a name in
        ``optional`` may also be None). One message per bad field, in declaration order."""
        errors = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in optional and v is None:
                continue
            if f.type in (bool, "bool"):
                if not isinstance(v, bool):
                    errors.append(f"{f.name} must be a bool, got {v!r}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
                errors.append(f"{f.name} must be a positive integer, got {v!r}")
        return errors

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """Names of the accepted keys, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))
