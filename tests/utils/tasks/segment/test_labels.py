"""utils/tasks/segment/labels.py:
YOLO segment rows and COCO outlines read and checked like boxes, parts joined, RLE kept
and checked, outlines stored without pickles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from utils.data.coco_json import coco_entries
from utils.data.label_cache import pack_points as pack_segments
from utils.data.label_cache import unpack_points as unpack_segments
from utils.tasks.segment.labels import (
    MAX_POLYGON_POINTS,
    InstanceSegment,
    _closest_pair,
    _loop,
    coco_instance_segments,
    coco_segmentation,
    instance_polygon,
    join_parts,
    parse_segment_rows,
    read_segment_label_file,
    segment_rows_text,
)
from utils.tasks.segment.masks import polygon_area, polygons_to_masks, rle_decode, rle_encode


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_polygon_rows_get_the_outlines_extent_and_box_rows_stay_boxes() -> None:
    parsed = parse_segment_rows(rows("""
        1 0.1 0.2 0.5 0.2 0.3 0.6
        0 0.5 0.5 0.2 0.4
        2 0.9 0.9 1.0004 0.95 0.95 1.0
    """), nc=3)
    assert parsed.labels.dtype == np.float32 and parsed.labels.shape == (3, 5)
    assert np.allclose(parsed.labels[0], [1, 0.3, 0.4, 0.4, 0.4])
    assert np.allclose(parsed.labels[1], [0, 0.5, 0.5, 0.2, 0.4]) and parsed.segments[1] is None
    assert np.allclose(parsed.segments[0], [[0.1, 0.2], [0.5, 0.2], [0.3, 0.6]])
    assert parsed.segments[2].max() == 1.0  # 1.0004 is within the tolerance: clipped, as box coordinates are
    assert parsed.duplicates == 0 and parsed.note == ""


def test_repeated_rows_are_removed_once_and_counted() -> None:
    parsed = parse_segment_rows(rows("""
        1 0.1 0.2 0.5 0.2 0.3 0.6
        1 0.1 0.2 0.5 0.2 0.3 0.6
        1 0.1 0.2 0.5 0.2 0.3 0.6 0.1 0.6
    """), nc=None)
    assert parsed.duplicates == 1 and "1 duplicate labels removed" in parsed.note
    assert len(parsed.segments) == 2 and len(parsed.segments[1]) == 4  # same box, other outline: kept


@pytest.mark.parametrize("text, reason", [
    ("0 0.1 0.2 0.3 0.4 0.5 0.6 0.7", "row 1: a polygon needs x, y pairs, got 7 coordinates"),
    ("0 0.1 0.2 0.3", "row 1: a polygon needs x, y pairs"),
    ("0 0.1 0.2 0.3 0.4 0.5 0.6\n0 0.1 0.2", "row 2: a polygon needs at least 3 points, got 1"),
    ("0 0.1 0.2 0.3 0.4 nan 0.6", "row 1: non-finite polygon coordinates"),
    ("0 0.1 0.2 0.3 0.4 inf 0.6", "row 1: non-finite polygon coordinates"),
    ("0 0.1 0.2 0.3 0.4 1.2 0.6", "row 1: polygon point outside the image"),
    ("0 0.1 -0.01 0.3 0.4 0.2 0.6", "row 1: polygon point outside the image"),
    ("0 0.1 0.2 0.3 x 0.5 0.6", "row 1: non-numeric"),
    ("3 0.1 0.2 0.3 0.4 0.5 0.6", "class label 3 >= nc 3"),
    ("-1 0.1 0.2 0.3 0.4 0.5 0.6", "negative class label"),
    ("0.5 0.1 0.2 0.3 0.4 0.5 0.6", "non-integer class label"),
    ("0 0.1 0.2 0.1 0.4 0.1 0.6", "zero width"),
    ("0", "a class and a box or a polygon"),
    pytest.param("0 " + "0.5 " * 20_002, "a polygon of 10001 points", id="absurd-point-count"),
])
def test_bad_rows_make_the_file_corrupt_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        parse_segment_rows(rows(text), nc=3)


def test_label_files_states_and_the_writer_round_trip(tmp_path: Path) -> None:
    assert read_segment_label_file(tmp_path / "none.txt", 3)[1] == "missing"
    (tmp_path / "empty.txt").write_text("\n  \n")
    assert read_segment_label_file(tmp_path / "empty.txt", 3)[1] == "empty"
    original = parse_segment_rows(rows("1 0.1 0.2 0.5 0.2 0.3 0.6\n0 0.5 0.5 0.2 0.4"), nc=3)
    (tmp_path / "a.txt").write_text(segment_rows_text(original.labels, original.segments))
    again, state = read_segment_label_file(tmp_path / "a.txt", 3)
    assert state == "found" and np.allclose(again.labels, original.labels)
    assert np.allclose(again.segments[0], original.segments[0]) and again.segments[1] is None
    assert (tmp_path / "a.txt").read_text().splitlines()[1] == "0 0.500000 0.500000 0.200000 0.400000"


def square(x: float, y: float, side: float) -> list[float]:
    return [x, y, x + side, y, x + side, y + side, x, y + side]


def test_coco_parts_are_joined_into_one_outline_with_the_same_pixels() -> None:
    parts = [square(5, 5, 10), square(30, 8, 6), square(12, 30, 14)]
    instance = coco_segmentation(parts, 64, 48)
    assert instance.rle is None and instance.dropped == 0
    joined = polygons_to_masks([instance.polygon], (48, 64))[0]
    separate = polygons_to_masks([np.reshape(p, (-1, 2)) for p in parts], (48, 64)).max(0)
    assert (joined == separate).all() and joined.sum() == 100 + 36 + 196
    assert np.isclose(polygon_area(instance.polygon), 100 + 36 + 196)
    single = coco_segmentation([square(1, 2, 3)], 64, 48).polygon
    assert np.allclose(single, np.reshape(square(1, 2, 3), (-1, 2)))
    assert len(join_parts([np.random.default_rng(0).random((5000, 2)), np.random.default_rng(1).random((3000, 2))
                           + 2])) == 5000 + 3000 + 3  # large parts: bridged (sampled); 3 points repeated


def test_coco_degenerate_parts_are_dropped_and_bad_values_refused() -> None:
    instance = coco_segmentation([[1, 1, 5, 5], square(10, 10, 4)], 64, 48)
    assert instance.dropped == 1 and len(instance.polygon) == 4
    only_points = coco_segmentation([[1, 1]], 64, 48)
    assert only_points.empty and only_points.dropped == 1
    assert coco_segmentation([], 64, 48).empty and coco_segmentation(None, 64, 48).empty
    assert coco_segmentation([[0, 0, 64.5, 0, 64.5, 48.5]], 64, 48).polygon.max(0).tolist() == [64, 48]  # < 1 px
    for bad, reason in (([[0, 0, 70, 0, 70, 10]], "outside the image"), ([[0, 0, 5, 0, 5]], "x, y pairs"),
                        ([[0, 0, "5", 0, 5, 5]], "must be numbers"), ([[0, 0, True, 0, 5, 5]], "must be numbers"),
                        ([[0, 0, float("nan"), 0, 5, 5]], "non-finite"), ("abc", "list of polygons"),
                        ([1, 2, 3, 4, 5, 6], "list of polygons")):
        with pytest.raises(ValueError, match=reason):
            coco_segmentation(bad, 64, 48)


def _join_by_nesting(parts: list[np.ndarray]) -> np.ndarray:
    """join_parts as it was (each part wrapped round the path so far: a copy of the whole path per part)."""
    links = [_closest_pair(parts[i], parts[i + 1]) for i in range(len(parts) - 1)]
    entries = [links[0][0], *(entry for _, entry in links)]
    path = _loop(parts[-1], entries[-1])
    for i in range(len(parts) - 2, -1, -1):
        loop = _loop(parts[i], entries[i])
        k = (links[i][0] - entries[i]) % len(parts[i])
        path = np.concatenate((loop[:k + 1], path, loop[k:]))
    return path


@pytest.mark.timeout(60)  # before: 80 s for one annotation
def test_a_polygon_of_120k_parts_is_refused_before_its_parts_are_read_and_joining_is_linear() -> None:
    """A COCO polygon in 120,000 three-point parts cost 80 s (each part copied the joined path so far): the points
    of all parts are counted first (more than MAX_POLYGON_POINTS: the image is corrupt, counted, as a long YOLO row
    is), and parts are joined in one copy, with the same outline as before."""
    rng = np.random.default_rng(0)
    parts = [list(rng.uniform(0, 45, 6)) for _ in range(120_000)]
    with pytest.raises(ValueError, match=f"360000 polygon points in 120000 parts, more than {MAX_POLYGON_POINTS}"):
        coco_segmentation(parts, 64, 48)
    many = [rng.uniform(0, 45, (3, 2)) for _ in range(MAX_POLYGON_POINTS // 3)]
    assert np.array_equal(join_parts(many), _join_by_nesting(many))
    assert len(join_parts(many)) == 3 * len(many) + len(many) * 2 - 1  # each part closed, each bridge walked back
    assert len(coco_segmentation([list(p.ravel()) for p in many], 64, 48).polygon) == len(join_parts(many))


def test_coco_rle_is_kept_checked_and_outlined_on_request() -> None:
    mask = np.zeros((48, 64), np.uint8)
    mask[10:20, 5:25] = 1
    mask[30:40, 40:60] = 1
    rle = rle_encode(mask[None])[0]
    instance = coco_segmentation(rle, 64, 48)
    assert instance.rle is rle and instance.polygon is None
    polygon = instance_polygon(instance, 64, 48)
    assert (polygons_to_masks([polygon], (48, 64))[0] == mask).all()  # both parts, joined
    uncompressed = coco_segmentation({"size": [48, 64], "counts": [100, 20, 48 * 64 - 120]}, 64, 48)
    assert rle_decode(uncompressed.rle).sum() == 20
    with pytest.raises(ValueError, match="differs from the image"):
        coco_segmentation(rle, 48, 64)
    with pytest.raises(ValueError, match="add up to"):
        coco_segmentation({"size": [48, 64], "counts": [10, 5]}, 64, 48)
    assert instance_polygon(InstanceSegment(), 64, 48) is None


def test_coco_outlines_line_up_with_the_boxes_coco_json_reads(tmp_path: Path) -> None:
    images = tmp_path / "images"
    data = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
                   {"id": 2, "file_name": "b.jpg", "width": 32, "height": 32}],
        "categories": [{"id": 3, "name": "x"}, {"id": 7, "name": "y"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 7, "bbox": [5, 5, 10, 10], "segmentation": [square(5, 5, 10)]},
            {"id": 2, "image_id": 1, "category_id": 3, "bbox": [0, 0, 64, 48], "iscrowd": 1,
             "segmentation": {"size": [48, 64], "counts": [0, 48 * 64]}},
            {"id": 3, "image_id": 9, "category_id": 3, "bbox": [1, 1, 2, 2], "segmentation": [square(1, 1, 2)]},
            {"id": 4, "image_id": 1, "category_id": 3, "bbox": [30, 8, 6, 6],
             "segmentation": [[1, 1], square(30, 8, 6)]},
            {"id": 5, "image_id": 2, "category_id": 3, "bbox": [2, 2, 4, 4]},
            {"id": 6, "image_id": 2, "category_id": 7, "bbox": [2, 2, 4, 4], "segmentation": [[0, 0, 99, 0, 5, 5]]},
        ]}
    entries, _, _ = coco_entries(data, tmp_path / "a.json", images)
    by_path = {Path(e.path).name: e for e in entries}
    outlines, note = coco_instance_segments(data)
    first = outlines[1]
    assert len(first) == len(by_path["a.jpg"].boxes) == 2
    for instance, box in zip(first, by_path["a.jpg"].boxes):
        assert np.allclose(instance.polygon.min(0), box[:2]) and np.allclose(instance.polygon.max(0), box[2:])
    assert first[1].dropped == 1
    assert first_crowd_kept(data) == 3
    assert outlines[2][0].empty and isinstance(outlines[2][1], ValueError)  # image 2 is corrupt
    assert "annotation 6" in str(outlines[2][1]) and "outside the image" in str(outlines[2][1])
    assert note == "1 polygon parts of fewer than 3 points dropped; 1 annotations without an outline (boxes only)"


def first_crowd_kept(data: dict) -> int:
    return len(coco_instance_segments(data, keep_crowd=True)[0][1])


def test_outlines_pack_into_plain_arrays() -> None:
    segments = [np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.1]], np.float32), None,
                np.zeros((4, 2), np.float32)]
    points, offsets = pack_segments(segments)
    assert points.shape == (7, 2) and offsets.tolist() == [0, 3, 3, 7]
    back = unpack_segments(points, offsets)
    assert np.array_equal(back[0], segments[0]) and back[1] is None and np.array_equal(back[2], segments[2])
    assert pack_segments([])[1].tolist() == [0] and unpack_segments(*pack_segments([])) == []
    for offsets_bad in ([0, 3, 2, 7], [1, 3, 7], [0, 3, 8], []):
        with pytest.raises(ValueError, match="offsets"):
            unpack_segments(points, np.array(offsets_bad))
