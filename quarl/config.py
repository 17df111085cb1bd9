"""Stage configs: dataclasses filled from YAML and ``--set a.b=c`` overrides, type-checked.

    cfg = load_config(RLConfig, "rl.yaml", ["optim.lr=1e-5", "lora.rank=32", "tags=[a,b]"])

The dataclass is the schema and its defaults are the papers' settings, so a
config file lists only what differs. Values are checked against the field types
(int, float, bool, str, Path, Enum, Literal, Optional/Union, list/tuple/dict of
those, nested dataclasses) with the lossless coercions people expect (``1`` for a
float, ``"1e-5"`` for a float — PyYAML reads that as a string — and ``0.10`` kept
as text for a str field given on the command line). Anything else raises
ConfigError naming the dotted key, the expected type and, for unknown keys, the
valid ones with a "did you mean". Validation that needs several fields belongs in
the dataclass's ``__post_init__``; a ValueError from there becomes a ConfigError.

Names from other tools. A root config may declare ``FOREIGN_NAMES`` (a ClassVar): knob names people bring from
TRL / verl / PEFT (``num_generations``, ``rollout.n``, ``learning_rate``, ``kl_coef`` ...) mapped to quarl's key
and a note of where the name comes from. An unknown key whose last part (or a key inside an unknown section, as in
``actor.optim.lr``) is such a name gets that key in its error -- "quarl calls it rollout.group_size (verl
actor_rollout_ref.rollout.n; TRL num_generations)" -- instead of a list of fields. They are hints only: quarl
accepts its own names, one per parameter.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

T = typing.TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that does not fit the config dataclass."""


class _Raw:
    """An override value: its text (used verbatim for str fields) and its YAML parse."""

    __slots__ = ("text", "value")

    def __init__(self, text: str):
        self.text = text
        self.value = yaml.safe_load(text) if text.strip() else None

    def __repr__(self) -> str:
        return repr(self.value)


def load_config(cls: type[T], path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> T:
    """Build ``cls`` from an optional YAML file, then ``key.sub=value`` overrides (YAML-parsed values)."""
    data: dict = {}
    if path is not None:
        data = read_yaml_mapping(path)
    return build_config(cls, data, overrides)


def build_config(cls: type[T], data: dict | None = None, overrides: typing.Iterable[str] = ()) -> T:
    """Build ``cls`` from a mapping (a parsed YAML document), then ``key.sub=value`` overrides.

    What ``load_config``, the pipeline runtime and the recipes all use: one path from
    dicts to a validated config, no temporary files."""
    import copy

    data = copy.deepcopy(data) if data else {}
    if not isinstance(data, dict):
        raise ConfigError(f"a {cls.__name__} must be built from a mapping of its fields, got {data!r}")
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        set_path(data, key.strip().split("."), _Raw(text))
    _check_foreign_names(cls, data)
    return _build(cls, data, "")


def _leaves(data: Any, path: list[str]) -> typing.Iterator[list[str]]:
    """The key path of every value under ``data`` (a mapping of sections and values; ``path`` itself for a value)."""
    if isinstance(data, _Raw):
        data = data.value
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from _leaves(v, [*path, str(k)])
    else:
        yield path


def _check_foreign_names(cls: type, data: dict) -> None:
    """ConfigError naming quarl's key when an unknown key (or a key inside an unknown section) ends in one of
    quarl's own dotted keys (``actor.optim.lr`` -> ``optim.lr``), is a field that only one section has
    (``warmup_ratio`` -> ``optim.warmup_ratio``), or is a name ``cls.FOREIGN_NAMES`` knows from another tool;
    silent otherwise (``_build`` reports the rest, with its "did you mean")."""
    names = getattr(cls, "FOREIGN_NAMES", None) or {}
    if not dataclasses.is_dataclass(cls):
        return

    def unknown(c: type, d: Any, path: list[str]) -> typing.Iterator[tuple[list[str], Any]]:
        if not isinstance(d, dict) or not dataclasses.is_dataclass(c):
            return
        fields = {f.name: f for f in dataclasses.fields(c) if f.init}
        hints = typing.get_type_hints(c)
        for k, v in d.items():
            if k not in fields:
                yield [*path, str(k)], v
            else:
                sub = hints[k]
                if dataclasses.is_dataclass(sub):
                    yield from unknown(sub, v.value if isinstance(v, _Raw) else v, [*path, str(k)])

    def valid(c: type, path: list[str]) -> typing.Iterator[str]:
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            if f.init:
                yield ".".join([*path, f.name])
                if dataclasses.is_dataclass(hints[f.name]):
                    yield from valid(hints[f.name], [*path, f.name])

    keys = set(valid(cls, []))
    for path, value in unknown(cls, data, []):
        for leaf in _leaves(value, path):
            # verl-style paths with quarl's own tail: actor_rollout_ref.rollout.temperature -> rollout.temperature
            tail = next((".".join(leaf[i:]) for i in range(1, len(leaf)) if ".".join(leaf[i:]) in keys), None)
            # a field named right in the wrong section, when only one section has it: warmup_ratio -> optim.warmup_ratio
            owners = [k for k in keys if k.rsplit(".", 1)[-1] == leaf[-1]]
            tail = tail or (owners[0] if len(owners) == 1 else None)
            if tail is not None:
                raise ConfigError(f"unknown config key {'.'.join(leaf)!r} for {cls.__name__}: did you mean {tail!r}?")
            hit = names.get(leaf[-1])
            if hit is not None:
                key, origin = hit
                raise ConfigError(f"unknown config key {'.'.join(leaf)!r} for {cls.__name__}: quarl calls it "
                                  f"{key!r} ({origin}); set {key}=...")


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file holding a mapping (or nothing) -> dict; ConfigError naming the file otherwise."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values, got {type(loaded).__name__}")
    return loaded or {}


def set_path(data: dict, keys: list[str], value: Any) -> None:
    """``data[k0][k1]... = value``, creating sections; ConfigError when a prefix is a value."""
    for i, k in enumerate(keys[:-1]):
        nxt = data.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {'.'.join(keys)}: {'.'.join(keys[: i + 1])} is a value, not a section")
        data = nxt
    data[keys[-1]] = value


def get_path(data: Any, keys: list[str]) -> tuple[bool, Any]:
    """``(True, data[k0][k1]...)`` or ``(False, None)`` when a key is missing."""
    for k in keys:
        if not isinstance(data, dict) or k not in data:
            return False, None
        data = data[k]
    return True, data


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _build(cls: type, data: Any, prefix: str) -> Any:
    if isinstance(data, cls):
        return data
    if isinstance(data, _Raw):
        data = data.value
    where = prefix or "the config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping for {cls.__name__}, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {_join(prefix, close[0])!r}? " if close else ""
            raise ConfigError(
                f"unknown config key {_join(prefix, key)!r} for {cls.__name__}; {hint}valid keys: {', '.join(fields)}"
            )
        kwargs[key] = _coerce(value, hints[key], _join(prefix, key))
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]  # fmt: skip
    if missing:
        raise ConfigError(f"missing required config key(s) {', '.join(_join(prefix, m) for m in missing)}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {prefix or 'config'} ({cls.__name__}): {e}") from None


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    raw = value if isinstance(value, _Raw) else None
    v = raw.value if raw else value
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def bad(extra: str = "") -> ConfigError:
        return ConfigError(f"config key {key!r}: expected {_type_name(tp)}, got {v!r} ({type(v).__name__}){extra}")

    if tp is Any:
        return v
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, key)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for a in options:
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(e)
        if len(options) == 1:  # Optional[X]: X's own error is the precise one (e.g. a nested key)
            raise errors[0]
        raise bad()
    if origin is Literal:
        for a in args:
            if (v == a and type(v) is type(a)) or (isinstance(a, str) and raw and raw.text.strip() == a):
                return a
        raise bad(f"; allowed: {', '.join(repr(a) for a in args)}")
    if tp is bool:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off"):
            return v.lower() in ("true", "yes", "on")
        raise bad()
    if tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str):
            try:
                f = float(v)  # "1e6" -> 1000000
                if f.is_integer():
                    return int(f)
            except ValueError:
                pass
        raise bad()
    if tp is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)  # PyYAML reads 1e-5 (no dot) as a string
            except ValueError:
                pass
        raise bad()
    if tp is str:
        if raw is not None and not isinstance(v, (str, list, dict)):
            return raw.text.strip()  # command line: keep "0.10", "007" or "true" exactly as typed
        if isinstance(v, str):
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        raise bad()
    if tp is Path:
        if isinstance(v, (str, Path)):
            return Path(v)
        raise bad()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for m in tp:
            if v == m.value or v == m.name or v is m:
                return m
        raise bad(f"; allowed: {', '.join(repr(m.value) for m in tp)}")
    if origin in (list, tuple, typing.Sequence, set, frozenset) or tp in (list, tuple):
        if isinstance(v, (str, bytes, dict)) or not isinstance(v, (list, tuple, set)):
            raise bad()
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(v):
                raise bad(f"; expected {len(args)} items")
            return tuple(_coerce(x, a, f"{key}[{i}]") for i, (x, a) in enumerate(zip(v, args)))
        item_tp = args[0] if args else Any
        items = [_coerce(x, item_tp, f"{key}[{i}]") for i, x in enumerate(v)]
        if origin is tuple or tp is tuple:
            return tuple(items)
        return origin(items) if origin in (set, frozenset) else items
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            raise bad()
        kt, vt = args if args else (Any, Any)
        return {_coerce(k, kt, key): _coerce(x, vt, _join(key, k)) for k, x in v.items()}
    if isinstance(tp, type):
        if isinstance(v, tp):
            return v
        raise bad()
    return v  # an annotation we do not model (e.g. a Callable): pass through unchecked


def config_to_dict(cfg: Any) -> Any:
    """A plain, YAML/JSON-safe structure: dataclasses -> dicts, tuples/sets -> lists, Path -> str, Enum -> value."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, dict):
        return {str(k) if isinstance(k, Path) else k: config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple, set, frozenset)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, Path):
        return str(cfg)
    if isinstance(cfg, enum.Enum):
        return cfg.value
    return cfg


def dump_config(cfg: Any, path: str | Path) -> Path:
    """Write ``cfg`` (dataclass or dict) as YAML that ``load_config`` reads back to an equal object."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False))
    return path
