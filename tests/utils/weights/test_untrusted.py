"""Crafted weights files of each kind issue 21 found: refused in one line, within a few seconds and far under 1 GB.

Memory is measured as the growth of the process's peak resident size (``VmHWM``, reset through
``/proc/self/clear_refs`` first), never by wall-clock thresholds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from models.yolo import Model
from tests.utils.weights.pickles import (
    NONE,
    TRUE,
    build,
    dct,
    floats,
    glob,
    lst,
    newobj,
    num,
    program,
    reduce,
    tensor,
    text,
    torch_zip,
    tup,
)
from utils.weights.checkpoint import CheckpointError, load_checkpoint, load_model, new_checkpoint, save_checkpoint
from utils.weights.release_reader import read_records

ROOT = Path(__file__).resolve().parents[3]
GB = 1 << 30


def peak_growth(action: Callable[[], object]) -> int:
    """Bytes the peak resident size grew by while ``action`` ran (the exception it raises is re-raised)."""
    def status(key: str) -> int:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(key))
        return int(line.split()[1]) * 1024

    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    except OSError:
        pass
    start = status("VmHWM:")
    try:
        action()
    finally:
        grown = status("VmHWM:") - start
    return grown


def refused(load: Callable[[Path], object], path: Path, *words: str) -> int:
    """Peak memory growth of ``load(path)``, asserting a one-line CheckpointError naming the file and ``words``."""
    holder: dict = {}

    def attempt() -> None:
        with pytest.raises(CheckpointError) as info:
            load(path)
        holder["message"] = str(info.value)

    grown = peak_growth(attempt)
    message = holder["message"]
    assert "\n" not in message and str(path) in message and all(w in message for w in words), message
    return grown


def release_like(**extra: bytes) -> bytes:
    """The top level of a release file: a pickled models.yolo.Model record (so load_checkpoint uses the reader)."""
    return program(dct(model=build(newobj(glob("models.yolo", "Model")), dct()), **extra))


# ------------------------------------------------------------------------------------------ finding 1
def test_build_on_an_allowed_function_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    rebuild = torch._utils._rebuild_tensor_v2
    before = (rebuild.__defaults__, rebuild.__kwdefaults__, dict(rebuild.__dict__))
    changes = dct(__defaults__=tup(num(-1)), flipped=TRUE)
    for i, state in enumerate((tup(NONE, changes), changes)):  # slot state (setattr) and dict state (__dict__)
        attack = build(glob("torch._utils", "_rebuild_tensor_v2"), state)
        path = torch_zip(tmp_path / f"evil{i}.pt", release_like(x=attack))
        for load in (load_checkpoint, read_records):
            refused(load, path, "refused", "_rebuild_tensor_v2")
    assert (rebuild.__defaults__, rebuild.__kwdefaults__, dict(rebuild.__dict__)) == before
    honest = tmp_path / "honest.pt"
    torch.save({"w": torch.tensor([1.0, -2.0])}, honest)
    assert torch.load(honest, weights_only=True)["w"].tolist() == [1.0, -2.0]  # signs as saved


# ------------------------------------------------------------------------------------------ finding 2
BOMB = tensor("0", 1, (250_000_000,), (0,))  # 1 stored float shown 2.5e8 times (1 GB as float32)


@pytest.mark.parametrize("where", ["epoch", "model"])
def test_stride_zero_view_is_refused_by_the_release_reader(tmp_path: Path, where: str) -> None:
    path = torch_zip(tmp_path / "bomb.pt", program(dct({"model": build(newobj(glob("models.yolo", "Model")), dct()),
                                                        where: BOMB})), {"0": floats(1.0)})
    for load in (load_checkpoint, read_records):
        assert refused(load, path, "refused", "overlapping view") < GB // 4


def test_views_of_our_checkpoints_are_checked_after_weights_only_loading(tmp_path: Path) -> None:
    """torch.load(weights_only=True) accepts views that show stored elements many times; the loader does not."""
    views = {"stride0": tensor("0", 4, (250_000_000,), (0,)), "overlap": tensor("0", 4, (2, 2), (1, 1))}
    for name, view in views.items():
        path = torch_zip(tmp_path / f"{name}.pt", program(dct(format=text("yolo-ddp"), model=dct(w=view))),
                         {"0": floats(1.0, 2.0, 3.0, 4.0)})
        assert refused(load_checkpoint, path, "refused", "overlapping view") < GB // 4
    past = torch_zip(tmp_path / "past.pt", release_like(w=tensor("0", 4, (2, 2), (2, 1), offset=1)),
                     {"0": floats(1.0, 2.0, 3.0, 4.0)})
    refused(read_records, past, "refused", "reaches past its storage of 4 elements")


def test_deflated_zip_members_are_refused_before_reading(tmp_path: Path) -> None:
    zeros = bytes(64 << 20)  # 64 MB of zeros deflate to about 64 kB
    path = torch_zip(tmp_path / "zipbomb.pt", program(dct(w=tensor("0", len(zeros) // 4, (len(zeros) // 4,), (1,)))),
                     {"0": zeros}, compress=True)
    assert path.stat().st_size < 1 << 20
    for load in (load_checkpoint, read_records):
        assert refused(load, path, "refused", "compressed") < 32 << 20


def test_tensors_together_stay_within_twice_the_file(tmp_path: Path) -> None:
    """Eight whole views of one 1.2 MB storage (each fine alone) claim 9.6 MB from a 1.2 MB file."""
    count = 300_000
    views = {f"v{i}": tensor("0", count, (count,), (1,)) for i in range(8)}
    path = torch_zip(tmp_path / "many.pt", release_like(**views), {"0": bytes(4 * count)})
    assert refused(read_records, path, "refused", "claim more bytes than the file could hold") < GB // 4


def test_storages_must_hold_what_they_claim(tmp_path: Path) -> None:
    path = torch_zip(tmp_path / "short.pt", release_like(w=tensor("0", 1000, (1000,), (1,))), {"0": floats(1.0)})
    assert refused(read_records, path, "refused", "claims 1000 elements") < GB // 4


# ------------------------------------------------------------------------------------------ finding 3
@pytest.fixture(scope="module")
def _tiny_checkpoint() -> dict:
    from tests.conftest import _tiny_cfg

    return new_checkpoint(Model(_tiny_cfg()))


@pytest.fixture
def small_checkpoint(_tiny_checkpoint: dict) -> dict:
    return copy.deepcopy(_tiny_checkpoint)


def test_huge_repeat_count_in_a_checkpoint_is_refused(small_checkpoint: dict, tmp_path: Path) -> None:
    small_checkpoint["model_yaml"]["backbone"][2][1] = 10 ** 9
    path = save_checkpoint(small_checkpoint, tmp_path / "repeats.pt")
    assert refused(load_model, path, "more than 100 repeats") < GB // 4


def test_config_wider_than_its_tensors_is_refused_before_building(small_checkpoint: dict, tmp_path: Path) -> None:
    """yolov5n's rows at width 4.0 would build about 470M parameters (1.9 GB); the file holds a few thousand."""
    small_checkpoint["model_yaml"] = {**yaml.safe_load((ROOT / "models" / "yolov5n.yaml").read_text()),
                                      "width_multiple": 4.0, "nc": 3}
    path = save_checkpoint(small_checkpoint, tmp_path / "wide.pt")
    assert refused(load_model, path, "in the file but", "in the model its yaml builds") < GB // 4


def test_config_bounds_are_one_line(tiny_cfg: dict) -> None:
    from models.yolo import ModelConfigError

    wide, long = copy.deepcopy(tiny_cfg), copy.deepcopy(tiny_cfg)
    wide["backbone"][1][3][0] = 100_000
    long["head"] = long["head"][:-1] * 40 + long["head"][-1:]
    for cfg, words in ((wide, "100000 channels is more than 8192"), (long, "more than 256 rows")):
        with pytest.raises(ModelConfigError, match=words):
            Model(cfg)

    for key, value, words in [("width_multiple", 2e9, "width_multiple"), ("depth_multiple", -1, "depth_multiple"),
                              ("nc", 10 ** 12, "nc must be"), ("anchors", [[1e9, 1]] * 3, "anchors")]:
        cfg = copy.deepcopy(tiny_cfg)
        cfg[key] = value
        with pytest.raises(ModelConfigError, match=words):
            Model(cfg)
    cfg = copy.deepcopy(tiny_cfg)
    upsample = next(row for row in cfg["head"] if row[2] == "nn.Upsample")
    upsample[3] = [None, 1000, "nearest"]
    with pytest.raises(ModelConfigError, match="Upsample takes"):
        Model(cfg)


# ------------------------------------------------------------------------------------------ finding 8
def test_malformed_persistent_id_and_deep_nesting_are_one_line(tmp_path: Path) -> None:
    not_a_storage = tup(text("module"), glob("torch", "FloatStorage"), text("0"), text("cpu"), num(1)) + b"Q"
    path = torch_zip(tmp_path / "pid.pt", release_like(w=not_a_storage), {"0": floats(1.0)})
    for load in (load_checkpoint, read_records):
        assert refused(load, path, "not a storage") < GB // 4
    nested = lst()
    for _ in range(3000):
        nested = lst(nested)
    path = torch_zip(tmp_path / "deep.pt", release_like(opt=nested))
    for load in (load_checkpoint, read_records):
        assert refused(load, path, "nested deeper than 64") < GB // 4
    ours = torch_zip(tmp_path / "deep-ours.pt", program(dct(format=text("yolo-ddp"), opt=nested)))
    assert refused(load_checkpoint, ours, "nested deeper than 64") < GB // 4


def test_calls_with_unusual_arguments_are_refused(tmp_path: Path) -> None:
    odd = reduce(glob("collections", "OrderedDict"), tup(glob("os", "environ")))
    path = torch_zip(tmp_path / "odd.pt", release_like(x=odd))
    assert refused(read_records, path, "refused", "os.environ") < GB // 4


# ------------------------------------------------------------------------------------------ finding 10
def test_weights_urls_are_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from utils.weights.downloads import DownloadError, attempt_download

    monkeypatch.chdir(tmp_path)
    for url in ("https://host/yolov5s.pt", "http://host/x.pt"):  # a release name in a URL, and any other file
        with pytest.raises(DownloadError, match="URLs are not downloaded") as info:
            attempt_download(url) if url.endswith("yolov5s.pt") else load_checkpoint(url)
        assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing made under ./https:/host/


def test_a_torchscript_file_runs_its_code_when_loaded_so_it_needs_trust(tmp_path: Path) -> None:
    """The evidence behind requiring --trust-weights: torch.jit.load runs the file's __setstate__, which here
    overwrites a file of the user's through torch.from_file(shared=True)."""
    from utils.weights.untrusted import UntrustedFileError, check_torchscript_trusted

    victim = tmp_path / "notes.txt"

    class Writer(torch.nn.Module):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

        @torch.jit.export
        def __getstate__(self) -> tuple[str, bool]:
            return self.path, self.training

        @torch.jit.export
        def __setstate__(self, state: tuple[str, bool]) -> None:
            self.path, self.training = state
            written = torch.from_file(self.path, True, 8, dtype=torch.uint8)
            written.fill_(66)
            print(written.sum())  # keeps the write from being optimised away

    script = tmp_path / "model.torchscript"
    victim.write_text("AAAAAAAA")
    torch.jit.save(torch.jit.script(Writer(str(victim))), str(script))
    victim.write_text("AAAAAAAA")
    with pytest.raises(UntrustedFileError, match="--trust-weights") as info:
        check_torchscript_trusted(script, trusted=False)
    assert "\n" not in str(info.value) and victim.read_text() == "AAAAAAAA"
    check_torchscript_trusted(script, trusted=True)
    torch.jit.load(str(script))  # what loading it means
    assert victim.read_text() == "BBBBBBBB"


def test_release_downloads_are_byte_capped(release_server: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from utils.weights import downloads

    monkeypatch.setattr(downloads, "MAX_WEIGHTS_BYTES", 100_000)  # the served file has 3.9 MB
    with pytest.raises(downloads.DownloadError, match="more than the cap of 100000") as info:
        downloads.attempt_download("yolov5n.pt", attempts=1, progress=False)
    assert "\n" not in str(info.value) and not list(release_server.glob("*yolov5n*"))
