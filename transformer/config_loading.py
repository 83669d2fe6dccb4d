"""Reading and writing settings: YAML files, ``section.key=value`` overrides, a checkpoint's dict, and one call's
decoding settings (`decode_with_overrides`).

A YAML file lists only what differs from the defaults of `transformer.config`, and overrides on
the command line replace what the file says. Unknown keys and values of the wrong type give a
one-line `ConfigError` naming the key; every value is cast to its field's declared type.
"""

from __future__ import annotations

import dataclasses
import decimal
import numbers
import os
import sys
import types
import typing
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import yaml

from transformer.atomic_file import atomic_write
from transformer.config import SECTIONS, Config, ConfigError, DecodeConfig, ensure

_LARGEST_FLOAT = decimal.Decimal(sys.float_info.max)  # an int written as a float beyond it (1e999) is refused


def _cast(key: str, value: Any, annotation: Any, where: str) -> Any:
    """Cast a YAML or command-line value to a field's declared type, or raise ConfigError."""
    allowed = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and type(None) in allowed):
        if type(None) in allowed:
            return None
        raise ConfigError(f"{where}: {key} must not be empty")
    target = next(t for t in allowed if t is not type(None))
    if target is str and isinstance(value, bool):  # YAML 1.1: no, yes, on, off unquoted (Norwegian is "no")
        raise ConfigError(f"{where}: {key} must be a string, got {value}: YAML reads an unquoted no, yes, on or off "
                          f"as a truth value; quote the value ({key.split('.')[-1]}: '{'yes' if value else 'no'}')")
    try:
        if target is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return value.lower() in ("true", "yes", "1", "on")
            raise ValueError
        if target is int:  # 1000, 1e3, 1_000 and 1000.0 alike, exactly; a fraction is refused, not rounded
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("+-").isdigit()):
                return int(value)
            number = decimal.Decimal(value.strip() if isinstance(value, str) else value)
            if not number.is_finite() or abs(number) > _LARGEST_FLOAT or number != number.to_integral_value():
                raise ValueError
            return int(number)
        if target is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if target is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if typing.get_origin(target) is list:  # a YAML list, or "a,b,c" on the command line
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise ValueError
            return [item.strip() for item in items if item.strip()]
    except (ValueError, TypeError, OverflowError, decimal.InvalidOperation):  # "x", a list or mapping, 1e999
        pass
    name = "a list of strings" if typing.get_origin(target) is list else f"of type {target.__name__}"
    raise ConfigError(f"{where}: {key} must be {name}, got {value!r}")


PATH_SETTINGS = ("train.run_dir", "train.init_from", "data.cache_dir")  # always a path of this machine


def build_config(values: dict[str, dict[str, Any]], where: str = "config") -> Config:
    """Build a Config from nested ``{section: {key: value}}`` overrides of the defaults."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of sections {sorted(SECTIONS)}, got {type(values).__name__}")
    sections = {}
    for section, cls in SECTIONS.items():
        given = values.get(section) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{where}: section '{section}' must be a mapping, got {given!r}")
        hints = typing.get_type_hints(cls)
        unset = {field.name for field in dataclasses.fields(cls) if field.default == ""}  # "": none (train.max_time)
        kwargs = {}
        for key, value in given.items():
            if key not in hints:
                raise ConfigError(f"{where}: unknown key '{section}.{key}'; valid keys of '{section}': "
                                  f"{', '.join(hints)}")
            # YAML's empty value (max_time: , ~, null) for a setting whose empty string means none
            kwargs[key] = "" if value is None and key in unset else _cast(f"{section}.{key}", value, hints[key], where)
        try:
            sections[section] = cls(**kwargs)
        except ConfigError as error:  # a value out of range: in which file (a model folder's config.yaml edited)
            raise ConfigError(f"{where}: {error}") from None
    unknown = set(values) - set(SECTIONS)
    if unknown:
        raise ConfigError(f"{where}: unknown section '{sorted(unknown)[0]}'; valid sections: {', '.join(SECTIONS)}")
    try:
        return Config(**sections)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_overrides(overrides: list[str]) -> dict[str, dict[str, str]]:
    """Turn ``["train.lr=5e-4", ...]`` into ``{"train": {"lr": "5e-4"}}``."""
    nested: dict[str, dict[str, str]] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"command line: override {item!r} must look like section.key=value")
        if section not in SECTIONS:
            raise ConfigError(f"command line: unknown section '{section}' in {item!r}; "
                              f"valid sections: {', '.join(SECTIONS)}")
        nested.setdefault(section, {})[name] = value
    return nested


def anchored_overrides(overrides: Sequence[str], where: str | Path) -> list[str]:
    """``overrides`` with their relative paths made absolute against ``where``, for scripts that run the
    toolkit from the checkout but are started elsewhere: `PATH_SETTINGS`, and a ``data.dataset`` that names
    an existing path there (else it may be a hub dataset's name). Other overrides are left as given."""
    anchored = []
    for item in overrides:
        key, sep, value = item.partition("=")
        path = Path(value).expanduser()
        local = key in PATH_SETTINGS or key == "data.dataset" and (Path(where) / path).exists()
        anchored.append(f"{key}={Path(where).resolve() / path}" if sep and value and local else item)
    return anchored


def apply_overrides(cfg: Config, overrides: Sequence[str], where: str = "command line",
                    sections: Sequence[str] = tuple(SECTIONS)) -> Config:
    """``cfg`` with ``section.key=value`` overrides, checked like a config file; only ``sections`` may change."""
    nested = parse_overrides(list(overrides))
    for section in nested:
        if section not in sections:
            raise ConfigError(f"{where}: only {', '.join(s + '.*' for s in sections)} settings can be given here, "
                              f"not {section}.{next(iter(nested[section]))}")
    if not nested:
        return cfg
    values = config_to_dict(cfg)
    for section, entries in nested.items():
        values[section].update(entries)
    return build_config(values, where)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key given twice in one mapping, where PyYAML keeps the last: a config with two
    ``train:`` sections lost the first one's settings without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # PyYAML's own error, below
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load defaults, then the YAML file at ``path``, then ``section.key=value`` overrides."""
    values: dict[str, dict[str, Any]] = {}
    where = "command line"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        except UnicodeDecodeError as error:
            line = error.object[: error.start].count(b"\n") + 1
            raise ConfigError(f"{path} line {line}: invalid UTF-8") from None
        try:
            values = yaml.load(text, Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark else ""
            problem = getattr(error, "problem", None) or "cannot parse"
            raise ConfigError(f"{path}{line}: invalid YAML ({problem})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of sections, got {type(values).__name__}")
    return _home_expanded(apply_overrides(build_config(values, where), overrides))


def _home_expanded(cfg: Config) -> Config:
    """``cfg`` with ``~`` in `PATH_SETTINGS` made the home directory, as a shell does for a path it sees: it leaves
    ``train.run_dir=~/runs`` as it is (no variable assignment), which would make a folder named ``~``. Configs read by
    `load_config` (a user's file and command line, and a release folder's config.yaml), not a checkpoint's."""
    sections = {}
    for setting in PATH_SETTINGS:
        section, key = setting.split(".")
        value = getattr(getattr(cfg, section), key)
        if value and value.startswith("~"):
            sections.setdefault(section, {})[key] = os.path.expanduser(value)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)
                                       for section, values in sections.items()})


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """Plain nested dict of a config (for YAML files and checkpoints)."""
    return dataclasses.asdict(cfg)


def config_from_dict(values: dict[str, dict[str, Any]], where: str = "checkpoint") -> Config:
    """Rebuild a config saved with `config_to_dict`."""
    return build_config(values, where)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, whole or not at all (a run's is read back by its next start)."""
    with atomic_write(Path(path)) as partial:
        partial.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")


def decode_with_overrides(decode: DecodeConfig, **overrides: object) -> DecodeConfig:
    """``decode`` with ``overrides`` of its fields, checked like a config file's: one call's settings (the API's
    keyword arguments, a request's fields), so never ``fast_paths``, which changed the model when it loaded (a load
    option: Translator.from_checkpoint's ``fast_paths=``, or decode.fast_paths=... where the model is loaded)."""
    names = [f.name for f in dataclasses.fields(decode)]
    unknown = sorted(set(overrides) - set(names))
    ensure(not unknown, f"unknown decoding setting {unknown[0]!r}; valid: {', '.join(names)}" if unknown else "")
    ensure("fast_paths" not in overrides, "decode.fast_paths is chosen when the model loads, not per call: "
                                          "give fast_paths= to Translator.from_checkpoint or from_pretrained")
    kinds = typing.get_type_hints(DecodeConfig)
    # cast and checked here: beam_size="3" would be a TypeError deep in the search, sampling="no" true; numpy's
    # numbers are numbers
    return dataclasses.replace(decode, **{name: _number(f"decode.{name}", value, kinds[name])
                                          for name, value in overrides.items()})


def _number(name: str, value: object, kind: type) -> bool | int | float:
    """``value`` as a setting of type ``kind`` (bool, int or float), numpy's scalars included, or a ConfigError:
    a string, a fraction for an int or a number for a bool is no such setting."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")  # no bool subclass
    is_bool = isinstance(value, bool) or numpy_bool
    number = numbers.Integral if kind is int else numbers.Real
    fits = is_bool if kind is bool else not is_bool and isinstance(value, number)
    ensure(fits, f"{name} must be {'an' if kind is int else 'a'} {kind.__name__}, got {value!r}")
    return kind(value)
