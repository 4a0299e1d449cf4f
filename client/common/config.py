"""Typed configuration with Kafka's property names: defaults, files, and `--set key=value`.

Pure apart from `load_file` (reads one file). A component declares its keys once as a tuple of
`ConfigKey`; `resolve` merges defaults < file < overrides, converts each value to its type, and
rejects unknown keys and bad values with a message that names the key and what is allowed.
Files are Java-style `.properties` (`key=value`, `#` comments) or TOML (nested tables are joined
with dots, so `[log] segment.bytes = 1` and `"log.segment.bytes" = 1` are the same key).
"""

from __future__ import annotations

import pathlib
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid."""


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


_PARSERS: dict[type, Callable[[str], Any]] = {
    int: lambda raw: int(raw.strip()),
    float: lambda raw: float(raw.strip()),
    bool: _parse_bool,
    str: lambda raw: raw,
}


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One setting. `check` returns an error message for a bad (typed) value, or None."""

    name: str
    type: type
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None

    def convert(self, raw: Any) -> Any:
        if isinstance(raw, self.type) and not (self.type is int and isinstance(raw, bool)):
            value = raw
        else:
            try:
                value = _PARSERS[self.type](str(raw))
            except ValueError as err:
                raise ConfigError(
                    f"invalid value {raw!r} for {self.name}: {err} ({self.type.__name__})"
                ) from None
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(f"invalid value {raw!r} for {self.name}: {problem}")
        return value


def at_least(minimum: int | float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= minimum else f"must be >= {minimum}"


def between(low: int | float, high: int | float) -> Callable[[Any], str | None]:
    """Kafka's ConfigDef.Range.between: low <= value <= high."""
    return lambda v: None if low <= v <= high else f"must be in [{low}, {high}]"


def one_of(*allowed: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in allowed else f"must be one of {', '.join(allowed)}"


def load_file(path: str | pathlib.Path) -> dict[str, str]:
    """Read a .properties or .toml file into flat `{key: raw value}`."""
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {p}: {err.strerror}") from None
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{p}: {err}") from None
        return {k: config_str(v) for k, v in _flatten(data)}
    values: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        sep = min((i for i in (stripped.find("="), stripped.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise ConfigError(f"{p}:{lineno}: expected key=value, got {stripped!r}")
        values[stripped[:sep].strip()] = stripped[sep + 1 :].strip()
    return values


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def config_str(value: Any) -> str:
    """A typed config value as Kafka writes it (booleans lowercase)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """`["a=1", "b.c=x"]` -> `{"a": "1", "b.c": "x"}`; a pair without `=` is an error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def resolve(
    keys: Iterable[ConfigKey],
    *layers: Mapping[str, Any],
    ignore_unknown: bool = False,
) -> dict[str, Any]:
    """Defaults, then each layer in order; unknown keys raise unless `ignore_unknown`."""
    by_name = {k.name: k for k in keys}
    result = {name: key.default for name, key in by_name.items()}
    for layer in layers:
        for name, raw in layer.items():
            key = by_name.get(name)
            if key is None:
                if ignore_unknown:
                    continue
                raise ConfigError(f"unknown configuration {name!r}")
            result[name] = key.convert(raw)
    return result


def describe(keys: Iterable[ConfigKey]) -> str:
    """One line per key for --help texts: `name (type, default X): doc`."""
    return "\n".join(
        f"  {k.name} ({k.type.__name__}, default {k.default!r}): {k.doc}" for k in keys
    )


def command_line_layers(
    args: Any, flag_keys: Iterable[tuple[str, str]]
) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """A process command's three config layers, lowest first: the `--config` file, the named
    flags (`(attribute, property)` pairs; unset flags are skipped), and the `--set` overrides."""
    file_values = load_file(args.config) if args.config else {}
    flags = {key: getattr(args, attr) for attr, key in flag_keys if getattr(args, attr) is not None}
    return file_values, flags, parse_overrides(args.set)


def parse_problem(parse: Callable[[str], object], value: str) -> str | None:
    """A ConfigKey check from a parser: the parser's ValueError as the problem, else None."""
    try:
        parse(value)
    except ValueError as err:
        return str(err)
    return None
