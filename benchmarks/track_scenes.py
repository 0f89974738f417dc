"""Generated videos with ground-truth tracks, and their MOT metrics by TrackEval (the HOTA authors' package).

A scene is a seeded, deterministic video of coloured shapes (circle, square, triangle: the synthetic set's classes)
moving over a textured background: two objects cross each other's path, one leaves the frame and comes back, the
others come in through the frame's sides and go across, nearer objects hide farther ones, a pillar in front may
hide whatever passes behind it, and the camera may shake (a hand-held camera: its motion changes direction from
frame to frame). The ground truth of a frame is every object in view, as its whole box clipped to the frame, with
the share of its shape seen (not out of the frame, not behind the pillar or a nearer object) and the object's one
identity for the whole video (re-entering included, as MOT-challenge ground truth does). Objects seen at least
``MIN_VISIBLE`` are scored; the others are ignore regions, as MOTChallenge's evaluation treats its occluded and
distractor boxes: a track on them is neither right nor wrong.

``jittered_detections`` turns the truth into a detector's output: boxes moved by noise, some missed, a few false
ones, partly hidden objects at low confidence. ``mot_metrics`` scores tracks against the truth with TrackEval's
HOTA, Identity (IDF1) and CLEAR (MOTA, ID switches). ``write_training_set`` writes frames of other seeds as a YOLO
data set, for a detector to learn the scenes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import yaml

from utils.paths import ROOT
from utils.safe_yaml import load_yaml

CLASSES = ("circle", "square", "triangle")
COLOURS = ((40, 40, 230), (60, 200, 60), (230, 120, 30), (40, 220, 230), (200, 60, 200), (220, 220, 40),
           (30, 140, 250), (150, 80, 255))  # bright BGR colours, far from the background's greys
MIN_VISIBLE = 0.5  # the share of an object's shape that must be seen for it to be in the ground truth
PILLAR_WIDTH = 0.1  # of the frame's width
SHAKE = 3.0  # the shaking scenes' camera wobble, pixels either way


@dataclass(frozen=True)
class SceneSpec:
    seed: int = 0
    width: int = 160
    height: int = 120
    frames: int = 90
    objects: int = 7  # two crossing, one leaving and coming back, one more, the rest entering later
    shake: float = 0.0  # a hand-held camera's wobble, pixels either way (0: a still camera)
    pillar: bool = False  # a pillar in front of the scene hides what passes behind it

    def view(self, t: int) -> tuple[int, int]:
        """The camera's top-left corner in the world at frame ``t`` (whole pixels)."""
        x = self.shake * (1 + np.sin(0.45 * t))
        y = self.shake * (1 + np.sin(0.6 * t + 1.0))
        return int(round(x)), int(round(y))


@dataclass
class Scene:
    spec: SceneSpec
    frames: list[np.ndarray] = field(default_factory=list)  # BGR
    truth: list[np.ndarray] = field(default_factory=list)  # per frame (n, 7): id, x1, y1, x2, y2, cls, visible share

    @property
    def name(self) -> str:
        return f"seed{self.spec.seed}{'-shaking' if self.spec.shake else ''}{'-pillar' if self.spec.pillar else ''}"


@dataclass
class _Object:
    cls: int
    colour: tuple[int, int, int]
    radius: float
    position: np.ndarray  # world pixels
    velocity: np.ndarray  # pixels per frame
    start: int = 0  # the frame it appears in (entering from outside the frame unless 0)
    leaves: bool = False  # steps out through a side and comes back once
    gone: bool = False  # crossed the frame and left it for good


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Low-saturation texture with corners (for camera-motion estimates): smooth noise and grey rectangles."""
    coarse = rng.normal(0, 1, (max(height // 12, 2), max(width // 12, 2), 3))
    image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    grey = image.mean(2, keepdims=True)
    image = 120 + 25 * grey + 6 * (image - grey)
    for _ in range(width * height // 900):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = int(rng.integers(3, 14)), int(rng.integers(3, 14))
        cv2.rectangle(image, (x, y), (x + w, y + h), (float(rng.integers(70, 190)),) * 3, -1)
    return np.clip(image, 0, 255).astype(np.uint8)


def _objects(spec: SceneSpec, rng: np.random.Generator) -> list[_Object]:
    """The cast, in frame-0 view coordinates: the crossing pair, the one that leaves and comes back, one more in
    view from the start, and the rest entering through the frame's sides later on, all moving in straight lines."""
    w, h = spec.width, spec.height
    colours = rng.permutation(len(COLOURS))
    objects: list[_Object] = []
    for k in range(spec.objects):
        radius = float(rng.uniform(0.055, 0.085) * w)
        speed = float(rng.uniform(0.009, 0.016) * w)
        start = 0
        if k < 2:  # the crossing pair: from either side along the middle, a little apart
            side = -1 if k else 1
            position = np.array([w / 2 - side * (w / 2 - radius - 2), h / 2 + side * 0.04 * h])
            velocity = np.array([side * speed, side * 0.1 * speed])
        elif k == 2:  # the one that leaves: out through a side, back the same way
            side = 1 if rng.random() < 0.5 else -1
            position = np.array([w / 2 + side * rng.uniform(0, 0.3) * w, rng.uniform(0.25, 0.75) * h])
            velocity = np.array([side * speed, rng.uniform(-0.1, 0.1) * speed])
        elif k == 3:  # in view from the start, anywhere clear of the others
            position = _clear_spot(rng, radius, objects, w, h)
            angle = rng.uniform(0, 2 * np.pi)
            velocity = speed * np.array([np.cos(angle), np.sin(angle)])
        else:  # enters later through a side, across the frame
            start = int(rng.integers(1, max(int(spec.frames * 0.6), 2)))
            position, velocity = _entry(rng, radius, speed, w, h)
        objects.append(_Object(int(rng.integers(0, len(CLASSES))), COLOURS[colours[k % len(COLOURS)]], radius,
                               position, velocity, start, leaves=k == 2))
    return objects


def _entry(rng: np.random.Generator, radius: float, speed: float, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Just outside a random side of the frame, heading across it."""
    side = int(rng.integers(0, 4))
    along = rng.uniform(0.25, 0.75)
    angle = rng.uniform(-0.5, 0.5)
    inward = [np.array([1.0, 0.0]), np.array([-1.0, 0.0]), np.array([0.0, 1.0]), np.array([0.0, -1.0])][side]
    position = [np.array([-radius, along * h]), np.array([w + radius, along * h]), np.array([along * w, -radius]),
                np.array([along * w, h + radius])][side]
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return position, speed * turn @ inward


def _clear_spot(rng: np.random.Generator, radius: float, objects: list[_Object], w: int, h: int) -> np.ndarray:
    """A place in the frame at least 6 pixels clear of every object so far (the last try when none is)."""
    for _ in range(100):
        position = np.array([rng.uniform(radius + 2, w - radius - 2), rng.uniform(radius + 2, h - radius - 2)])
        if all(np.hypot(*(position - o.position)) > radius + o.radius + 6 for o in objects):
            break
    return position


def _step(obj: _Object, spec: SceneSpec, t: int) -> None:
    """One frame of motion in the world. An object that has crossed the frame is gone; the leaving one turns back
    once, when it is a little beyond the frame's edge."""
    if t <= obj.start or obj.gone:
        return
    obj.position = obj.position + obj.velocity
    view = np.array([spec.shake, spec.shake])  # the frame's mean place: the wobble turns nothing
    low = view - obj.radius - 4
    high = view + np.array([spec.width, spec.height]) + obj.radius + 4
    outside = (obj.position < low) & (obj.velocity < 0) | (obj.position > high) & (obj.velocity > 0)
    if outside.any() and obj.leaves:
        obj.velocity = np.where(outside, -obj.velocity, obj.velocity)
        obj.leaves = False
    elif outside.any():
        obj.gone = True


def _draw(mask_or_image: np.ndarray, obj: _Object, centre: np.ndarray, value: tuple | int) -> None:
    x, y, r = float(centre[0]), float(centre[1]), obj.radius
    if obj.cls == 0:
        cv2.circle(mask_or_image, (round(x), round(y)), round(r), value, -1, cv2.LINE_8)
        return
    if obj.cls == 1:
        points = [(x - 0.85 * r, y - 0.85 * r), (x + 0.85 * r, y - 0.85 * r), (x + 0.85 * r, y + 0.85 * r),
                  (x - 0.85 * r, y + 0.85 * r)]
    else:
        points = [(x, y - r), (x + 0.95 * r, y + 0.75 * r), (x - 0.95 * r, y + 0.75 * r)]
    cv2.fillPoly(mask_or_image, [np.round(np.array(points)).astype(np.int32)], value, cv2.LINE_8)


def _frame(spec: SceneSpec, world: np.ndarray, objects: list[_Object], t: int,
           pillar_x: float) -> tuple[np.ndarray, np.ndarray]:
    """The view at frame ``t`` and its truth rows (objects nearer the camera later in ``objects``)."""
    left, top = spec.view(t)
    corner = np.array([left, top], np.float64)
    background = world[top:top + spec.height, left:left + spec.width]
    image = background.copy()
    pad = int(max(o.radius for o in objects) * 2 + 4)
    covered = np.zeros((spec.height, spec.width), bool)
    x1 = int(round(pillar_x - left))
    x2 = x1 + int(PILLAR_WIDTH * spec.width)
    if spec.pillar:
        covered[:, max(x1, 0):max(x2, 0)] = True
    rows = []
    for track_id in range(len(objects), 0, -1):  # nearest first: what it covers is hidden from those behind
        obj = objects[track_id - 1]
        if t < obj.start or obj.gone:
            continue
        centre = obj.position - corner
        whole = np.zeros((spec.height + 2 * pad, spec.width + 2 * pad), np.uint8)
        _draw(whole, obj, centre + pad, 1)
        inside = whole[pad:pad + spec.height, pad:pad + spec.width].astype(bool)
        seen = inside & ~covered
        share = seen.sum() / max(int(whole.sum()), 1)
        if share > 0:  # its whole box (as MOT's ground truth has them), clipped to the frame
            ys, xs = np.nonzero(inside)
            rows.append([track_id, xs.min(), ys.min(), xs.max() + 1, ys.max() + 1, obj.cls, share])
        covered |= inside
    for obj in objects:  # painted farthest first
        if t >= obj.start and not obj.gone:
            _draw(image, obj, obj.position - corner, obj.colour)
    if spec.pillar:
        image[:, max(x1, 0):max(x2, 0)] = background[:, max(x1, 0):max(x2, 0)] // 3 + 30
    truth = np.array(sorted(rows), np.float64).reshape(-1, 7)
    return image, truth


def make_scene(spec: SceneSpec) -> Scene:
    """The video and its ground truth, the same for the same spec."""
    rng = np.random.default_rng(spec.seed)
    margin = int(np.ceil(2 * spec.shake)) + 2
    world = _background(rng, spec.height + margin, spec.width + margin)
    objects = _objects(spec, rng)
    for obj in objects:  # in the world: where the camera is when they appear
        obj.position = obj.position + np.array(spec.view(obj.start), np.float64)
    pillar_x = float(rng.uniform(0.5, 0.7) * spec.width)
    scene = Scene(spec)
    for t in range(spec.frames):
        image, truth = _frame(spec, world, objects, t, pillar_x)
        scene.frames.append(image)
        scene.truth.append(truth)
        for obj in objects:
            _step(obj, spec, t + 1)
    return scene


def scored(truth: np.ndarray) -> np.ndarray:
    """The rows of a frame's truth that are scored: objects seen at least MIN_VISIBLE."""
    return truth[truth[:, 6] >= MIN_VISIBLE]


def jittered_detections(scene: Scene, seed: int = 0, jitter: float = 0.03, miss: float = 0.02,
                        false_rate: float = 0.1) -> list[np.ndarray]:
    """The truth as a detector's rows (k, 6) per frame: each box's corners moved by Gaussian noise of ``jitter``
    times its size, ``miss`` of them dropped, a false box in ``false_rate`` of the frames; confidences 0.6-0.95,
    0.12-0.6 for objects less than 70 % visible (some below 0.25: the low-score detections ByteTrack's second stage
    takes)."""
    rng = np.random.default_rng(seed)
    out = []
    for truth in scene.truth:
        rows = []
        for _, x1, y1, x2, y2, cls, share in scored(truth):
            if rng.random() < miss:
                continue
            size = np.array([x2 - x1, y2 - y1, x2 - x1, y2 - y1])
            box = np.array([x1, y1, x2, y2]) + rng.normal(0, jitter, 4) * size
            conf = rng.uniform(0.6, 0.95) if share >= 0.7 else rng.uniform(0.12, 0.6)
            rows.append([*box, conf, cls])
        if rng.random() < false_rate:
            x, y, s = rng.uniform(0, scene.spec.width - 16), rng.uniform(0, scene.spec.height - 16), rng.uniform(8, 16)
            rows.append([x, y, x + s, y + s, rng.uniform(0.1, 0.5), rng.integers(0, len(CLASSES))])
        out.append(np.array(rows, np.float64).reshape(-1, 6))
    return out


def write_training_set(folder: Path, seeds: list[int], frames: tuple[int, ...] = (30,), **spec: object) -> Path:
    """Frames ``frames`` of the scenes of ``seeds`` (a still camera for even seeds, a shaking one for odd ones) as
    a YOLO data set (train = val); the data YAML's path."""
    for split in ("images", "labels"):
        (folder / split).mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        scene = make_scene(SceneSpec(seed=seed, shake=SHAKE if seed % 2 else 0.0, **spec))
        for t in frames:
            stem = f"s{seed}_{t:04d}"
            cv2.imwrite(str(folder / "images" / f"{stem}.png"), scene.frames[t])
            h, w = scene.frames[t].shape[:2]
            lines = [f"{int(c)} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
                     for _, x1, y1, x2, y2, c, _ in scored(scene.truth[t])]
            (folder / "labels" / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
    data = {"path": str(folder), "train": "images", "val": "images", "nc": len(CLASSES), "names": list(CLASSES)}
    (folder / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "data.yaml"


def _sequence_data(truth: list[np.ndarray], tracks: list[np.ndarray]) -> dict:
    """TrackEval's per-sequence input: per frame the scored ground-truth and tracker IDs (renumbered from 0) and
    their IoU matrix. ``truth`` rows are (id, x1, y1, x2, y2, cls, share seen), ``tracks`` rows (id, x1, y1, x2, y2).
    As MOTChallenge's preprocessing does, a track box paired (IoU >= 0.5, one to one) with an ignored object (seen
    less than MIN_VISIBLE) is removed before scoring."""
    from utils.tracking.matching import assign, iou_matrix

    kept_truth, kept_tracks = [], []
    for gt, tr in zip(truth, tracks):
        pairs, _, _ = assign(1.0 - iou_matrix(gt[:, 1:5], tr[:, 1:5]), 0.5)
        ignored = {int(j) for i, j in pairs if gt[i, 6] < MIN_VISIBLE}
        kept_truth.append(scored(gt))
        kept_tracks.append(tr[[j for j in range(len(tr)) if j not in ignored]])
    gt_ids = np.unique(np.concatenate([t[:, 0] for t in kept_truth])) if kept_truth else np.zeros(0)
    tr_ids = np.unique(np.concatenate([t[:, 0] for t in kept_tracks])) if kept_tracks else np.zeros(0)
    gt_index = {v: i for i, v in enumerate(gt_ids.tolist())}
    tr_index = {v: i for i, v in enumerate(tr_ids.tolist())}
    data = {"num_timesteps": len(truth), "num_gt_ids": len(gt_ids), "num_tracker_ids": len(tr_ids),
            "gt_ids": [], "tracker_ids": [], "similarity_scores": [], "num_gt_dets": 0, "num_tracker_dets": 0}
    for gt, tr in zip(kept_truth, kept_tracks):
        data["gt_ids"].append(np.array([gt_index[v] for v in gt[:, 0].tolist()], int))
        data["tracker_ids"].append(np.array([tr_index[v] for v in tr[:, 0].tolist()], int))
        data["similarity_scores"].append(iou_matrix(gt[:, 1:5], tr[:, 1:5]))
        data["num_gt_dets"] += len(gt)
        data["num_tracker_dets"] += len(tr)
    return data


def mot_metrics(sequences: dict[str, tuple[list[np.ndarray], list[np.ndarray]]]) -> dict[str, float]:
    """HOTA, IDF1, MOTA and ID switches over ``sequences`` (name -> (truth per frame, tracks per frame)), by
    TrackEval's metric classes, combined over the sequences as TrackEval combines them."""
    from trackeval.metrics import CLEAR, HOTA, Identity

    quiet = {"PRINT_CONFIG": False}
    metrics = {"HOTA": HOTA(quiet), "Identity": Identity({**quiet, "THRESHOLD": 0.5}),
               "CLEAR": CLEAR({**quiet, "THRESHOLD": 0.5})}
    combined = {}
    for name, metric in metrics.items():
        per_sequence = {seq: metric.eval_sequence(_sequence_data(*pair)) for seq, pair in sequences.items()}
        combined[name] = metric.combine_sequences(per_sequence)
    return {"HOTA": float(np.mean(combined["HOTA"]["HOTA"])), "DetA": float(np.mean(combined["HOTA"]["DetA"])),
            "AssA": float(np.mean(combined["HOTA"]["AssA"])), "IDF1": float(combined["Identity"]["IDF1"]),
            "MOTA": float(combined["CLEAR"]["MOTA"]), "IDSW": int(combined["CLEAR"]["IDSW"])}


def read_mot_file(path: Path, frames: int) -> list[np.ndarray]:
    """A MOT-challenge file (frame,id,x,y,w,h,conf,...) as per-frame rows (id, x1, y1, x2, y2) for ``frames``."""
    out = [[] for _ in range(frames)]
    for line in Path(path).read_text().splitlines():
        frame, track_id, x, y, w, h = (float(v) for v in line.split(",")[:6])
        out[int(frame) - 1].append([track_id, x, y, x + w, y + h])
    return [np.array(rows, np.float64).reshape(-1, 5) for rows in out]


def write_scene_video(scene: Scene, path: Path, fps: float = 30.0) -> Path:
    """The scene as an mp4 (mp4v), what detect.py reads."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (scene.spec.width, scene.spec.height))
    for frame in scene.frames:
        writer.write(frame)
    writer.release()
    return path


def scene_specs(count: int, pillar: bool = False, **spec: object) -> list[SceneSpec]:
    """The benchmark's and the tests' scenes: seeds 0..count-1, a still camera for even seeds, a shaking one for odd."""
    return [SceneSpec(seed=seed, shake=SHAKE if seed % 2 else 0.0, pillar=pillar, **spec) for seed in range(count)]


def train_detector(folder: Path, images: int = 16, epochs: int = 120, img_size: int = 160) -> Path:
    """A one-class YOLOv5n trained from scratch on frame 30 of ``images`` scenes none of scene_specs' (seeds from
    100): the batch holds every image, so each epoch is one optimizer step of the whole set (under a minute of one CPU
    core at the defaults). Returns its last.pt."""
    import train

    data = write_training_set(folder / "data", list(range(100, 100 + images)))
    hyp = load_yaml(ROOT / "data" / "hyps" / "hyp.synthetic.yaml")
    hyp.update(lr0=0.01, warmup_epochs=0, hsv_h=0, hsv_s=0, hsv_v=0, scale=0.2, mosaic=0)
    (folder / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    result = train.run(data=str(data), cfg="yolov5n.yaml", hyp=str(folder / "hyp.yaml"), weights="", single_cls=True,
                       img_size=img_size, batch_size=64, epochs=epochs, workers=0, device="cpu", amp="off", seed=0,
                       project=str(folder / "runs"), name="detector", noautoanchor=True, noplots=True, noval=True,
                       nosave=True)
    return result.save_dir / "weights" / "last.pt"
