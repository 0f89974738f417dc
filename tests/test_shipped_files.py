"""No file the project ships names a folder of the machine it was made on: a home (/home/<user>, /root, /Users), a
work folder (/work), or, inside pickles and other binary data, a temporary folder (/tmp). Every git-tracked file is
read, and the members of zip archives (.pt checkpoints, .npz arrays) one by one. Text may name /tmp in a command
the reader runs (``tar -x -C /tmp/old``); a pickled path was the machine's."""

from __future__ import annotations

import io
import re
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (written so that this file does not match itself)
MACHINE_FOLDER = re.compile(rb"/(?:home|Users)/[^/\s]+/|/(?:root|work)/|[A-Za-z]:\\\\?(?:Users)\\\\?")
TEMP_FOLDER = re.compile(rb"/(?:tmp)/|/var/(?:folders)/|\\\\AppData\\\\Local\\\\(?:Temp)")


def machine_paths(name: str, data: bytes) -> list[str]:
    """The machine paths in one file's bytes (a zip archive: in each member), as ``file[member]: path`` lines."""
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return [hit for member in archive.namelist()
                    for hit in machine_paths(f"{name}[{member}]", archive.read(member))]
    binary = b"\0" in data[:8192]
    patterns = (MACHINE_FOLDER, TEMP_FOLDER) if binary else (MACHINE_FOLDER,)
    return [f"{name}: {m.group(0).decode(errors='replace')}..." for p in patterns for m in p.finditer(data)]


def test_no_shipped_file_names_a_folder_of_the_machine_that_made_it() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    paths = [ROOT / f.decode() for f in files if f]
    assert any(p.suffix == ".pt" for p in paths)
    hits = [hit for p in paths if p.is_file() for hit in machine_paths(str(p.relative_to(ROOT)), p.read_bytes())]
    assert not hits, "\n".join(hits[:20])


def test_the_scan_finds_a_path_in_a_pickle_inside_a_checkpoint(tmp_path: Path) -> None:
    import torch

    torch.save({"model_yaml": "/tmp/m/yolov5s.yaml", "w": torch.zeros(3)}, tmp_path / "leaky.pt")
    torch.save({"model_yaml": "yolov5s.yaml", "w": torch.zeros(3)}, tmp_path / "clean.pt")
    hits = machine_paths("leaky.pt", (tmp_path / "leaky.pt").read_bytes())
    assert len(hits) == 1 and hits[0].startswith("leaky.pt[leaky/data.pkl]: /tmp/"), hits
    assert machine_paths("clean.pt", (tmp_path / "clean.pt").read_bytes()) == []
    assert machine_paths("notes.md", b"made in /" + b"home/alice/yolo") and not machine_paths("cmd.md", b"-C /tmp/old")
