"""DataError and the bounds every reader of data files shares: the bottom of utils.data, so the readers, the
downloads and the converters raise it without importing the data YAML resolution (utils.data.config) that uses
them."""

from __future__ import annotations

from utils.errors import UserError

MAX_NAME_LENGTH = 128  # characters of a class name (data YAMLs, COCO categories)


class DataError(UserError):
    """A data set problem the user can fix: a missing or malformed YAML, split or image list."""
