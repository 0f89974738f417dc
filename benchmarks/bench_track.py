"""How well detect.py --track follows objects: HOTA, IDF1, MOTA and ID switches of ByteTrack and BoT-SORT by TrackEval
on generated videos with ground-truth tracks (benchmarks/track_scenes.py), side by side.

    python benchmarks/bench_track.py                        # 8 scenes; ground truth as detections; a detector it trains
    python benchmarks/bench_track.py --weights best.pt --img-size 160     # your detector of the scenes instead
    python benchmarks/bench_track.py --scenes 4 --no-detector

Each scene is 90 frames of 160x120: objects crossing and hiding each other, one leaving the frame and coming back,
others entering; even seeds have a still camera, odd ones a shaking one. The rows:

- ``ground truth (jittered)``: the true boxes with noise, 2 % missed, false boxes, partly hidden objects at low
  confidence, tracked in this process (the time per frame is the tracker's alone);
- ``+ pillar``: the same with a pillar in front of the scene that hides whatever passes behind it;
- ``trained detector``: a one-class YOLOv5n trained here on frames of other scenes (``--weights`` to use yours),
  run by detect.py --track on each scene written as an mp4, its MOT-challenge file scored.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.track_scenes import (  # noqa: E402
    Scene,
    jittered_detections,
    make_scene,
    mot_metrics,
    read_mot_file,
    scene_specs,
    train_detector,
    write_scene_video,
)
from utils.tracking.registry import build_tracker, load_tracker_config, tracker_names  # noqa: E402

FPS = 30.0


@dataclass
class Row:
    detections: str
    tracker: str
    metrics: dict[str, float]
    still: float  # IDF1 of the still-camera scenes
    shaking: float  # IDF1 of the shaking-camera scenes
    ms_per_frame: float | None = None  # the tracker's median time per frame (in-process rows)


def track_rows(scene: Scene, detections: list[np.ndarray], tracker: str) -> tuple[list[np.ndarray], list[float]]:
    """Tracks per frame (id, x1, y1, x2, y2) and seconds per frame of ``tracker`` on a scene's detection rows."""
    model = build_tracker(load_tracker_config(tracker), FPS)
    tracks, seconds = [], []
    for frame, rows in zip(scene.frames, detections):
        start = time.perf_counter()
        tracked = model.update(rows, frame)
        seconds.append(time.perf_counter() - start)
        tracks.append(np.concatenate([tracked.ids[:, None], tracked.rows[:, :4]], 1))
    return tracks, seconds


def summarize(label: str, tracker: str, results: dict[str, tuple[Scene, list[np.ndarray]]],
              seconds: list[float] | None = None) -> Row:
    pairs = {name: (scene.truth, tracks) for name, (scene, tracks) in results.items()}
    still = {k: v for k, v in pairs.items() if not results[k][0].spec.shake}
    shaking = {k: v for k, v in pairs.items() if results[k][0].spec.shake}
    return Row(label, tracker, mot_metrics(pairs), mot_metrics(still)["IDF1"] if still else float("nan"),
               mot_metrics(shaking)["IDF1"] if shaking else float("nan"),
               float(np.median(seconds)) * 1e3 if seconds else None)


def ground_truth_rows(scenes: list[Scene], label: str) -> list[Row]:
    rows = []
    for tracker in tracker_names():
        results, seconds = {}, []
        for scene in scenes:
            tracks, spent = track_rows(scene, jittered_detections(scene, seed=scene.spec.seed), tracker)
            results[scene.name], seconds = (scene, tracks), seconds + spent
        rows.append(summarize(label, tracker, results, seconds))
    return rows


def detector_rows(scenes: list[Scene], weights: Path, img_size: int, folder: Path) -> list[Row]:
    """detect.py --track on each scene as an mp4, its MOT file scored."""
    import detect

    rows = []
    for tracker in tracker_names():
        results = {}
        for scene in scenes:
            video = write_scene_video(scene, folder / f"{scene.name}.mp4", FPS)
            result = detect.run(weights=str(weights), source=str(video), img_size=img_size, track=tracker,
                                nosave=True, project=str(folder / "runs"), name=tracker, device="cpu")
            results[scene.name] = (scene, read_mot_file(result.mot_files[-1], len(scene.frames)))
        rows.append(summarize("trained detector", tracker, results))
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'detections':<26}{'tracker':<11}{'HOTA':>7}{'IDF1':>7}{'MOTA':>7}{'IDSW':>6}{'IDF1 still':>12}"
             f"{'IDF1 shaking':>14}{'ms/frame':>10}"]
    for r in rows:
        ms = f"{r.ms_per_frame:.2f}" if r.ms_per_frame is not None else "-"
        m = r.metrics
        lines.append(f"{r.detections:<26}{r.tracker:<11}{m['HOTA']:>7.3f}{m['IDF1']:>7.3f}{m['MOTA']:>7.3f}"
                     f"{int(m['IDSW']):>6}{r.still:>12.3f}{r.shaking:>14.3f}{ms:>10}")
    return "\n".join(lines)


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_track.py", description=__doc__.splitlines()[0])
    parser.add_argument("--scenes", type=int, default=8, help="scenes (seeds 0..N-1; odd ones with a shaking camera)")
    parser.add_argument("--weights", default="", help="a detector of the scenes (default: train one here)")
    parser.add_argument("--img-size", type=int, default=160, help="the detector's input size")
    parser.add_argument("--no-detector", action="store_true", help="only the ground-truth rows")
    return parser.parse_args(argv)


def main(opt: argparse.Namespace) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    scenes = [make_scene(spec) for spec in scene_specs(opt.scenes)]
    pillar = [make_scene(spec) for spec in scene_specs(opt.scenes, pillar=True)]
    rows = ground_truth_rows(scenes, "ground truth (jittered)") + ground_truth_rows(pillar, "  + pillar")
    if not opt.no_detector:
        with tempfile.TemporaryDirectory() as tmp:
            weights = Path(opt.weights) if opt.weights else train_detector(Path(tmp) / "detector",
                                                                            img_size=opt.img_size)
            rows += detector_rows(scenes, weights, opt.img_size, Path(tmp))
    print(f"{opt.scenes} scenes of 90 frames, 160x120, TrackEval (HOTA, Identity, CLEAR)")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main(parse_opt())
