"""What every rank must agree on before training, so that no replica silently trains something else: the
model, its anchors (anchor-based heads only), hyperparameters, the data's content, the options that change the
result, and the code itself.

What may differ per machine is left out: where the data and the run folder live, the number of workers, the
device string, the weights path (rank 0 reads it), hooks. Any other option naming a file (``--hyp``, ``--cfg``) is
compared by the file's content, not its path: checkouts at different paths train together.
utils.distributed.comm.check_agreement compares the fields and names the first one that differs with both values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from utils.paths import ROOT
from utils.weights.checkpoint import to_plain

PER_MACHINE = ("data", "project", "name", "save_dir", "exist_ok", "workers", "device", "local_rank", "weights",
               "resume", "trust_weights", "hook", "backend", "ddp_timeout", "ddp_long_timeout")


def digest(obj: Any) -> str:
    """A short hash of plain data (as YAML with sorted keys)."""
    return hashlib.sha1(yaml.safe_dump(to_plain(obj), sort_keys=True).encode()).hexdigest()[:12]


def code_digest(root: Path = ROOT) -> str:
    """A hash of the project's own Python files (scripts, models/, utils/): two ranks on different code differ."""
    h = hashlib.sha1()
    for path in sorted([*root.glob("*.py"), *(root / "models").glob("*.py"), *(root / "utils").rglob("*.py")]):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def fingerprint(model: torch.nn.Module, options: Mapping[str, Any], hyp: dict, dataset: Any) -> dict[str, Any]:
    """The fields every rank must agree on; ``options`` (RunConfig.options()) are compared one by one (``--epochs``:
    3 vs 5). ``dataset`` None: fixed batches given in code (benchmarks, tests), no data to compare."""
    data = [] if dataset is None else [len(dataset), [Path(f).name for f in dataset.im_files],
                                       [round(float(np.asarray(lb).sum()), 3) for lb in dataset.labels]]
    head = model.head
    fields = {"code": code_digest(), "model parameters": sum(p.numel() for p in model.parameters()),
              "model config": digest(model.yaml),
              **({"anchors": digest(head.anchors.tolist())} if head.anchor_based else {}),  # autoanchor changes them
              "data content": digest(data), "hyperparameters": digest(hyp)}
    options = {f"--{k.replace('_', '-')}": by_content(to_plain(v)) for k, v in sorted(options.items())
               if k not in PER_MACHINE}
    return {**fields, **options}


def by_content(value: Any) -> Any:
    """An option's value as the ranks compare it: a path to a file becomes ``file <name>, content <hash>`` (so
    two machines with the same file at different paths agree); anything else stays as it is."""
    if isinstance(value, list):
        return [by_content(v) for v in value]
    if not isinstance(value, str) or not value or len(value) > 4096:
        return value
    try:
        path = Path(value)
        if not path.is_file():
            return value
        return f"file content {hashlib.sha1(path.read_bytes()).hexdigest()[:12]}"
    except OSError:  # not a name this file system accepts: a plain string
        return value
