"""`rlopt.onnx_graph.index_ranges`: which integer inputs index a table, and its rows."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rlopt.onnx_graph import index_ranges


def _model(nodes: list, inputs: list, initializers: list) -> object:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=initializers)
    return helper.make_model(graph)


def test_ids_reaching_a_gather_through_value_preserving_ops_get_the_table_rows() -> None:
    table = numpy_helper.from_array(np.zeros((3, 7, 2), np.float32), "table")
    shape = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    nodes = [helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Reshape", ["ids32", "flat"], ["ids_flat"]),
             helper.make_node("Gather", ["table", "ids_flat"], ["rows"], axis=1),
             helper.make_node("Gather", ["table", "other"], ["picked"], axis=0),  # a second table, 3 rows
             helper.make_node("Gather", ["obs", "ids"], ["from_data"]),  # data is no weight: no bound from it
             helper.make_node("Add", ["rows", "rows"], ["y"])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, 4]),
              helper.make_tensor_value_info("other", TensorProto.INT64, [None]),
              helper.make_tensor_value_info("obs", TensorProto.FLOAT, [None, 4]),
              helper.make_tensor_value_info("count", TensorProto.INT64, [None])]  # reaches no Gather
    assert index_ranges(_model(nodes, inputs, [table, shape])) == {"ids": [0, 6], "other": [0, 2]}


def test_a_float_input_and_a_gather_of_the_shape_are_not_index_inputs() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)]
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])]
    assert index_ranges(_model(nodes, inputs, [zero])) == {}
