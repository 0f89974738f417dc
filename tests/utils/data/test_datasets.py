"""The YOLO data set: samples and their contract, --rect shapes, image formats, EXIF, duplicates, image caches."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import GOOD_LABEL, make_set, png_writer, write_jpg
from utils.data.config import DataError, load_data_config
from utils.data.datasets import YoloDataset, bgr_to_chw_rgb, resized_shape
from utils.data.ram_cache import shm_dir


def test_16bit_and_gray_png_load_as_8bit_3_channels(tmp_path: Path) -> None:
    images = make_set(tmp_path, {"g.png": (png_writer(1), None), "d.png": (png_writer(3, np.uint16), None)})
    ds = YoloDataset(images, img_size=36)
    for i in range(2):
        img = ds.load_image(i)[0]
        assert img.dtype == np.uint8 and img.shape == (30, 36, 3) and img.max() > 100


def test_exif_orientation_swaps_the_size(tmp_path: Path) -> None:
    def rotated(path: Path) -> None:
        exif = Image.Image.getexif(Image.new("RGB", (1, 1)))
        exif[0x0112] = 6  # rotate 90 degrees on display
        Image.fromarray(np.zeros((20, 50, 3), np.uint8)).save(path, exif=exif)

    ds = YoloDataset(make_set(tmp_path, {"r.jpg": (rotated, GOOD_LABEL)}), img_size=50, nc=3)
    assert ds.shapes[0].tolist() == [20, 50]  # (w, h) after rotation
    assert ds.load_image(0)[0].shape[:2] == (50, 20)


def test_duplicate_rows_are_dropped(tmp_path: Path) -> None:
    label = "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n2 0.3 0.3 0.1 0.1\n"
    ds = YoloDataset(make_set(tmp_path, {"a.jpg": (write_jpg, label)}), img_size=64, nc=3)
    assert np.allclose(ds.labels[0], [[1, 0.5, 0.5, 0.2, 0.2], [2, 0.3, 0.3, 0.1, 0.1]])
    assert "1 duplicate labels removed" in ds.scan.warnings[0]


def test_all_corrupt_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no usable images"):
        YoloDataset(make_set(tmp_path, {"a.jpg": (lambda p: p.write_bytes(b""), None)}), img_size=64)


def test_sample_contract_and_rect_shapes(tiny_dataset: Path) -> None:
    config = load_data_config(tiny_dataset)
    ds = YoloDataset(config.val, img_size=96, batch_size=4, rect=True, pad=0.5, nc=3)
    img, targets, path, ((h0, w0), ((rh, rw), (pw, ph))) = ds[0]
    assert img.shape[0] == 3 and img.shape[1] % 32 == 0 and img.shape[2] % 32 == 0
    assert targets.shape[1] == 6 and (targets[:, 0] == 0).all() and len(targets) == len(ds.labels[0])
    assert path == ds.im_files[0] and (h0, w0) == (int(ds.shapes[0][1]), int(ds.shapes[0][0]))
    ratios = ds.shapes[:, 1] / ds.shapes[:, 0]
    assert (np.diff(ratios) >= 0).all()  # sorted by aspect ratio
    batch = YoloDataset.collate_fn([ds[i] for i in range(4)])
    assert batch[0].shape[0] == 4 and batch[0].dtype == torch.uint8
    assert batch[1][:, 0].tolist() == sorted(batch[1][:, 0].tolist())


def test_image_caches_give_the_same_pixels(tmp_path: Path) -> None:
    images = make_set(tmp_path, {f"{i}.jpg": (write_jpg, GOOD_LABEL) for i in range(3)})
    plain = YoloDataset(images, img_size=64, nc=3)
    ram = YoloDataset(images, img_size=64, nc=3, cache="ram")
    disk = YoloDataset(images, img_size=64, nc=3, cache="disk")
    assert ram.ram is not None and len(ram.ram) == 3 and disk.ram is None and plain.ram is None
    assert not list(shm_dir().glob(f"yolo-ram-{os.getpid()}-*"))  # mapped, and its name already removed
    assert not list(images.glob("*.npy"))  # never beside the user's images ...
    npy = sorted((tmp_path / "labels" / "train.cache.d" / "npy").glob("*.npy"))  # ... but in the cache folder
    assert [p.name.split("-")[0] for p in npy] == ["0", "1", "2"]
    for i in range(3):
        assert torch.equal(plain[i][0], ram[i][0]) and torch.equal(plain[i][0], disk[i][0])
    np.save(npy[1], np.zeros((40, 48, 3), np.uint8))  # a damaged cache entry ...
    os.utime(npy[1], ns=(0, 0))  # ... older than its image is ignored
    assert torch.equal(disk[1][0], plain[1][0])


def test_quad_batches_tile_four_images_with_their_boxes(tmp_path: Path) -> None:
    def white_box(path: Path) -> None:
        image = np.zeros((64, 64, 3), np.uint8)
        image[16:48, 8:40] = 255
        import cv2

        cv2.imwrite(str(path), image)

    images = make_set(tmp_path, {f"{i}.png": (white_box, "0 0.375 0.5 0.5 0.5\n") for i in range(4)})
    ds = YoloDataset(images, img_size=64, nc=3)
    tiles = 0
    for seed in range(6):  # both outcomes: one image upscaled, or the four tiled
        ds.rng = np.random.default_rng(seed)
        imgs, targets, paths, _ = ds.collate_quad([ds[i] for i in range(4)])
        assert imgs.shape == (1, 3, 128, 128) and len(paths) == 1 and (targets[:, 0] == 0).all()
        tiles += len(targets) == 4
        for _, _, cx, cy, w, h in targets.tolist():  # every box covers white pixels only
            x1, y1, x2, y2 = (int(round(v * 128)) for v in (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
            assert imgs[0, :, y1 + 1:y2 - 1, x1 + 1:x2 - 1].min() == 255
    assert 0 < tiles < 6
    with pytest.raises(DataError, match="divisible by 4"):
        ds.collate_quad([ds[i] for i in range(3)])


def test_mosaic_sources_are_originals_with_load_image_sizes(tmp_path: Path) -> None:
    """A mosaic warps small images from the original (no resize first), at the size load_image gives them."""
    from functools import partial

    files = {"small.jpg": (partial(write_jpg, h=37, w=51), GOOD_LABEL), "tall.jpg": (partial(write_jpg, h=61, w=23),
             GOOD_LABEL), "big.jpg": (partial(write_jpg, h=90, w=120), GOOD_LABEL)}
    ds = YoloDataset(make_set(tmp_path, files), img_size=64, augment=True, nc=3)
    for i, name in enumerate(Path(f).name for f in ds.im_files):
        img, hw = ds._mosaic_source(i)
        assert hw == ds.load_image(i)[0].shape[:2] == resized_shape(ds._read(i).shape[:2], 64)
        assert img.shape[:2] == (ds._read(i).shape[:2] if name != "big.jpg" else hw)  # only big ones shrink first


def test_chw_rgb_conversion() -> None:
    """A sample is (3, h, w) RGB over HWC memory, so a batch of them is channels_last."""
    img = np.random.default_rng(0).integers(0, 256, (7, 9, 3), dtype=np.uint8)
    chw = bgr_to_chw_rgb(img)
    assert chw.shape == (3, 7, 9) and chw.permute(1, 2, 0).is_contiguous()
    assert np.array_equal(chw.numpy(), img[:, :, ::-1].transpose(2, 0, 1))


def test_batches_are_channels_last_with_the_same_pixels(tiny_dataset: Path) -> None:
    """collate_fn writes NHWC memory (a float cast is then one pass in order); the pixels and the padding are those
    of the samples, whatever their layout, also in a DataLoader worker's shared memory."""
    ds = YoloDataset(load_data_config(tiny_dataset).val, img_size=96, batch_size=4, rect=True, pad=0.5, nc=3)
    samples = [ds[i] for i in range(4)]
    for batch in (YoloDataset.collate_fn(samples), next(iter(torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=1, collate_fn=YoloDataset.collate_fn)))):
        imgs = batch[0]
        assert imgs.is_contiguous(memory_format=torch.channels_last) and imgs.dtype == torch.uint8
        for i, (img, *_) in enumerate(samples):
            h, w = img.shape[1:]
            assert torch.equal(imgs[i, :, :h, :w], img) and (imgs[i, :, h:] == 114).all()
    assert not ds.npy_cached  # no --cache disk folder: no image looks for a .npy


# ------------------------------------------------------------------------------------------ segment samples
def _segment_set(tmp_path: Path, n_train: int = 8) -> object:
    import yaml

    data = tmp_path / "seg.yaml"
    data.write_text(yaml.safe_dump({"synthetic": {"task": "segment", "n_train": n_train, "n_val": 4,
                                                  "img_size": [64, 80]},
                                    "path": str(tmp_path / "set"), "train": "images/train", "val": "images/val",
                                    "nc": 3, "names": ["circle", "square", "triangle"]}))
    return load_data_config(data)


def test_segment_batches_carry_index_masks_in_the_targets_order(tmp_path: Path) -> None:
    from utils.hyp import load_hyp
    from utils.tasks.segment.masks import polygons_to_masks

    cfg = _segment_set(tmp_path)
    hyp = {**load_hyp(), "mixup": 0.5, "copy_paste": 0.5, "degrees": 10.0, "flipud": 0.5}
    ds = YoloDataset(cfg.train, img_size=64, augment=True, hyp=hyp, task="segment", nc=3)
    imgs, targets, _, _, extras = ds.collate_fn([ds[(i, (0, 0, i))] for i in range(8)])
    masks = extras["masks"]
    assert masks.shape == (8, 16, 16) and "outlines" not in extras  # 1/4 of 64; outlines only for validation
    with pytest.raises(DataError, match="--quad is for detection"):
        ds.collate_quad([ds[i] for i in range(4)])
    for image in range(8):
        rows = targets[targets[:, 0] == image]
        assert int(masks[image].max()) == len(rows) > 0
        areas = [int((masks[image] == r + 1).sum()) for r in range(len(rows))]
        for r, (_, _, cx, cy, w, h) in enumerate(rows.tolist()):
            ys, xs = np.nonzero((masks[image] == r + 1).numpy())
            if len(xs):  # each object's pixels lie inside its box (boxes come from the moved outlines)
                assert xs.min() + 0.5 >= (cx - w / 2) * 16 - 1e-4 and xs.max() + 0.5 <= (cx + w / 2) * 16 + 1e-4
                assert ys.min() + 0.5 >= (cy - h / 2) * 16 - 1e-4 and ys.max() + 0.5 <= (cy + h / 2) * 16 + 1e-4
        assert sum(areas) == int((masks[image] > 0).sum())
    # validation: the outlines come back in the targets' order and fill the index image's pixels
    val = YoloDataset(cfg.val, img_size=64, rect=True, batch_size=4, stride=32, pad=0.5, task="segment", nc=3)
    imgs, targets, _, _, extras = val.collate_fn([val[i] for i in range(4)])
    h, w = imgs.shape[2:]
    for image, outlines in enumerate(extras["outlines"]):
        filled = polygons_to_masks(list(outlines * (w, h)), (h, w), 4)
        index = extras["masks"][image].numpy()
        assert len(outlines) == int((targets[:, 0] == image).sum()) == index.max()
        for r, mask in enumerate(filled):
            assert ((index == r + 1) <= mask.astype(bool)).all()  # on top of what its outline fills


def test_segment_scan_caches_the_outlines_beside_the_box_cache(tmp_path: Path) -> None:
    from utils.data.label_cache import cached_scan, img2label_paths, list_image_files
    from utils.tasks.segment.labels import check_segment_sample

    cfg = _segment_set(tmp_path)
    first = YoloDataset(cfg.train, img_size=64, task="segment", nc=3)
    files = list_image_files(cfg.train)
    cached, path = cached_scan(files, img2label_paths(files), 3, check=check_segment_sample, kind="segments")
    assert path.name == "train.segments.cache" and path.is_file()
    assert [len(s) for s in cached.extras] == [len(lab) for lab in first.labels]
    for image, outlines in enumerate(cached.extras):
        for outline, kept in zip(outlines, first.extras[image]):
            assert outline.shape[1] == 2 and len(outline) >= 3 and np.array_equal(outline, kept)
    with pytest.raises(DataError, match="unknown task"):
        YoloDataset(cfg.train, img_size=64, task="keypoints", nc=3)
    from utils.data.annotations import AnnotationSplit

    voc = AnnotationSplit("voc", tmp_path / "Annotations", tmp_path / "JPEGImages")
    with pytest.raises(DataError, match="voc annotations hold no outlines; a segmenter needs them"):
        YoloDataset([voc], img_size=64, task="segment", nc=3)


def test_coco_json_outlines_train_a_segmenter(tmp_path: Path) -> None:
    """A coco: split read by a segmenter: polygons (parts joined), RLE masks (traced), boxes without an outline
    (their box), crowd annotations left out; a malformed segmentation makes its image corrupt; a second scan reads
    the outlines from the split's own cache."""
    import json

    from utils.data.annotations import AnnotationSplit
    from utils.tasks.segment.masks import polygons_to_masks, rle_encode

    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b.jpg"):
        write_jpg(images / name)  # 48 x 40
    rle_mask = np.zeros((40, 48), np.uint8)
    rle_mask[10:20, 30:44] = 1
    part1, part2 = [2, 2, 12, 2, 12, 12, 2, 12], [20, 20, 28, 20, 28, 30]
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 26, 28], "segmentation": [part1, part2]},
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [30, 10, 14, 10],
         "segmentation": rle_encode(rle_mask[None])[0]},
        {"id": 3, "image_id": 1, "category_id": 3, "bbox": [5, 25, 10, 10]},
        {"id": 4, "image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "iscrowd": 1,
         "segmentation": rle_encode(rle_mask[None])[0]},
        {"id": 5, "image_id": 2, "category_id": 1, "bbox": [2, 2, 10, 10], "segmentation": [[1, 2, "x", 4, 5, 6]]},
    ]
    (tmp_path / "instances.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 48, "height": 40},
                   {"id": 2, "file_name": "b.jpg", "width": 48, "height": 40}],
        "categories": [{"id": i + 1, "name": n} for i, n in enumerate(("a", "b", "c"))], "annotations": annotations}))
    split = AnnotationSplit("coco", tmp_path / "instances.json", images, names=("a", "b", "c"))
    for _ in range(2):  # scanned, then from the cache
        ds = YoloDataset([split], img_size=48, task="segment", nc=3)
        assert ds.scan.found == 1 and ds.scan.corrupt == 1 and [len(s) for s in ds.extras] == [3]
        joined, traced, box = ds.extras[0]
        masks = polygons_to_masks([o * (48, 40) for o in (joined, traced, box)], (40, 48))
        parts = polygons_to_masks([np.reshape(part1, (-1, 2)), np.reshape(part2, (-1, 2))], (40, 48)).max(0)
        assert (masks[0] == parts).all() and (masks[1] == rle_mask).all() and masks[2].sum() == 100
    assert (tmp_path / "instances.all.segments.cache").is_file()
    assert any("bad segmentation" in w for w in ds.scan.warnings)


def _photo(path: Path, h: int, w: int) -> None:
    """A JPEG with smooth content and edges (a photo more than noise), ``h`` x ``w``."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (w + h)], -1).astype(np.uint8)
    img[h // 4:h // 2, w // 3:w // 2] = (30, 200, 90)
    cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 95])


def test_large_jpegs_decode_reduced_within_two_levels_of_the_whole_decode(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A JPEG at least twice as large as the training size is decoded at 1/2, 1/4 or 1/8 of its sides (libjpeg's
    DCT scaling) and then resized: within 2 levels on average of decoding it whole and resizing (validation's
    INTER_AREA and training's INTER_LINEAR); the sizes and shapes are those of the whole decode."""
    from functools import partial

    from utils.data import datasets as module
    from utils.data.image_io import reduction

    assert [reduction(s, 64) for s in (64, 127, 128, 255, 256, 511, 512, 4000)] == [1, 1, 2, 2, 4, 4, 8, 8]
    images = make_set(tmp_path, {"big.jpg": (partial(_photo, h=300, w=520), GOOD_LABEL),
                                 "small.jpg": (partial(_photo, h=90, w=100), GOOD_LABEL)})
    asked = []
    whole = module.read_image
    for augment in (False, True):
        ds = YoloDataset(images, img_size=64, augment=augment, nc=3)
        monkeypatch.setattr(module, "read_image", lambda path, reduce=1: asked.append(reduce) or whole(path, reduce))
        reduced = [ds.load_image(i) for i in range(2)]
        monkeypatch.setattr(module, "read_image", lambda path, reduce=1: whole(path))
        plain = [ds.load_image(i) for i in range(2)]
        for (a, hw0_a, hw_a), (b, hw0_b, hw_b) in zip(reduced, plain):
            assert a.shape == b.shape and hw0_a == hw0_b and hw_a == hw_b
            assert np.abs(a.astype(int) - b.astype(int)).mean() < 2.0
    assert sorted(asked) == [1, 1, 8, 8]  # 520 px at 64: an eighth (65 px); 100 px: whole
