"""What every script's ``main`` shares: one-line errors for bad input, and exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from utils.dist import read_env
from utils.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def run_main(main: Callable[[Any], Any], opt: Any, script: str) -> int:
    """Call ``main(opt)``; a UserError prints ``script: error: message`` on stderr and returns 2.

    Under torchrun every rank usually meets the same bad input, so only rank 0 prints it; the
    other ranks exit with the same code, and torchrun's summary names the ranks that failed.
    """
    try:
        main(opt)
    except UserError as e:
        if read_env().rank == 0:
            print(f"{script}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{script}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return 0


def add_distributed_flags(parser: argparse.ArgumentParser, long_wait: str = "label cache, validation") -> None:
    """The torch.distributed flags every multi-process script shares (train.py, test.py)."""
    parser.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"],
                        help="torch.distributed backend (auto: nccl on CUDA, else gloo)")
    parser.add_argument("--ddp-timeout", type=float, default=600.0, help="seconds before a collective fails")
    parser.add_argument("--ddp-long-timeout", type=float, default=1800.0, help=f"seconds for long waits ({long_wait})")
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=-1,
                        help=argparse.SUPPRESS)  # the legacy torch.distributed.launch flag
