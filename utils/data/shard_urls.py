"""Where a split's tar shards live: a local path or a URL with a brace range, as a data YAML names them.

    train: shards/train-{000000..000003}.tar                      # beside the YAML (confined to the data set's folder)
    train: s3://bucket/coco/train-{000000..000511}.tar            # S3 (s3fs), gs:// (gcsfs), https:// (fsspec)

The index written beside the shards (``train.index.json`` for ``train-{...}.tar`` or ``train-000003.tar``) is found
beside them; a pattern naming some of the index's shards is a split of those (``val: shards/train-000000.tar``). A URL
never carries credentials: user information, query strings and fragments are refused (the usual environment and
configuration files of each client supply them), so nothing secret reaches a log or an error line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class ShardSpec:
    """A split's shards: their URLs (local paths for files) in order, and the index beside them."""

    pattern: str  # as shown in logs: no credentials can be in it
    urls: tuple[str, ...]
    index_url: str
    local: bool

    def exists(self) -> bool:
        """Local shards: the index is there (remote ones are checked when the index is read)."""
        return not self.local or Path(self.index_url).is_file()

    def __str__(self) -> str:
        return self.pattern


def expand_braces(pattern: str) -> list[str]:
    """``a-{000..002}.tar`` -> ['a-000.tar', 'a-001.tar', 'a-002.tar'] (one range at most; zero padding kept)."""
    ranges = BRACE.findall(pattern)
    if len(ranges) > 1:
        raise ShardSpecError("a shard pattern may hold one {first..last} range")
    if not ranges:
        return [pattern]
    first, last = ranges[0]
    low, high = int(first), int(last)
    if high < low or high - low + 1 > MAX_SHARDS:
        raise ShardSpecError(f"the range {{{first}..{last}}} must count up, at most {MAX_SHARDS} shards")
    width = len(first) if first.startswith("0") else 0
    head, tail = BRACE.split(pattern, maxsplit=1)[0], BRACE.split(pattern, maxsplit=1)[-1]
    return [f"{head}{i:0{width}d}{tail}" for i in range(low, high + 1)]


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
    """A split entry naming shards -> ShardSpec. ``confine(path) -> Path`` resolves a local pattern inside the data
    set's folder (utils.paths.confined); URLs are checked as above. ShardSpecError otherwise."""
    if "://" in value:
        _check_url(value)
        base = value.rsplit("/", 1)[0]
        return ShardSpec(value, tuple(expand_braces(value)), f"{base}/{index_name(value)}", local=False)
    urls = [str(confine(url)) for url in expand_braces(value)]
    index = Path(urls[0]).parent / index_name(value)
    return ShardSpec(value, tuple(urls), str(index), local=True)
