"""TVM's static builds replayed as a KernelChain: same results as the VM, buffers reused safely, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlopt
from rlopt.backends.tvm import chain as tvm_chain
from rlopt.backends.tvm.chain import LAYOUT_KERNELS, KernelChain, record_chain
from rlopt.backends.tvm.runner import VmCall
from rlopt.backends.base import flatten_outputs

SHAPES = [(1, 1, 32), (2, 3, 32), (4, 6, 32)]


def _vm_outputs(session: rlopt.Session, x: np.ndarray) -> list[np.ndarray]:
    """The static build's own VM on a fresh TVM tensor: what the chain must reproduce bit for bit."""
    import tvm
    from tvm import relax

    runner = session._gen.runners["tvm"]
    vm = relax.VirtualMachine(runner._libraries[(x.shape,)], tvm.cpu(0))
    result = vm["main"](tvm.runtime.tensor(x), *runner._params[(x.shape,)])
    return [t.numpy() for t in flatten_outputs(result)]


@pytest.mark.parametrize("network", ["policy", "value"])
def test_chain_matches_the_vm_call_after_call(tiny_compiled: Path, network: str) -> None:
    session = rlopt.load(tiny_compiled, network, backend="tvm")
    output = session.outputs[0]
    rng = np.random.default_rng(11)
    for shape in SHAPES:
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(3):  # each call re-runs the kernels on the same buffers
            x = rng.standard_normal(shape).astype(np.float32)
            got = session.run({"input0": x})[output]
            np.testing.assert_array_equal(got, _vm_outputs(session, x)[0])
            kept.append((got, got.copy()))
        for got, copy in kept:
            np.testing.assert_array_equal(got, copy)  # a later call never overwrote an earlier result
    plans = session._gen.runners["tvm"]._local.plans
    assert {key[0][0] for key in plans} == set(SHAPES)
    assert all(isinstance(plan, KernelChain) for plan in plans.values())
    for plan in plans.values():  # layout-only kernels at either end are not called (the policy's obs[0] at batch 1)
        assert plan.symbols and not {plan.symbols[0], plan.symbols[-1]} & _layout_symbols(plan.symbols), plan.symbols


def _layout_symbols(symbols: list[str]) -> set[str]:
    return {s for s in symbols if s.rstrip("0123456789") in LAYOUT_KERNELS}


def test_the_batch_1_policy_build_has_the_layout_kernels_the_chain_drops(tiny_compiled: Path) -> None:
    """What the previous test's check rests on: recorded without elision, the tiny policy's batch-1 chain starts
    with its obs[0] take and ends with its unsqueeze."""
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    runner = session._gen.runners["tvm"]
    x = np.random.default_rng(17).standard_normal((1, 1, 32)).astype(np.float32)
    staging = [runner.staging(x)]
    np.copyto(staging[0][0], x)
    vm = runner._vm.VirtualMachine(runner._libraries[(x.shape,)], runner.device)
    kept, _ = record_chain(vm, staging, runner.from_dlpack, runner._params[(x.shape,)], elide=False)
    assert kept is not None
    assert kept.symbols[0].startswith("take") and kept.symbols[-1].startswith("expand_dims"), kept.symbols
    elided = session.run({"input0": x})["logits"]
    np.testing.assert_array_equal(elided, kept([x])[0])
    np.testing.assert_array_equal(elided, _vm_outputs(session, x)[0])


def test_large_aligned_inputs_are_read_in_place_and_unaligned_ones_staged(tiny_compiled: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tvm_chain, "STAGE_BYTES", 0)  # every input counts as large
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    rng = np.random.default_rng(12)
    shape = (4, 6, 32)
    first = rng.standard_normal(shape).astype(np.float32)
    session.run({"input0": first})  # records the chain on the staged copy
    chain = session._gen.runners["tvm"]._local.plans[((shape, np.dtype(np.float32)),)]
    assert isinstance(chain, KernelChain) and chain.replaceable == [True]
    raw = np.empty(np.prod(shape) + 32, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4
    aligned = raw[start:start + np.prod(shape)].reshape(shape)
    unaligned = raw[start + 1:start + 1 + np.prod(shape)].reshape(shape)
    for x in (aligned, unaligned):
        x[...] = rng.standard_normal(shape)
        before = x.copy()
        np.testing.assert_array_equal(session.run({"input0": x})["logits"], _vm_outputs(session, x.copy())[0])
        np.testing.assert_array_equal(x, before)
    staged = chain.staging[0][0]
    np.testing.assert_array_equal(staged, unaligned)  # only the unaligned input went through the staging buffer


class _ScriptedVm:
    """Stands in for a Relax VM: reports the scripted calls to the instrument, then returns `result`."""

    def __init__(self, script: list[tuple[str, tuple[Any, ...]]], result: Any) -> None:
        self._script, self._result, self._watch = script, result, None

    def set_instrument(self, watch: Any) -> None:
        self._watch = watch

    def __getitem__(self, name: str) -> Any:
        def main(*_inputs: Any) -> Any:
            for symbol, args in self._script:
                self._watch(None, symbol, True, None, *args)
                self._watch(None, symbol, False, None, *args)
            return self._result
        return main


def _tensor(array: np.ndarray) -> Any:
    import tvm_ffi

    return tvm_ffi.from_dlpack(array)


def test_a_data_dependent_branch_keeps_the_vm() -> None:
    x, out = np.zeros((1, 4), np.float32), np.ones((1, 2), np.float32)
    staging = [(x, _tensor(x))]
    result = _tensor(out)
    branching = _ScriptedVm([("vm.builtin.check_tensor_info", (staging[0][1],)),
                             ("vm.builtin.read_if_cond", (staging[0][1],)), ("fused_dense", (staging[0][1], result))],
                            result)
    chain, results = record_chain(branching, staging, _tensor)
    assert chain is None
    np.testing.assert_array_equal(results[0], out)


def test_a_view_of_an_input_is_only_ever_fed_from_the_staging_buffer() -> None:
    x, out = np.zeros((2, 4), np.float32), np.ones((2, 2), np.float32)
    staging = [(x, _tensor(x))]
    view, result = _tensor(x.reshape(8)), _tensor(out)
    viewing = _ScriptedVm([("vm.builtin.check_tensor_info", (staging[0][1],)),
                           ("vm.builtin.reshape", (staging[0][1],)), ("fused_dense", (view, result))], result)
    chain, _ = record_chain(viewing, staging, _tensor)
    assert chain is not None and chain.replaceable == [False]
    reading = _ScriptedVm([("vm.builtin.check_tensor_info", (staging[0][1],)),
                           ("fused_dense", (staging[0][1], result))], result)
    chain, _ = record_chain(reading, staging, _tensor)
    assert chain is not None and chain.replaceable == [True] and chain.calls[0][2] == ((0, 0),)


def test_an_output_that_is_the_input_is_copied_from_the_staging_buffer() -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    staging = [(x, _tensor(x))]
    passthrough = _ScriptedVm([("vm.builtin.check_tensor_info", (staging[0][1],))], staging[0][1])
    chain, results = record_chain(passthrough, staging, _tensor)
    assert chain is not None and chain.replaceable == [False]
    np.testing.assert_array_equal(chain([np.full((1, 4), 7, np.float32)])[0], np.full((1, 4), 7, np.float32))
    np.testing.assert_array_equal(results[0], np.arange(4, dtype=np.float32).reshape(1, 4))


class _KernelVm(_ScriptedVm):
    """A scripted VM whose kernels run: each step is (symbol, numpy function of the tensors' arrays, tensors)."""

    def __init__(self, script: list[tuple[str, Any, tuple[Any, ...]]], result: Any) -> None:
        super().__init__([], result)
        self._kernels = script

    def __getitem__(self, name: str) -> Any:
        def main(*_inputs: Any) -> Any:
            for symbol, function, args in self._kernels:
                self._watch(function, symbol, True, None, *args)
                function(*args)
            return self._result
        return main


def _kernel(body: Any) -> Any:
    """A kernel on TVM tensors, as a VM calls it: body(*numpy views), the last one written."""
    return lambda *tensors: body(*[np.from_dlpack(t) for t in tensors])


def _take(src: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    out[...] = np.take(src, int(index), axis=0)


def _relayout(src: np.ndarray, out: np.ndarray) -> None:
    out[...] = src.reshape(out.shape)


def _dense_model() -> tuple[list[tuple[np.ndarray, Any]], dict[str, Any], np.ndarray]:
    """obs[0] (a take) -> dense -> unsqueeze, on buffers as a static build's VM would allocate them."""
    weight = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    x, index = np.zeros((1, 1, 4), np.float32), np.zeros((), np.int64)
    staging = [(x, _tensor(x))]
    tensors = {name: _tensor(np.zeros(shape, np.float32)) for name, shape in
               {"taken": (1, 4), "hidden": (1, 2), "out": (1, 1, 2)}.items()}
    tensors |= {"weight": _tensor(weight), "index": _tensor(index)}
    return staging, tensors, weight


def _dense(src: np.ndarray, weight: np.ndarray, out: np.ndarray) -> None:
    out[...] = src @ weight


def test_layout_kernels_at_either_end_are_not_called_and_the_results_stay_exact() -> None:
    staging, t, weight = _dense_model()
    script = [("take11", _kernel(_take), (staging[0][1], t["index"], t["taken"])),
              ("fused_dense", _kernel(_dense), (t["taken"], t["weight"], t["hidden"])),
              ("expand_dims1", _kernel(_relayout), (t["hidden"], t["out"]))]
    chain, _ = record_chain(_KernelVm(script, t["out"]), staging, _tensor)
    assert chain is not None and chain.symbols == ["fused_dense"]
    assert chain.replaceable == [False]  # the input now lands in the take's output, copied each call
    assert np.shares_memory(chain.buffers[0], np.from_dlpack(t["taken"]))
    assert chain.outputs[0].shape == (1, 1, 2) and np.shares_memory(chain.outputs[0], np.from_dlpack(t["hidden"]))
    call = chain.bind(["y"])
    assert call is not None
    rng = np.random.default_rng(18)
    for _ in range(3):
        x = rng.standard_normal((1, 1, 4)).astype(np.float32)
        expected = (x.reshape(1, 4) @ weight).reshape(1, 1, 2)
        np.testing.assert_array_equal(chain([x])[0], expected)
        np.testing.assert_array_equal(call({"x": x}, [x])["y"], expected)


def test_a_layout_kernel_is_kept_where_dropping_it_could_change_a_result() -> None:
    staging, t, _ = _dense_model()
    # a second kernel reads the staged input too: the take must keep filling its own output
    both = [("take11", _kernel(_take), (staging[0][1], t["index"], t["taken"])),
            ("fused_mix", _kernel(lambda a, b, out: _dense(a + b.reshape(1, 4), np.eye(4, 2, dtype=np.float32), out)),
             (t["taken"], staging[0][1], t["hidden"]))]
    chain, _ = record_chain(_KernelVm(both, t["hidden"]), staging, _tensor)
    assert chain is not None and chain.symbols == ["take11", "fused_mix"]
    # a take that gathers (fewer elements out than in), or permutes (as many indices as rows), is a real kernel
    x, rows = np.zeros((3, 4), np.float32), _tensor(np.zeros((1, 4), np.float32))
    gather = [("take2", _kernel(_take), (_tensor(x), t["index"], rows))]
    staged = [(x, gather[0][2][0])]
    chain, _ = record_chain(_KernelVm(gather, rows), staged, _tensor)
    assert chain is not None and chain.symbols == ["take2"]
    order, permuted = _tensor(np.array([2, 0, 1], np.int64)), _tensor(np.zeros((3, 4), np.float32))
    mixed = _tensor(np.zeros((3, 2), np.float32))
    permute = [("take3", _kernel(lambda src, idx, out: np.take(src, idx, axis=0, out=out)),
                (staged[0][1], order, permuted)),
               ("fused_dense", _kernel(_dense), (permuted, t["weight"], mixed))]
    chain, _ = record_chain(_KernelVm(permute, mixed), staged, _tensor)
    assert chain is not None and chain.symbols == ["take3", "fused_dense"]
    # a chain recorded without elision (a padded bucket's) keeps every kernel
    relaid = [("reshape", _kernel(_relayout), (staging[0][1], t["taken"])),
              ("fused_dense", _kernel(_dense), (t["taken"], t["weight"], t["hidden"]))]
    chain, _ = record_chain(_KernelVm(relaid, t["hidden"]), staging, _tensor, elide=False)
    assert chain is not None and chain.symbols == ["reshape", "fused_dense"]


def test_a_refused_chain_leaves_the_shape_to_its_vm(tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tvm_chain, "CHAIN_BUILTINS", tvm_chain.CHECK_BUILTINS)  # allocation now refuses
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    rng = np.random.default_rng(14)
    shape = (2, 3, 32)
    kept = []
    for _ in range(3):  # the first call (the recording) and the VM calls after it
        x = rng.standard_normal(shape).astype(np.float32)
        got = session.run({"input0": x})["logits"]
        np.testing.assert_array_equal(got, _vm_outputs(session, x)[0])
        kept.append((got, got.copy()))
    assert all(np.array_equal(got, copy) for got, copy in kept)
    assert isinstance(session._gen.runners["tvm"]._local.plans[((shape, np.dtype(np.float32)),)], VmCall)


def test_the_dynamic_library_is_called_through_the_vm(tiny_compiled: Path) -> None:
    """(Shapes without their own build reach it once padding is off: tests/test_tvm_padding.py.)"""
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    runner = session._gen.runners["tvm"]
    runner.infer_dynamic({"input0": np.ones((3, 2, 32), np.float32)})
    runner.infer_dynamic({"input0": np.ones((2, 3, 32), np.float32)})
    assert len(runner._local.dynamic_plans) == 2
    assert all(isinstance(plan, VmCall) for plan in runner._local.dynamic_plans.values())


def test_after_its_first_call_a_signature_runs_as_one_bound_function_per_thread(tiny_compiled: Path) -> None:
    session = rlopt.load(tiny_compiled, "value", backend="tvm")
    key = ((2, 3, 32), np.dtype(np.float32), True)  # shape, dtype, C-contiguous per input, flat
    x = np.random.default_rng(15).standard_normal((2, 3, 32)).astype(np.float32)
    first = session.run({"input0": x})["value"]
    bound = session._gen.local.bound[key]
    assert bound is not None and bound.__name__ == "call"
    np.testing.assert_array_equal(session.run({"input0": x})["value"], first)
    np.testing.assert_array_equal(first, _vm_outputs(session, x)[0])


@pytest.mark.parametrize("shape", [(1, 1, 32), (4, 6, 32)])
def test_threads_sharing_a_session_never_see_each_others_results(tiny_compiled: Path, shape: tuple[int, ...]) -> None:
    import threading

    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    rng = np.random.default_rng(16)
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    expected = [_vm_outputs(session, x)[0] for x in inputs]
    failures: list[str] = []

    def work(slot: int) -> None:
        for _ in range(300):
            got = session.run({"input0": inputs[slot]})["logits"]
            if not np.array_equal(got, expected[slot]):
                failures.append(f"thread {slot}")
                return

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
