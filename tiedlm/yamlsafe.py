"""YAML that cannot surprise: `load_yaml` is yaml.safe_load that refuses a key given twice in one
mapping and documents that anchors and aliases expand beyond YAML_VALUES_LIMIT values. Configs,
grid files and `--set` values are all read through it (config.py, sweep.py)."""

from __future__ import annotations

import functools
from typing import Any

from .errors import ConfigError


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second

    def message(self, where: str) -> str:
        lines = f"lines {self.first} and {self.second}" if self.first != self.second else f"line {self.first}"
        return f"{where}: duplicate key {self.key!r} ({lines}) — keep one of them"


@functools.cache
def _unique_key_loader() -> type:
    """A SafeLoader that refuses a key given twice in one mapping, at any depth. PyYAML keeps the
    last one silently, so a second `train:` block would replace the first one whole."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` is PyYAML's to resolve
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _DuplicateKey(key, first, line)
                seen[key] = line
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


# Anchors and aliases let a few hundred bytes of YAML stand for billions of values ("billion
# laughs": each level a list of ten aliases of the level below). PyYAML builds that as a few shared
# objects in milliseconds, but whatever walks it afterwards (deep copies, merging, flattening,
# hashing) visits every value, for minutes and gigabytes. A real config holds fewer than 200 values;
# a grid file a few hundred more. Counting stops at the limit, so a refusal takes milliseconds.
YAML_VALUES_LIMIT = 100_000


def _expands_beyond(data: Any, limit: int) -> bool:
    """Whether `data` holds more than `limit` values, each shared (aliased) mapping or list counted
    every time it is reached, as a walk over the document would. Stops as soon as the count passes
    the limit, so it also ends on a document that refers to itself."""
    count = 0
    stack = [iter((data,))]
    while stack:
        for value in stack[-1]:
            count += 1
            if count > limit:
                return True
            if isinstance(value, dict):
                count += len(value)  # the keys
                stack.append(iter(value.values()))
                break
            if isinstance(value, (list, tuple, set)):
                stack.append(iter(value))
                break
        else:
            stack.pop()
    return False


def load_yaml(text: str, where: str) -> Any:
    """yaml.safe_load that refuses duplicate keys and documents that expand through anchors and
    aliases to more than YAML_VALUES_LIMIT values; `where` (a file name, `--set x`) starts the message."""
    import yaml

    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as exc:
        raise ConfigError(exc.message(where)) from None
    if _expands_beyond(data, YAML_VALUES_LIMIT):
        raise ConfigError(f"{where}: the YAML expands to more than {YAML_VALUES_LIMIT:,} values through anchors "
                          "and aliases — write the values out, or use fewer aliases")
    return data
