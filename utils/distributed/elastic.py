"""What a worker can see of torchrun's elastic membership: the node range (``--nnodes MIN:MAX``) and whether the agent
gives each rendezvous round a store of its own, so that a run whose next joining node would kill the job says so
at start-up.

torchrun gives its workers no variable for the node range. The worker sees it where the launcher put it: in
``PET_NNODES`` (torchrun reads every option from a ``PET_<NAME>`` variable; the Kubeflow operator sets them), else
on the command line of its parent, the torchrun agent (Linux ``/proc``). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` is
read by the agent; its workers inherit the agent's environment, so they see it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from utils.distributed.launcher import SEPARATE_STORES


def parent_argv() -> list[str]:
    """The command line of this process's parent (under torchrun: the agent), [] where it cannot be read."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()[:65536]
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def node_range(env: Mapping[str, str], argv: Sequence[str]) -> tuple[int, int] | None:
    """torchrun's ``--nnodes`` as (min, max): ``argv``'s (the agent's command line) wins over ``PET_NNODES``, as
    torchrun itself decides; None when neither says it or the value is not ``N`` or ``MIN:MAX``."""
    value = env.get("PET_NNODES", "")
    for i, word in enumerate(argv):
        if word in ("--nnodes", "--nnodes_") and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--nnodes="):
            value = word.split("=", 1)[1]
    low, _, high = value.strip().partition(":")
    if not low.isdigit() or (high and not high.isdigit()):
        return None
    return int(low), int(high or low)


def elastic_store_warning(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> str | None:
    """The one start-up line for a torchrun worker of an elastic job (min nodes < max nodes) whose agent shares one
    store across rendezvous rounds (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` is not 1): a node joining it later kills
    both. None otherwise (not under torchrun, fixed membership, the variable set)."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" not in env or env.get(SEPARATE_STORES, "").strip() == "1":
        return None
    nodes = node_range(env, parent_argv() if argv is None else argv)
    if nodes is None or nodes[0] == nodes[1]:
        return None
    return (f"WARNING: this elastic job (--nnodes {nodes[0]}:{nodes[1]}) runs without {SEPARATE_STORES}=1 in "
            f"torchrun's environment: a node that joins later makes every node time out in the next rendezvous; "
            f"export it before torchrun on every node (docs/cluster.md)")
