"""What the readers of untrusted files cost: peak memory on the worst files an attacker can write, and the time the
checked image decoder adds over a bare ``cv2.imread``.

    python benchmarks/bench_readers.py              # both parts (about a minute)
    python benchmarks/bench_readers.py --memory     # peak memory only
    python benchmarks/bench_readers.py --memory --only shards     # the cases whose name holds 'shards'
    python benchmarks/bench_readers.py --decode     # decode time only

Memory: for each case one child process writes the file, then a fresh one imports the readers and reads it; "peak"
is the growth of that child's peak resident memory (ru_maxrss) over the read, "x size" that growth over the file's
apparent size. Decode time: ``utils.data.image_io.read_image`` and ``cv2.imread`` of the same file, taking
turns (ABAB), medians of the per-round times [min-max] and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAMES = ("circle", "square", "triangle")


def _sparse(path: Path, nbytes: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(nbytes)
    return path


def _hdr(path: Path, side: int = 10_000) -> Path:
    from tests.utils.data.test_image_io import radiance_hdr

    return radiance_hdr(path, side)


def _png_of(side: int) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = None  # writing only
        Image.new("1", (side, side)).save(path, "PNG")
        return path
    return write


def _tiff16(path: Path) -> Path:
    """16-bit RGBA, 9400 x 9400 (within the pixel limit; 707 MB of pixels, 4 MB compressed)."""
    import cv2
    import numpy as np

    cv2.imwrite(str(path), np.zeros((9400, 9400, 4), np.uint16))
    return path


def _padded_jpg(path: Path) -> Path:
    import cv2
    import numpy as np

    cv2.imwrite(str(path), np.zeros((48, 64, 3), np.uint8))
    with open(path, "r+b") as f:
        f.truncate(200 << 20)
    return path


def _utf16_entities(path: Path) -> Path:
    """Issue 31's file: 3.8 MB of UTF-16 whose internal entity expands to ~360 M characters."""
    entity = "x" * 1000
    uses = "&e;" * 600_000
    text = f'<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE a [<!ENTITY e "{entity}">]><annotation><object>' \
           f"<name>{uses}</name></object></annotation>"
    path.write_bytes(text.encode("utf-16"))
    return path


def _voc_objects(path: Path) -> Path:
    """A 4 MB VOC file (the cap) of objects: the largest one that is parsed."""
    row = "<object><name>circle</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax></bndbox>" \
          "</object>"
    count = ((4 << 20) - 200) // len(row)
    path.write_text(f"<annotation><size><width>64</width><height>48</height></size>{row * count}</annotation>")
    return path


def _voc_nested(path: Path) -> Path:
    depth = ((4 << 20) - 100) // len("<object></object>")
    path.write_text("<annotation>" + "<object>" * depth + "</object>" * depth + "</annotation>")
    return path


def _coco(kind: str, nbytes: int = 20 << 20) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        item = {"dicts": "{}", "images": '{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}',
                "floats": "[0.5, 0.25, 0.125, 0.0625]"}[kind]
        count = nbytes // (len(item) + 2)
        images = "[" + ", ".join(f'{{"id": {i}, "file_name": "a{i}.jpg", "width": 64, "height": 48}}'
                                 for i in range(count // 2)) + "]" if kind == "images" else "[]"
        junk = "[" + ", ".join([item] * count) + "]" if kind != "images" else "[]"
        path.write_text(f'{{"images": {images}, "categories": [{{"id": 1, "name": "circle"}}], "x": {junk}}}')
        return path
    return write


def _labels(path: Path) -> Path:
    """8 MB of distinct rows (the cap): the largest label file that is read."""
    rows, size, i = [], 0, 0
    while size < (8 << 20) - 40:
        rows.append(f"{i % 3} 0.{i:07d} 0.5 0.25 0.25\n")
        size += len(rows[-1])
        i += 1
    path.write_text("".join(rows[:-1]))
    return path


def _shard_index(count: int) -> Callable[[Path], Path]:
    """A shard index of ``count`` samples with 64-letter keys and no boxes: the most memory an index takes for its
    bytes (each sample a few values, each value a Python object while it is parsed)."""
    def write(path: Path) -> Path:
        head = {"format": "yolo-ddp shards", "version": 1, "nc": 3, "names": list(NAMES), "count": count,
                "shards": [{"name": "train-000000.tar", "samples": count, "bytes": 1}]}
        with open(path, "w") as f:
            f.write(json.dumps(head)[:-1] + ',"samples":[')
            f.write(",".join(f'[0,{512 * i},1024,"{"k" * 55}{i:09d}","jpg",64,64]' for i in range(count)))
            f.write('],"labels":[' + ",".join(["[]"] * count) + "]}")
        (path.parent / "train-000000.tar").write_bytes(b"")
        return path
    return write


def _read_shard_index(path: Path) -> str:
    from utils.data.shard_urls import parse_shard_spec
    from utils.data.shards import read_index
    from utils.data.stream import ShardSplit
    from utils.paths import confined

    spec = parse_shard_spec("train-000000.tar", path.parent, lambda p: confined(p, path.parent))
    return f"{len(ShardSplit(read_index(spec, 3)))} samples"


def _read_image(path: Path) -> str:
    from utils.data.image_io import read_image

    return "x".join(map(str, read_image(path).shape))


def _read_voc(path: Path) -> str:
    from utils.data.voc import read_voc_xml

    return f"{sum(1 for _ in read_voc_xml(path).iter())} elements"


def _read_coco(path: Path) -> str:
    from utils.data.coco_json import coco_entries, read_coco

    entries = coco_entries(read_coco(path), path, path.parent, ())[0]
    return f"{len(entries)} entries"


def _read_labels(path: Path) -> str:
    from utils.data.label_cache import read_label_file

    return f"{len(read_label_file(str(path), 3)[0])} rows"


CASES: dict[str, tuple[str, Callable[[Path], Path], Callable[[Path], str]]] = {
    "image: Radiance HDR 10000x10000 named .jpg": ("photo.jpg", _hdr, _read_image),
    "image: PNG 9500x9500 (over the pixel limit)": ("bomb.png", _png_of(9500), _read_image),
    "image: PNG 9400x9400 (within the limit)": ("big.png", _png_of(9400), _read_image),
    "image: TIFF 16-bit RGBA 9400x9400": ("big.tiff", _tiff16, _read_image),
    "image: 1 GB sparse file named .jpg": ("sparse.jpg", lambda p: _sparse(p, 1 << 30), _read_image),
    "image: 64x48 JPEG padded to 200 MB": ("padded.jpg", _padded_jpg, _read_image),
    "voc: 1 GB sparse XML": ("sparse.xml", lambda p: _sparse(p, 1 << 30), _read_voc),
    "voc: UTF-16 internal entity (3.8 MB)": ("laughs.xml", _utf16_entities, _read_voc),
    "voc: 4 MB of objects (the cap)": ("objects.xml", _voc_objects, _read_voc),
    "voc: 4 MB nested 250k deep": ("nested.xml", _voc_nested, _read_voc),
    "coco: 20 MB of image entries": ("images.json", _coco("images"), _read_coco),
    "coco: 20 MB of empty objects": ("dicts.json", _coco("dicts"), _read_coco),
    "coco: 20 MB of float lists": ("floats.json", _coco("floats"), _read_coco),
    "coco: 100k nested lists": ("deep.json", lambda p: (p.write_text("[" * 100_000 + "]" * 100_000), p)[1],
                                _read_coco),
    "yolo txt: 8 MB label file (the cap)": ("labels.txt", _labels, _read_labels),
    "shards: index of 1.15 M samples (the caps)": ("train.index.json", _shard_index(1_150_000), _read_shard_index),
    "shards: index of 1.3 M samples (over 12 M values)": ("train.index.json", _shard_index(1_300_000),
                                                          _read_shard_index),
}


def write_case(name: str, folder: Path) -> None:
    """In a child process: write the case's file (its own memory never counts for the read)."""
    file_name, write, _ = CASES[name]
    write(folder / file_name)


def read_case(name: str, folder: Path) -> dict:
    """In a fresh child process: import the reader, then read the case's file; the outcome and the growth of the
    peak resident memory over the read."""
    file_name, _, read = CASES[name]
    path = folder / file_name
    import utils.data.coco_json  # noqa: F401  (the readers' imports are not the read's memory)
    import utils.data.image_io  # noqa: F401
    import utils.data.label_cache  # noqa: F401
    import utils.data.stream  # noqa: F401
    import utils.data.voc  # noqa: F401

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        outcome = f"read: {read(path)}"
    except Exception as e:  # the refusals: ImageRefused, ValueError, DataError
        outcome = f"refused: {str(e).split(str(path) + ': ')[-1][:60]}"
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return {"name": name, "size": path.stat().st_size, "outcome": outcome, "grew": grew}


def memory_table(only: str = "") -> None:
    print(f"{'case':46s} {'file':>9s} {'peak':>9s} {'x size':>7s}  outcome")
    for name in (n for n in CASES if only in n):
        with tempfile.TemporaryDirectory() as folder:
            for step in ("--write", "--read"):
                out = subprocess.run([sys.executable, __file__, step, name, "--folder", folder],
                                     capture_output=True, text=True, cwd=ROOT)
                if out.returncode:
                    break
        if out.returncode:
            print(f"{name:46s} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:46s} {mb(r['size']):>9s} {mb(r['grew']):>9s} {r['grew'] / r['size']:7.2f}  {r['outcome']}")


def mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GB"


def decode_table(rounds: int = 15) -> None:
    import cv2
    import numpy as np

    from utils.data.image_io import read_image

    rng = np.random.default_rng(0)
    print(f"\n{'image':18s} {'cv2.imread ms':>22s} {'read_image ms':>22s} {'ratio':>6s}")
    with tempfile.TemporaryDirectory() as folder:
        for (h, w), suffix in (((64, 64), ".jpg"), ((480, 640), ".jpg"), ((480, 640), ".png"),
                               ((1080, 1920), ".jpg")):
            path = str(Path(folder) / f"img{suffix}")
            cv2.imwrite(path, cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (9, 9), 3))
            repeats = max(1, int(2e6 // (h * w)))
            times: dict[str, list[float]] = {"imread": [], "read_image": []}
            for _ in range(rounds):
                for key, read in (("imread", cv2.imread), ("read_image", read_image)):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        read(path)
                    times[key].append((time.perf_counter() - start) / repeats * 1e3)
            ratios = [b / a for a, b in zip(times["imread"], times["read_image"])]
            cells = [f"{statistics.median(t):.3f} [{min(t):.3f}-{max(t):.3f}]" for t in times.values()]
            print(f"{w}x{h}{suffix:5s}      {cells[0]:>22s} {cells[1]:>22s} {statistics.median(ratios):6.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--memory", action="store_true", help="peak memory only")
    p.add_argument("--decode", action="store_true", help="decode time only")
    p.add_argument("--only", default="", help="memory: only the cases whose name holds this text")
    p.add_argument("--write", help=argparse.SUPPRESS)
    p.add_argument("--read", help=argparse.SUPPRESS)
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    opt = p.parse_args(argv)
    if opt.write:
        write_case(opt.write, opt.folder)
        return
    if opt.read:
        print(json.dumps(read_case(opt.read, opt.folder)))
        return
    if opt.memory or not opt.decode:
        memory_table(opt.only)
    if opt.decode or not opt.memory:
        decode_table()


if __name__ == "__main__":
    main()
