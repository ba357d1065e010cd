"""Reading YAML/JSON spec files and checking their fields.

Small typed accessors so that every bad field gets the same kind of error:
the file, the field path, the value and what is allowed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError

_MISSING = object()
# Any integer of a spec file at most (a field may allow less, or more: a seed): 2^40 steps is
# past any run, and the wire carries int64, so a larger value stored would not read back.
MAX_INTEGER = 1 << 40


class SpecLoader(yaml.SafeLoader):
    """Safe YAML whose numbers are YAML 1.2's: PyYAML (YAML 1.1) reads 1e-5, without a dot,
    as a string, and that is how people and JSON write a norm_eps or an lr."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _refuse_repeated_keys(loader: SpecLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A key given twice is a mistake, not an override: PyYAML kept the last silently."""
    seen = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue  # a merge (<<: *defaults) is overridden by the keys beside it, as YAML means
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"found the key {key!r} twice in one mapping", key_node.start_mark
            )
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


SpecLoader.construct_mapping = _refuse_repeated_keys


def _json_refusing_repeated_keys(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise json.JSONDecodeError(f"found the key {key!r} twice in one object", "", 0)
        out[key] = value
    return out


def one_line_error(exc: Exception) -> str:
    """A YAML or JSON error as one line: what is wrong, and where (PyYAML's own message spans
    several lines and names no file)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem or exc.context}{where}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}" if exc.doc else exc.msg
    return str(exc).replace("\n", " ")


def load_mapping(path: str | Path, kind: str) -> dict:
    """Load a YAML or JSON file whose top level must be a mapping."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), "(file)", str(path), f"a readable {kind} file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SpecError(str(path), "(file)", str(path), f"a {kind} file in UTF-8 text") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_json_refusing_repeated_keys)
        else:
            data = yaml.load(text, Loader=SpecLoader)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError(str(path), "(file)", str(path), f"valid YAML or JSON ({one_line_error(exc)})") from None
    if data is None:
        raise SpecError(str(path), "(file)", "empty", f"a mapping of the {kind} file's fields")
    if not isinstance(data, dict):
        raise SpecError(str(path), "(top level)", type(data).__name__, f"a mapping of the {kind} file's fields")
    return data


class Fields:
    """Typed access to one mapping of a spec file, remembering the field path."""

    def __init__(self, data: Any, source: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise SpecError(source, prefix or "(top level)", data, "a mapping")
        self.data, self.source, self.prefix = data, source, prefix

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, value, allowed: str) -> SpecError:
        return SpecError(self.source, self.path(key), value, allowed)

    def get(self, key: str, default=_MISSING):
        if key not in self.data:
            if default is _MISSING:
                raise self.error(key, None, "a value is required")
            return default
        return self.data[key]

    def string(self, key: str, default=_MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.error(key, value, "a non-empty string")
        return value

    def name(self, key: str, value: str) -> str:
        """`value` (this mapping's `key`) as a name: at most 128 printable characters, since a
        name shows in tables and log lines, where a newline or an escape forges rows."""
        if len(value) > 128 or not value.isprintable():
            raise self.error(key, value, "a name of at most 128 printable characters")
        return value

    def integer(self, key: str, default=_MISSING, minimum: int = 1, maximum: int = MAX_INTEGER) -> int:
        value = self.get(key, default)
        ok = not isinstance(value, bool) and isinstance(value, int) and minimum <= value <= maximum
        if not ok:
            raise self.error(key, value, f"an integer >= {minimum} and <= {maximum}")
        return value

    def number(
        self, key: str, default=_MISSING, minimum: float = 0.0, exclusive: bool = True, maximum: float | None = None
    ) -> float:
        value = self.get(key, default)
        # An int of 400 digits is no float: math.isfinite would raise OverflowError on it.
        as_int = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 1e300
        ok = as_int or (isinstance(value, float) and math.isfinite(value))
        ok = ok and (value > minimum if exclusive else value >= minimum)
        ok = ok and (maximum is None or value <= maximum)
        if not ok:
            bound = f"> {minimum}" if exclusive else f">= {minimum}"
            if maximum is not None:
                bound += f" and <= {maximum}"
            raise self.error(key, value, f"a finite number {bound}")
        return float(value)

    def mapping(self, key: str, default=_MISSING) -> Fields:
        value = self.get(key, default)
        if not isinstance(value, dict):
            raise self.error(key, value, "a mapping")
        return Fields(value, self.source, self.path(key))

    def items(self, key: str, default=_MISSING) -> list:
        value = self.get(key, default)
        if not isinstance(value, list):
            raise self.error(key, value, "a list")
        return value

    def reject_unknown(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.error(str(key), self.data[key], f"a known field ({', '.join(sorted(allowed))})")
