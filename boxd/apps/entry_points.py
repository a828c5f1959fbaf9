"""The entry points of one group, read from the installed distributions as importlib.metadata
reads them, without importing it.

importlib.metadata brings email, zipfile, csv and pathlib with it, memory that every broker that
runs a tool would carry for reading a few small text files (docs/performance.md, "What a process's
imports cost"). What is read is what `importlib.metadata.entry_points(group=...)` finds for a
distribution installed by pip: the `*.dist-info` and `*.egg-info` directories in the directories of
`sys.path`, in `sys.path`'s order, and of distributions of the same (normalized) name only the
first. Two differences: a directory's children are taken in the order of their names rather than as
the file system lists them, and what importlib.metadata would also find inside a zip file on
`sys.path` or in a legacy `.egg` directory is not looked for (pip installs neither). A line that is
not `name = value` is passed over, where importlib.metadata raises and no app at all could be found.
"""

import os
import re
import sys
from collections.abc import Iterator
from functools import reduce
from importlib import import_module
from typing import NamedTuple

# importlib.metadata's own pattern for an entry point's value: `module[:attr[.attr]] [extras]`.
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
_METADATA = (".dist-info", ".egg-info")


class EntryPoint(NamedTuple):
    name: str
    value: str

    def load(self) -> object:
        """What the entry point names: its module imported, then its attributes in turn."""
        match = _VALUE.match(self.value)
        if match is None:
            raise ImportError(f"The entry point {self.name!r} names no module: {self.value!r}.")
        module = import_module(match["module"])
        return reduce(getattr, filter(None, (match["attr"] or "").split(".")), module)


def entry_points(group: str) -> list[EntryPoint]:
    points: list[EntryPoint] = []
    seen: set[str] = set()
    for info in _metadata_directories():
        name = _normalized(os.path.basename(info))
        if name in seen:
            continue
        seen.add(name)
        points.extend(_read(os.path.join(info, "entry_points.txt"), group))
    return points


def _metadata_directories() -> Iterator[str]:
    for root in sys.path:
        try:
            children = sorted(os.listdir(root or "."))
        except OSError:
            continue
        for child in children:
            if child.lower().endswith(_METADATA):
                yield os.path.join(root, child)


def _normalized(child: str) -> str:
    # As importlib.metadata names a distribution by its directory: `Foo.Bar-1.0.dist-info` is
    # `foo_bar`.
    name = child.lower().rpartition(".")[0].partition("-")[0]
    return re.sub(r"[-_.]+", "_", name)


def _read(path: str, group: str) -> Iterator[EntryPoint]:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError):
        return
    section = None
    for line in filter(None, map(str.strip, text.splitlines())):
        if line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        name, equals, value = line.partition("=")
        if section == group and equals:
            yield EntryPoint(name.strip(), value.strip())
