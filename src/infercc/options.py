"""A build option, declared once: the `Option` record on its field, and what is made from it.

Every setting of a build is a field of `infercc.config.BuildConfig` (or of its tables
`OrtOptions` and `TrtOptions`) whose metadata holds one `Option`: the command-line flags that
set it (`Flag`: name, help, value type, metavar, bounds, earlier spellings), the types a TOML
or JSON value of its key may have and how such a value is read (paths made relative to a
manifest), how the field is written as data, the backend that alone reads it, whether only
validation reads it, where `optimize --help` lists it (`PANELS`), and the keyword arguments of
the Python API that set it (its field name, and older names kept as aliases).

From those declarations, and nowhere else, come:

- the keys of a TOML/JSON build table and their types (`key_table`, `read_table`), and the
  table a config writes (`to_data`);
- the Python API's keywords (`keyword_table`, `from_keywords`);
- the command line: `infercc.cli.common` makes each flag a Typer option, `from_flags` turns
  the parsed values into a config and `flag_keys` names the key each flag sets (for
  `optimize --config`, where flags given win over the replayed record);
- the rules "this option needs backend X" and "this option needs validation" (`given`).

A field whose Option has no flags is a table (`ort`, `tensorrt`): its own fields are options,
under keys `table.name`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from infercc.errors import InferccError

OPTION = "infercc.option"  # the key of a field's metadata that holds its Option

# Where `optimize --help` lists an option, in this order.
OUTPUT = "Output"
SHAPES = "Shapes"
VALIDATION = "Validation"
PRECISION = "Precision"
PASSES = "Passes"
BACKEND = "Target and backend"
TENSORRT = "TensorRT builder (with --backend tensorrt)"
REPORT = "Report and replay"
PANELS = (OUTPUT, SHAPES, VALIDATION, PRECISION, PASSES, BACKEND, TENSORRT, REPORT)

Convert = Callable[[Any], Any]
Reader = Callable[[Any, Path | None], Any]


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets a build option.

    `takes` is the type of the value it takes (str, int, float, Path), None for an on/off
    flag; `many`: repeatable, a list of values. `value` turns what the command line parsed
    into the field's value (None: as parsed); a flag is given when it is on or its value is not
    None or empty. `old` are earlier spellings: hidden in --help, still accepted."""

    name: str
    help: str
    takes: type | None = None
    many: bool = False
    metavar: str | None = None
    min: float | None = None
    max: float | None = None
    value: Convert | None = None
    old: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        """The command function's parameter (`--disable-pass` -> `disable_pass`)."""
        return param_name(self.name)

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.name, *self.old)


def param_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Option:
    """A build option's declaration (module docstring).

    `types`: what a TOML/JSON value may be (an int is a float where one is due); `read`: how
    such a value becomes the field's (None: as it is); `dump`: the field's value as data
    (None: tuples as lists). `backend`: the backend that alone reads it; `validation`: only
    validation reads it. `api`: the API keyword's value -> the field's; `aliases`: older
    keywords, each with its conversion (a conversion may answer None: not given); `merge`:
    how values given under several keywords combine (None: they must agree). `exclusive`:
    why two of `flags` cannot be given together."""

    flags: tuple[Flag, ...]
    types: tuple[type, ...] = (dict,)
    panel: str | None = None
    read: Reader | None = None
    dump: Convert | None = None
    backend: str | None = None
    validation: bool = False
    api: Convert | None = None
    aliases: tuple[tuple[str, Convert | None], ...] = ()
    merge: Callable[[Mapping[str, Any]], Any] | None = None
    exclusive: str = ""

    @property
    def flag(self) -> str:
        """The flag messages name."""
        return self.flags[0].name if self.flags else ""


def option(default: Any = MISSING, *flags: Flag, factory: Any = MISSING, **kw: Any) -> Any:
    """A dataclass field with its Option: `x: int = option(64, Flag("--x", ...), types=...)`;
    `factory` for a table (`option(factory=TrtOptions)`)."""
    meta = {OPTION: Option(flags=flags, **kw)}
    if factory is not MISSING:
        return dataclass_field(default_factory=factory, metadata=meta)
    return dataclass_field(default=default, metadata=meta)


@dataclass(frozen=True)
class Leaf:
    """One option where it sits: `key` (`alignment`, `tensorrt.workspace`), the field's name
    and class, its Option and its default."""

    key: str
    name: str
    owner: type
    option: Option
    default: Any

    @property
    def table(self) -> str:
        return self.key.rpartition(".")[0]


def _option_of(f: Any) -> Option:
    found = f.metadata.get(OPTION)
    if found is None:
        raise TypeError(f"field {f.name} has no Option: declare it with infercc.options.option")
    return found


def _table_class(f: Any) -> type:
    """The class of a table field (`option(factory=TrtOptions)`)."""
    return f.default_factory


def _default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def tables(cls: type) -> dict[str, type]:
    """The fields of `cls` that are tables -> their class."""
    return {f.name: _table_class(f) for f in fields(cls) if not _option_of(f).flags}


def leaves(cls: type, prefix: str = "") -> list[Leaf]:
    """Every option of `cls`, its tables' options in their place."""
    found: list[Leaf] = []
    for f in fields(cls):
        opt = _option_of(f)
        if opt.flags:
            found.append(Leaf(prefix + f.name, f.name, cls, opt, _default(f)))
        else:
            found += leaves(_table_class(f), f"{prefix}{f.name}.")
    return found


# --------------------------------------------------------------------------- data


def key_table(cls: type) -> dict[str, tuple[tuple[type, ...], Reader | None]]:
    """A build table's keys -> (the types a value may have, how it is read)."""
    out: dict[str, tuple[tuple[type, ...], Reader | None]] = {}
    for f in fields(cls):
        opt = _option_of(f)
        read = opt.read if opt.flags else _table_reader(f.name, _table_class(f))
        out[f.name] = (opt.types, read)
    return out


def _table_reader(name: str, cls: type) -> Reader:
    return lambda value, base: cls(**read_table(cls, value, f"{name}.", base))


def _of_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types) or (float in types and isinstance(value, int))


def read_table(cls: type, data: Any, prefix: str = "", base: Path | None = None) -> dict[str, Any]:
    """Keyword arguments of `cls` from a table: every key known and of its type, None meaning
    unset; InferccError naming the key otherwise."""
    if not isinstance(data, Mapping):
        raise InferccError(f"build {prefix.rstrip('.') or 'config'} must be a table", "fix it")
    keys = key_table(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in keys:
            raise InferccError(
                f"unknown build key {prefix}{key!r}", "known keys: " + ", ".join(sorted(keys))
            )
        if value is None:
            continue
        types, reader = keys[key]
        if not _of_type(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise InferccError(f"{prefix}{key} must be a {wanted}", f"fix {key} = ...")
        out[key] = reader(value, base) if reader is not None else value
    return out


def to_data(obj: Any) -> dict[str, Any]:
    """A config (or table) as JSON/TOML data, key by key as `read_table` reads it back."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        opt, value = _option_of(f), getattr(obj, f.name)
        if not opt.flags:
            out[f.name] = to_data(value)
        elif opt.dump is not None:
            out[f.name] = opt.dump(value)
        else:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


# --------------------------------------------------------------------------- the command line


def _is_given(raw: Any) -> bool:
    return raw is not None and raw is not False and not (isinstance(raw, (list, tuple)) and not raw)


def flag_keys(cls: type) -> dict[str, str]:
    """Each flag's parameter (old spellings too) -> the key it sets (`tensorrt.workspace`)."""
    return {
        param_name(spelling): leaf.key
        for leaf in leaves(cls)
        for flag in leaf.option.flags
        for spelling in flag.spellings
    }


def flags_by_name(cls: type) -> dict[str, Flag]:
    return {flag.name: flag for leaf in leaves(cls) for flag in leaf.option.flags}


def _flag_value(leaf: Leaf, values: Mapping[str, Any]) -> tuple[Flag, Any] | None:
    """The one flag of `leaf` given in `values` and its raw value; None when none is."""
    given: list[tuple[Flag, str, Any]] = []
    for flag in leaf.option.flags:
        spelled = [(s, values.get(param_name(s))) for s in flag.spellings]
        spelled = [(s, raw) for s, raw in spelled if _is_given(raw)]
        if len(spelled) > 1:
            raise InferccError(
                f"{spelled[0][0]} and {spelled[1][0]} are one flag given twice",
                f"give {flag.name} only ({', '.join(flag.old)}: its old spelling)",
            )
        given += [(flag, s, raw) for s, raw in spelled]
    if len(given) > 1:
        why = f": {leaf.option.exclusive}" if leaf.option.exclusive else ""
        raise InferccError(f"{given[0][1]} and {given[1][1]} exclude each other{why}", "pick one")
    return (given[0][0], given[0][2]) if given else None


def from_flags(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of `cls` from the command line's parsed values, by parameter name (flags
    absent or not given keep their field's default)."""
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        opt = _option_of(f)
        if not opt.flags:
            kwargs[f.name] = from_flags(_table_class(f), values)
            continue
        leaf = Leaf(f.name, f.name, cls, opt, _default(f))
        found = _flag_value(leaf, values)
        if found is not None:
            flag, raw = found
            kwargs[f.name] = flag.value(raw) if flag.value is not None else raw
    return cls(**kwargs)


# --------------------------------------------------------------------------- the Python API


def keyword_table(cls: type) -> dict[str, tuple[str, Convert | None]]:
    """The API's keywords -> (the field they set, the conversion of their value): each field's
    name, and its aliases."""
    out: dict[str, tuple[str, Convert | None]] = {}
    for f in fields(cls):
        opt = _option_of(f)
        convert = opt.api if opt.flags else _table_keyword(_table_class(f))
        out[f.name] = (f.name, convert)
        for alias, alias_convert in opt.aliases:
            out[alias] = (f.name, alias_convert)
    return out


def _table_keyword(cls: type) -> Convert:
    return lambda value: cls(**value) if isinstance(value, Mapping) else value


def keyword_defaults(cls: type) -> list[tuple[str, Any]]:
    """Each keyword with the default a signature shows (aliases and tables: None)."""
    table = keyword_table(cls)
    defaults = {f.name: _default(f) if _option_of(f).flags else None for f in fields(cls)}
    return [(kw, defaults[kw] if kw in defaults else None) for kw in table]


def from_keywords(cls: type, options: Mapping[str, Any]) -> Any:
    """An instance of `cls` from the API's keyword arguments (None: not given)."""
    table = keyword_table(cls)
    got: dict[str, dict[str, Any]] = {}
    for kw, value in options.items():
        if kw not in table:
            raise InferccError(
                f"unknown build option {kw!r}", "known options: " + ", ".join(sorted(table))
            )
        name, convert = table[kw]
        if value is not None and convert is not None:
            value = convert(value)
        if value is not None:
            got.setdefault(name, {})[kw] = value
    by_name = {f.name: _option_of(f) for f in fields(cls)}
    kwargs = {name: _combined(name, given, by_name[name]) for name, given in got.items()}
    return cls(**kwargs)


def _combined(name: str, given: Mapping[str, Any], opt: Option) -> Any:
    values = list(given.values())
    if len(values) == 1:
        return values[0]
    if opt.merge is not None:
        return opt.merge(given)
    if all(v == values[0] for v in values):
        return values[0]
    raise InferccError(
        f"{' and '.join(given)} both set {name}, to different values", "give one of them"
    )


# --------------------------------------------------------------------------- rules


def given(obj: Any, *, backend: str | None = None, validation: bool = False) -> Iterator[Leaf]:
    """The options of `obj` that differ from their default and that `backend` alone reads
    (or, with `validation`, that only validation reads)."""
    for leaf in leaves(type(obj)):
        opt = leaf.option
        if (backend is not None and opt.backend != backend) or (validation and not opt.validation):
            continue
        holder = getattr(obj, leaf.table) if leaf.table else obj
        if getattr(holder, leaf.name) != leaf.default:
            yield leaf
