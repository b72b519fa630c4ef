"""YAML that cannot surprise: `load_yaml` is yaml.safe_load that refuses a key given twice in one
mapping, documents nested more than YAML_DEPTH_LIMIT levels deep, and documents that anchors and
aliases expand beyond YAML_VALUES_LIMIT values; `read_yaml_text` reads a file the user named only
when it is a regular file of at most YAML_BYTES_LIMIT bytes. Configs, `base:` files, grid files and
`--set` / `--tune` values are all read through them (config/__init__.py, sweep.py, tuning.py)."""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# A config is nested 2-3 levels deep (model: {n_embd: 128}), a grid file 4-5 (grid: {axis: [{...}]}).
# PyYAML composes nodes recursively, and deep copies, merges and dumps walk the result recursively
# too, each level a few Python frames: 20,000 `[` are a RecursionError and thousands of lines of
# traceback. Fifty levels is ten times what any config needs and far from the interpreter's limit.
YAML_DEPTH_LIMIT = 50

# A real config is a few kilobytes, a grid file tens of them. Without a limit `--config /dev/zero`
# reads until memory runs out, and a gigabyte of YAML takes minutes to parse before it fails.
YAML_BYTES_LIMIT = 1_000_000


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second

    def message(self, where: str) -> str:
        lines = f"lines {self.first} and {self.second}" if self.first != self.second else f"line {self.first}"
        return f"{where}: duplicate key {self.key!r} ({lines}) — keep one of them"


class _TooDeep(Exception):
    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


def _too_deep(where: str, line: int | None = None) -> ConfigError:
    at = f" line {line}" if line is not None else ""
    return ConfigError(f"{where}{at}: the YAML is nested more than {YAML_DEPTH_LIMIT} levels deep — "
                       "flatten it (a config needs three or four levels)")


@functools.cache
def _unique_key_loader() -> type:
    """A SafeLoader that refuses a key given twice in one mapping, at any depth, and stops composing
    a node more than YAML_DEPTH_LIMIT levels down. PyYAML keeps the last of two keys silently, so a
    second `train:` block would replace the first one whole; and it composes nested nodes by
    recursion, so depth is counted here, before the interpreter's own limit is reached."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent, index):
            if self._depth >= YAML_DEPTH_LIMIT and not self.check_event(yaml.ScalarEvent, yaml.AliasEvent):
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

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


def _beyond_limits(data: Any, values: int, depth: int) -> str | None:
    """"values" when `data` holds more than `values` values, each shared (aliased) mapping or list
    counted every time it is reached, as a walk over the document would; "depth" when it nests more
    than `depth` levels (aliases of aliases nest without the composer's recursion); else None. The
    walk keeps its own stack and stops at either limit; a document that refers to itself (an
    anchor holding its own alias) expands without end, so it is "values" too."""
    count = 0
    stack = [iter((data,))]
    inside: list[int] = []  # the ids of the containers being walked, outermost first
    while stack:
        for value in stack[-1]:
            count += 1
            if count > values:
                return "values"
            if isinstance(value, (dict, list, tuple, set)):
                if id(value) in inside:
                    return "values"
                if len(stack) > depth:
                    return "depth"
                count += len(value) if isinstance(value, dict) else 0  # the keys
                stack.append(iter(value.values() if isinstance(value, dict) else value))
                inside.append(id(value))
                break
        else:
            stack.pop()
            if inside and len(inside) >= len(stack):
                inside.pop()
    return None


def load_yaml(text: str, where: str) -> Any:
    """yaml.safe_load that refuses duplicate keys, documents nested more than YAML_DEPTH_LIMIT
    levels, and documents that expand through anchors and aliases to more than YAML_VALUES_LIMIT
    values; `where` (a file name, `--set x`) starts the message."""
    import yaml

    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as exc:
        raise ConfigError(exc.message(where)) from None
    except _TooDeep as exc:
        raise _too_deep(where, exc.line) from None
    except RecursionError:  # a key built from aliases of aliases is constructed by recursion
        raise _too_deep(where) from None
    problem = _beyond_limits(data, YAML_VALUES_LIMIT, YAML_DEPTH_LIMIT)
    if problem == "depth":
        raise _too_deep(where)
    if problem == "values":
        raise ConfigError(f"{where}: the YAML expands to more than {YAML_VALUES_LIMIT:,} values through anchors "
                          "and aliases — write the values out, or use fewer aliases")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_yaml_text(path: str | Path, what: str) -> str:
    """The text of the YAML file `path` (`what`: "config file", "grid file" ... names it in the
    messages). Refused before anything is read: a path that is not a regular file (a folder, a
    named pipe, /dev/zero, /dev/urandom: reading them blocks or never ends) and a file over
    YAML_BYTES_LIMIT bytes. At most the limit and one byte are read, so a file that grows, or one
    whose size the system does not report (/proc), is refused too."""
    path = Path(path)
    limit = YAML_BYTES_LIMIT
    try:
        info = os.stat(path)  # stat, not open: opening a named pipe waits for a writer
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist — check the path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc} — check the path") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is {_kind(info.st_mode)}, not a regular file — give a YAML file")
    too_big = ConfigError(f"{what} {path} is larger than {limit:,} bytes, the most tiedlm reads as YAML — "
                          "check the path (a config is a few kilobytes)")
    if info.st_size > limit:
        raise too_big
    try:
        # O_NONBLOCK: were the path swapped for a named pipe since the stat, opening it returns at once
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} {path} is not a regular file — give a YAML file")
            raw = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc} — check the path") from None
    if len(raw) > limit:
        raise too_big
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}) "
                          "— save it as UTF-8") from None
