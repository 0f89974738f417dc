"""TensorFlow SavedModel: ``<stem>_saved_model/`` written by tf.saved_model.save from our own translation of the
model (utils/deploy/tf_graph.py), NHWC input, the metadata as a saved asset (assets/metadata.json); run by
TensorFlow itself (the LiteRT runtime runs .tflite files only).

A SavedModel's graph may hold any TensorFlow op, file I/O included (``tf.io.write_file`` in its serving function
writes wherever the user can), so running one is running its code: like TorchScript, it loads only with
``--trust-weights`` (``trusted``). Its metadata asset must lie inside its folder."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from utils.deploy.formats import (
    MAX_METADATA_TEXT,
    ExportFormat,
    ExportOptions,
    FormatError,
    LoadedModel,
    LoadOptions,
    first_line,
    parse_json_metadata,
    require,
)
from utils.deploy.tf_graph import TENSORFLOW, import_tensorflow, nhwc_array, tf_module
from utils.log import LOGGER
from utils.paths import confined
from utils.weights.untrusted import UntrustedFileError

METADATA_ASSET = "metadata.json"


def set_tf_threads(tf: object, threads: int) -> None:
    """TensorFlow's intra-op threads; it accepts them only before its first operation, so a later request keeps
    the setting it started with (and says so)."""
    if threads and tf.config.threading.get_intra_op_parallelism_threads() != threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:  # TensorFlow already initialised in this process
            LOGGER.warning(f"WARNING: TensorFlow already runs in this process; SavedModels keep its first thread "
                           f"setting ({tf.config.threading.get_intra_op_parallelism_threads() or 'all'}), "
                           f"not {threads}")


class SavedModelFormat(ExportFormat):
    """``best_saved_model/``: FP32, fixed input shape (b, h, w, 3), output (b, n, columns) as the .pt's."""

    name = "saved_model"
    suffix = "_saved_model"
    is_folder = True
    export_packages = runtime_packages = TENSORFLOW

    def export(self, model: nn.Module, images: torch.Tensor, file: Path, meta: dict, options: ExportOptions,
               calibration: Callable[[], list[torch.Tensor]] | None = None) -> Path:
        tf = import_tensorflow()
        b, _, h, w = images.shape
        module = tf_module(tf, model, (b, h, w, 3))
        with tempfile.TemporaryDirectory() as scratch:
            meta_file = Path(scratch) / METADATA_ASSET
            meta_file.write_text(json.dumps(meta))
            module.metadata_file = tf.saved_model.Asset(str(meta_file))  # copied into <folder>/assets/
            tf.saved_model.save(module, str(file), signatures={"serving_default": module.serve.get_concrete_function()})
        return file

    def load(self, file: Path, options: LoadOptions) -> LoadedModel:
        if not options.trusted:
            raise UntrustedFileError(f"{file} is a TensorFlow SavedModel, and running one runs its graph, whose ops "
                                     "can read and write any file; pass --trust-weights only for a file you trust, or "
                                     "use the .tflite or .onnx export")
        require(self.runtime_packages, f"running {file.name}")
        tf = import_tensorflow()
        set_tf_threads(tf, options.threads)
        try:
            loaded = tf.saved_model.load(str(file.resolve()))  # asset paths come back as the folder was named
            serve = loaded.signatures["serving_default"]
            asset = confined(loaded.metadata_file.asset_path.numpy().decode(), file, "its metadata asset", FormatError)
            if not asset.is_file() or asset.stat().st_size > MAX_METADATA_TEXT:
                raise FormatError(f"its metadata asset {asset.name} is not a file of at most {MAX_METADATA_TEXT} bytes")
            meta = parse_json_metadata(asset.read_bytes(), file)
        except (OSError, ValueError, KeyError, AttributeError, RuntimeError) as e:
            raise FormatError(f"{file} is not a readable SavedModel of this project ({first_line(e)}); re-export "
                              "it with export.py --include saved_model") from None
        spec = serve.structured_input_signature[1]["images"]
        b, h, w, _ = spec.shape.as_list()
        output_names = sorted(serve.structured_outputs)  # output_0: the rows; output_1: a segmenter's prototypes

        def run(images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
            found = serve(images=tf.constant(nhwc_array(images)))
            parts = [torch.from_numpy(np.asarray(found[name].numpy())) for name in output_names]
            if len(parts) == 1:
                return parts[0]
            return parts[0], *(part.permute(0, 3, 1, 2) for part in parts[1:])  # prototypes NHWC -> NCHW

        return LoadedModel(run, meta if isinstance(meta, dict) else {}, [b, 3, h, w])


FORMAT = SavedModelFormat()
