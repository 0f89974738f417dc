"""A classifier in the export formats (the classify task's ``export`` part): the Classify head's TensorFlow
translation, registered with utils/deploy/tf_graph.py when this module is imported (SavedModel, TFLite). The other
formats carry the (b, nc) probabilities by the output contract alone; a classifier has no raw-map (INT8) form."""

from __future__ import annotations

from typing import Any

from utils.deploy.formats import FormatError
from utils.deploy.tf_graph import Layer, Translator, register_translation
from utils.tasks.classify.head import Classify


def classify(translator: Translator, module: Classify) -> Layer:
    """The 1x1 Conv (a list of sources concatenated first), the global average, the linear layer, the softmax."""
    if translator.raw_maps:
        raise FormatError("a classifier's TensorFlow export has no raw-map (INT8) form; export it in float")
    tf, conv = translator.tf, translator.translate(module.conv)
    weight = translator.constant(module.linear.weight.detach().float().cpu().numpy().T)  # (1280, nc)
    bias = translator.constant(module.linear.bias.detach().float().cpu().numpy())

    def run(x: Any) -> Any:
        x = tf.concat(list(x), -1) if isinstance(x, (list, tuple)) else x
        pooled = tf.reduce_mean(conv(x), axis=[1, 2])  # (b, 1280)
        return tf.nn.softmax(tf.matmul(pooled, weight) + bias, -1)
    return run


register_translation(Classify, classify)
