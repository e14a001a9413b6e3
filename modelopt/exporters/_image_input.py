"""An exported graph that takes images as a decoder gives them: uint8 pixels, height x width x channels.

The graph a plan exports to reads the normalised float image, NCHW, as the model does. With ``image_input="uint8"``
its input is ``image`` (uint8, batch x height x width x channels, at the size the model reads) and the graph
normalises it itself with the same operations, in the same order, as the workload (`Workload.prepare`:
``(x / 255 - mean) / std`` in float32), so the normalised tensor, and every answer after it, is the float-input
graph's. The Transpose to NCHW meets the one ONNX Runtime puts in front of its NHWC integer kernels, and its
optimiser removes the pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelopt.errors import ConfigError
from modelopt.exporters.onnx_qdq import tensor_proto

__all__ = ["IMAGE_INPUTS", "check_image_input", "describe_input", "with_uint8_input"]

IMAGE_INPUTS = ("float", "uint8")
INPUT = "input"  # the float graph's input (`modelopt.exporters.onnx`)
IMAGE = "image"


def check_image_input(image_input: str) -> None:
    if image_input not in IMAGE_INPUTS:
        raise ConfigError(f"unknown image_input {image_input!r}; valid: float (normalised NCHW float32, the model's "
                          "own input) or uint8 (HWC pixels as decoded, normalised in the graph)")


def with_uint8_input(model: Any, mean: Sequence[float], std: Sequence[float]) -> Any:
    """`model` (an `onnx.ModelProto` whose input is the normalised image) reading uint8 NHWC pixels instead."""
    from onnx import TensorProto, helper

    graph = model.graph
    old = next((i for i in graph.input if i.name == INPUT), None)
    if old is None or len(old.type.tensor_type.shape.dim) != 4:
        raise ConfigError("a uint8 image input needs a graph whose input is one image batch (NCHW)")
    dims = old.type.tensor_type.shape.dim
    if len(mean) != dims[1].dim_value or len(std) != dims[1].dim_value:
        raise ConfigError(f"the model normalises {len(mean)} channels but reads {dims[1].dim_value}")
    shape = [dims[0].dim_param or dims[0].dim_value, dims[2].dim_value, dims[3].dim_value, dims[1].dim_value]
    per_channel = (1, len(mean), 1, 1)
    graph.initializer.extend([tensor_proto(f"{IMAGE}_255", np.array(255.0, np.float32)),
                              tensor_proto(f"{IMAGE}_mean", np.array(mean, np.float32).reshape(per_channel)),
                              tensor_proto(f"{IMAGE}_std", np.array(std, np.float32).reshape(per_channel))])
    front = [helper.make_node("Transpose", [IMAGE], [f"{IMAGE}_nchw"], perm=[0, 3, 1, 2], name=f"{IMAGE}_nchw"),
             helper.make_node("Cast", [f"{IMAGE}_nchw"], [f"{IMAGE}_float"], to=TensorProto.FLOAT,
                              name=f"{IMAGE}_float"),
             helper.make_node("Div", [f"{IMAGE}_float", f"{IMAGE}_255"], [f"{IMAGE}_unit"], name=f"{IMAGE}_unit"),
             helper.make_node("Sub", [f"{IMAGE}_unit", f"{IMAGE}_mean"], [f"{IMAGE}_centred"],
                              name=f"{IMAGE}_centred"),
             helper.make_node("Div", [f"{IMAGE}_centred", f"{IMAGE}_std"], [INPUT], name=f"{IMAGE}_normalised")]
    nodes = front + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.remove(old)
    graph.input.insert(0, helper.make_tensor_value_info(IMAGE, TensorProto.UINT8, shape))
    return model


def describe_input(model: Any, image_input: str, mean: Sequence[float], std: Sequence[float]) -> str:
    """Writes what the graph's input must be into its doc string and metadata (`input_layout`, `input_dtype`,
    `input_range`, `mean`, `std`), and returns it as one line: a uint8 export fed floats cast to uint8 scored 9.8 %
    with no hint of what it expected."""
    from onnx import helper

    means, stds = ",".join(f"{m:g}" for m in mean), ",".join(f"{s:g}" for s in std)
    if image_input == "uint8":
        props = {"input_layout": "NHWC", "input_dtype": "uint8", "input_range": "0-255 (pixels as decoded)",
                 "normalisation": "in the graph: (x / 255 - mean) / std"}
        text = (f"input '{IMAGE}': uint8 pixels, batch x height x width x channels, 0-255 as an image decoder gives "
                f"them; the graph normalises them with mean {means} and std {stds}")
    else:
        props = {"input_layout": "NCHW", "input_dtype": "float32", "input_range": "normalised",
                 "normalisation": "before the graph: (x / 255 - mean) / std"}
        text = (f"input '{INPUT}': float32 batch x channels x height x width, normalised before the graph: "
                f"(pixels / 255 - mean) / std with mean {means} and std {stds}")
    model.doc_string = text
    helper.set_model_props(model, {**props, "mean": means, "std": stds})
    return text
