"""Long-lived objects out of the garbage collector's passes (utils.device.freeze_long_lived): a script's modules from
its start and everything at its exit (utils.cli.run_script, which command_line, detect.py and export.py run), and
what a DataLoader worker inherited; what the process creates afterwards is collected as before."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

from utils.data.loader import setup_worker_process
from utils.paths import ROOT


class FreezeCount(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        return gc.get_freeze_count()


def test_a_dataloader_worker_freezes_what_it_inherited() -> None:
    assert gc.get_freeze_count() == 0
    loader = torch.utils.data.DataLoader(FreezeCount(), batch_size=None, num_workers=1,
                                         worker_init_fn=lambda _: setup_worker_process())
    counts = [int(count) for count in loader]
    assert len(counts) == 2 and min(counts) > 100_000  # the parent's modules (torch's) and objects
    assert gc.get_freeze_count() == 0  # the parent's own collector is untouched


SCRIPT = """
import atexit, gc, sys, weakref
sys.path.insert(0, {root!r})
from utils import api


def at_exit():
    print("frozen at exit:", gc.get_freeze_count(), flush=True)
    node = weakref.ref(kept.pop())
    gc.collect()
    print("a cycle made in main, frozen at exit:", node() is not None, flush=True)


atexit.register(at_exit)

class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it

def parse_opt(argv):
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--fail", action="store_true")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)

def main(opt):
    from utils.errors import UserError
    print("frozen in main:", gc.get_freeze_count(), flush=True)
    node = Node()
    alive = weakref.ref(node)
    del node
    gc.collect()
    print("a cycle made in main collected:", alive() is None, flush=True)
    global kept
    kept = [Node() for _ in range(10)]  # alive at exit: frozen with the rest
    if opt.fail:
        raise UserError("bad input")

sys.exit(api.command_line("train.py", parse_opt, main))
"""


@pytest.mark.parametrize("fail, code", [(False, 0), (True, 2)])
def test_a_script_freezes_its_modules_and_at_exit_everything(fail: bool, code: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT)), *(["--fail"] if fail else [])],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == code, done.stderr
    lines = dict(line.split(": ") for line in done.stdout.splitlines())
    assert int(lines["frozen in main"]) > 50_000  # torch's modules, imported by utils.api's
    assert lines["a cycle made in main collected"] == "True"
    assert int(lines["frozen at exit"]) > int(lines["frozen in main"])
    assert lines["a cycle made in main, frozen at exit"] == "True"  # no collection walks it any more
    assert ("bad input" in done.stderr) == fail
