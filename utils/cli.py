"""What every script's ``main`` shares: one-line errors for bad input, and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from utils import dist
from utils.dist import read_env
from utils.errors import UserError
from utils.logging import setup_logging

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


@contextlib.contextmanager
def distributed_session(opt: argparse.Namespace) -> Iterator[torch.device]:
    """Join the process group (a no-op for one process), set up rank-0 logging and per-rank threads, and
    always tear the group down on leaving, outside the work itself, so every exit path ends every rank.

    Yields this process's device. All ranks must enter it.
    """
    device = dist.init_distributed(opt.device, opt.backend, opt.ddp_timeout, opt.ddp_long_timeout, opt.local_rank)
    setup_logging(dist.get_rank())
    dist.configure_threads()
    clean_exit = False
    try:
        yield device
        clean_exit = True
    finally:
        dist.cleanup(clean_exit=clean_exit)
