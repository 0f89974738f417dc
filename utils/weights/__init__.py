"""Checkpoints and weight files. Importing the package registers the release-file readers with the checkpoint
loader (utils.weights.checkpoint.RELEASE_READERS), so every load_checkpoint() reads release files while the loader
imports none of its readers."""

from utils.weights import release_reader, ultralytics_reader  # noqa: F401  (they register themselves)
