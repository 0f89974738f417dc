"""Where a split's tar shards live: a local path or a URL with a brace range, as a data YAML names them.

    train: shards/train-{000000..000003}.tar                      # beside the YAML (confined to the data set's folder)
    train: s3://bucket/coco/train-{000000..000511}.tar            # S3 (s3fs), gs:// (gcsfs), https:// (fsspec)

The index written beside the shards (``train.index.json`` for ``train-{...}.tar`` or ``train-000003.tar``) is found
beside them; a pattern naming some of the index's shards is a split of those (``val: shards/train-000000.tar``). A URL
never carries credentials: user information, query strings and fragments are refused (the usual environment and
configuration files of each client supply them), so nothing secret reaches a log or an error line.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMES = ("s3", "gs", "gcs", "http", "https")
MAX_SHARDS = 1_000_000
BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


class ShardSpecError(ValueError):
    """A shard pattern that is refused; the message says why in one line and never repeats a secret."""


def is_shard_spec(value: object) -> bool:
    """Whether a split entry names tar shards (a URL of a known scheme, or a path ending in ``.tar``)."""
    if not isinstance(value, str):
        return False
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    return scheme in SCHEMES or value.endswith(".tar")


class ShardUrls(Sequence[str]):
    """The URLs (or paths) of a pattern in order, each made when asked for: a range of a million shards costs
    nothing until the index that lists them has been read."""

    def __init__(self, pattern: str) -> None:
        ranges = BRACE.findall(pattern)
        if len(ranges) > 1:
            raise ShardSpecError("a shard pattern may hold one {first..last} range")
        if not ranges:
            self.head, self.tail, self.low, self.count, self.width = pattern, "", 0, 1, -1
            return
        first, last = ranges[0]
        if len(first) > 9 or len(last) > 9 or int(last) < int(first) or int(last) - int(first) + 1 > MAX_SHARDS:
            raise ShardSpecError(f"the range {{{first[:12]}..{last[:12]}}} must count up, at most {MAX_SHARDS} "
                                 "shards")
        self.head, _, _, self.tail = BRACE.split(pattern, maxsplit=1)
        self.low, self.count = int(first), int(last) - int(first) + 1
        self.width = len(first) if first.startswith("0") else 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.count))]
        i = operator.index(i) + (self.count if operator.index(i) < 0 else 0)
        if not 0 <= i < self.count:
            raise IndexError("shard index out of range")
        return self.head if self.width < 0 else f"{self.head}{self.low + i:0{self.width}d}{self.tail}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardUrls) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(tuple(vars(self).values()))

    def __repr__(self) -> str:
        return f"ShardUrls({self[0]!r} ... {len(self)} shards)"


@dataclass(frozen=True)
class ShardSpec:
    """A split's shards: their URLs (local paths for files) in order, the index beside them, and for local shards
    the data set's folder every shard must lie in (checked, links resolved, when one is opened)."""

    pattern: str  # as shown in logs: no credentials can be in it
    urls: Sequence[str]
    index_url: str
    local: bool
    root: str = ""

    def exists(self) -> bool:
        """Local shards: the index is there (remote ones are checked when the index is read)."""
        return not self.local or Path(self.index_url).is_file()

    def __str__(self) -> str:
        return self.pattern


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> ['a-000.tar', 'a-001.tar', 'a-002.tar'] (one range at most; zero padding kept)."""
    return list(ShardUrls(pattern))


def shard_count(pattern: str) -> int:
    """How many shards a pattern names, from its range alone (nothing is expanded)."""
    return len(ShardUrls(pattern))


def check_split_budget(patterns: Sequence[str], where: str) -> None:
    """ShardSpecError when a split's patterns name more than MAX_SHARDS shards in all (counted from their ranges
    before any is expanded), or more than one pattern (a split streams one shard set)."""
    if len(patterns) > 1:
        raise ShardSpecError(f"{where} names {len(patterns)} shard patterns; a split in shards names one (a range "
                             "such as train-{000000..000511}.tar)")
    total = sum(shard_count(p) for p in patterns)
    if total > MAX_SHARDS:
        raise ShardSpecError(f"{where} names {total} shards, more than {MAX_SHARDS}")


def index_name(pattern: str) -> str:
    """The index's file name for a shard pattern: ``train-{000..003}.tar`` and ``train-000002.tar`` ->
    ``train.index.json`` (the name before the shard number)."""
    name = pattern.rsplit("/", 1)[-1]
    stem = BRACE.split(name, maxsplit=1)[0] if BRACE.search(name) else name.removesuffix(".tar").rstrip("0123456789")
    return f"{stem.rstrip('-_.') or 'shards'}.index.json"


def _check_url(value: str) -> None:
    scheme, rest = value.split("://", 1)
    if scheme.lower() not in SCHEMES:
        raise ShardSpecError(f"shard URLs use {', '.join(SCHEMES)}://, not {scheme[:20]!r}")
    authority = rest.split("/", 1)[0]
    if "@" in authority or "?" in rest or "#" in rest:
        raise ShardSpecError(f"a shard URL of {scheme}:// may not carry credentials, a query or a fragment; give "
                             "credentials through the environment (AWS_ACCESS_KEY_ID, ...) or the client's files")
    if not authority or not rest.endswith(".tar") or any(c.isspace() for c in value):
        raise ShardSpecError(f"{scheme}://{authority[:60]}/...: expected a URL of .tar shards such as "
                             f"{scheme}://bucket/train-{{000000..000511}}.tar")


def parse_shard_spec(value: str, root: Path, confine: object) -> ShardSpec:
    """A split entry naming shards -> ShardSpec. ``confine(path) -> Path`` resolves a local pattern's folder inside
    the data set's folder (utils.paths.confined; a range may only be in the file name, so every shard is in that
    folder, and each is checked again, links resolved, when it is opened); URLs are checked as above.
    ShardSpecError otherwise."""
    if "://" in value:
        _check_url(value)
        base = value.rsplit("/", 1)[0]
        return ShardSpec(value, ShardUrls(value), f"{base}/{index_name(value)}", local=False)
    folder_part, _, name = value.rpartition("/")
    if BRACE.search(folder_part) or not name:
        raise ShardSpecError(f"{value[:80]!r}: a {{first..last}} range may only be in the shards' file name")
    folder = confine(folder_part or ".")
    return ShardSpec(value, ShardUrls(f"{folder}{os.sep}{name}"), str(folder / index_name(value)), local=True,
                     root=str(Path(root).resolve()))
