"""Compiling and running from Python on the CPU: NumPy and PyTorch CPU
arrays run the reference interpreter, bit for bit what `kiln run --device
cpu` computes; every binding error; compile errors; threads."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kiln
from kiln._warm import binary
from conftest import EXAMPLES, ROOT, example_id


def kiln_cli(*args, env=None):
    return subprocess.run([binary(), *map(str, args)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_numpy_runs_equal_kiln_run_bit_for_bit(path, tmp_path):
    done = kiln_cli("run", path, "--device", "cpu", "--random", "3", "--outputs", tmp_path)
    assert done.returncode == 0, done.stderr
    g = kiln.Graph.load(path)
    exe = kiln.compile(g, arch="sm_90")
    # `kiln run` writes every input as float32; bind them in their dtypes (bf16 stays float32: NumPy has none).
    numpy_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "bool": np.bool_}
    inputs = {name: laid_out(np.load(tmp_path / f"{name}.npy").astype(numpy_dtype[spec.dtype]), spec.strides)
              for name, spec in g.inputs.items()}
    got = exe(**inputs)
    assert list(got) == list(g.outputs)
    for name in g.outputs:
        want = np.load(tmp_path / f"{name}.npy")
        value = got[name].astype(np.float32) if got[name].dtype == np.float16 else got[name]
        assert value.shape == want.shape
        assert value.tobytes() == want.astype(value.dtype).tobytes(), name


def laid_out(values, strides):
    """`values` in an array with the given element strides (as the graph declares the input)."""
    if tuple(s * values.itemsize for s in strides) == values.strides:
        return values
    span = 1 + sum((n - 1) * s for n, s in zip(values.shape, strides))
    backing = np.zeros(span, values.dtype)
    view = np.lib.stride_tricks.as_strided(backing, values.shape, [s * values.itemsize for s in strides])
    view[...] = values
    return view


def simple_graph(dtype="f32", strides=None):
    b = kiln.GraphBuilder("simple")
    x = b.input("x", [3, 4], dtype, strides)
    w = b.input("w", [4], dtype)
    b.output(b.mul(b.relu(x), w, dtype=dtype), name="y")
    return b.build()


def test_dict_and_keyword_calls_agree():
    exe = kiln.compile(simple_graph(), arch="sm_90")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 6
    w = np.array([1, 2, 3, 4], np.float32)
    a = exe(x=x, w=w)["y"]
    b = exe({"x": x, "w": w})["y"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.maximum(x, 0) * w)


def test_torch_cpu_tensors_run_and_come_back_as_torch():
    torch = pytest.importorskip("torch")
    exe = kiln.compile(simple_graph("bf16"), arch="sm_90")
    x = torch.randn(3, 4).to(torch.bfloat16)
    w = torch.randn(4).to(torch.bfloat16)
    y = exe(x=x, w=w)["y"]
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == (3, 4)
    want = (torch.relu(x.float()) * w.float()).to(torch.bfloat16)
    assert torch.equal(y, want)
    out = {"y": torch.empty(3, 4, dtype=torch.bfloat16)}
    assert exe.run({"x": x, "w": w}, out) is None
    assert torch.equal(out["y"], want)


def test_strided_inputs_bind_where_the_graph_declares_their_strides():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:3, :4]  # strides (6, 1) in elements
    w = np.ones(4, np.float32)
    declared = kiln.compile(simple_graph(strides=[6, 1]), arch="sm_90")
    np.testing.assert_array_equal(declared(x=view, w=w)["y"], np.maximum(view, 0))
    contiguous = kiln.compile(simple_graph(), arch="sm_90")
    with pytest.raises(kiln.BindingError, match=r"input 'x': strides \[6, 1\] given; the graph declares \[4, 1\]"):
        contiguous(x=view, w=w)
    transposed = np.ascontiguousarray(np.arange(12, dtype=np.float32).reshape(4, 3)).T
    with pytest.raises(kiln.BindingError, match="strides"):
        contiguous(x=transposed, w=w)


@pytest.mark.parametrize("inputs, says", [
    (dict(x=np.zeros((3, 4), np.float32)), "input 'w' is not given"),
    (dict(x=np.zeros((3, 4), np.float32), w=np.zeros(4, np.float32), z=np.zeros(1)), "'z' is not an input of graph 'simple'"),
    (dict(x=np.zeros((3, 5), np.float32), w=np.zeros(4, np.float32)), r"input 'x': shape \[3, 5\] given, \[3, 4\] expected"),
    (dict(x=np.zeros((3, 4), np.float64), w=np.zeros(4, np.float32)), "input 'x': dtype float64 given, f32 expected"),
    (dict(x=[[0.0] * 4] * 3, w=np.zeros(4, np.float32)), "input 'x': a builtins.list is not an array"),
])
def test_binding_errors_name_the_tensor_and_what_differs(inputs, says):
    exe = kiln.compile(simple_graph(), arch="sm_90")
    with pytest.raises(kiln.BindingError, match=says) as error:
        exe(**inputs)
    assert isinstance(error.value, ValueError)


def test_run_checks_the_outputs_it_is_given():
    exe = kiln.compile(simple_graph(), arch="sm_90")
    ins = dict(x=np.zeros((3, 4), np.float32), w=np.zeros(4, np.float32))
    with pytest.raises(kiln.BindingError, match="output 'y' is not given"):
        exe.run(ins, {})
    with pytest.raises(kiln.BindingError, match=r"output 'y': shape \[4, 3\] given"):
        exe.run(ins, {"y": np.zeros((4, 3), np.float32)})
    with pytest.raises(kiln.BindingError, match="output 'y': dtype float16 given"):
        exe.run(ins, {"y": np.zeros((3, 4), np.float16)})
    with pytest.raises(kiln.BindingError, match="'q' is not an output"):
        exe.run(ins, {"y": np.zeros((3, 4), np.float32), "q": np.zeros(1)})
    out = np.full((3, 4), np.nan, np.float32)
    exe.run(ins, {"y": out})
    assert not np.isnan(out).any()


def test_compile_reports_plan_and_kernels():
    exe = kiln.compile(kiln.Graph.load(ROOT / "examples/conv/conv_bias_relu.json"), arch="sm_90")
    assert exe.plan["graph"] == "conv_bias_relu" and exe.plan["kernels"][0]["kind"] == "conv"
    assert [k["kind"] for k in exe.kernels] == [k["kind"] for k in exe.plan["kernels"]]
    for k in exe.kernels:
        assert set(k) == {"kind", "key", "cache_hit", "ms", "tuning"} and len(k["key"]) == 32
    again = kiln.compile(kiln.Graph.load(ROOT / "examples/conv/conv_bias_relu.json"), arch="sm_90")
    assert all(k["cache_hit"] for k in again.kernels)
    unfused = kiln.compile(kiln.Graph.load(ROOT / "examples/conv/conv_bias_relu.json"), arch="sm_90", fuse=False)
    assert len(unfused.kernels) == 3
    # The plan is the one `kiln plan --json` prints for the arch (made when
    # asked: the cached program `again` needed none), fused or not.
    path = ROOT / "examples/conv/conv_bias_relu.json"
    fused_plan = json.loads(kiln_cli("plan", path, "--json", "--arch", "sm_90").stdout)
    assert exe.plan == fused_plan and again.plan == fused_plan
    # With each kernel's tactic for the arch (codegen/tactic.h) and why those before it did not fit.
    # (cuBLASLt, the first tactic, refuses for a reason that depends on the machine: not installed here,
    # or that a conv is no matmul it takes)
    tactic = exe.plan["kernels"][0]["tactic"]
    cublaslt, *rest = tactic["rejected"]
    assert cublaslt["tactic"] == "cublasLt" and cublaslt["reason"]
    assert {**tactic, "rejected": rest} == {
        "arch": "sm_90", "chosen": "mma.sync",
        "rejected": [{"tactic": "mma.sync one slice", "reason": "8 tiles of 128 x 128, under 96"},
                     {"tactic": "wgmma", "reason": "8 tiles of 128 x 128, under 32"}]}
    assert unfused.plan == json.loads(kiln_cli("plan", path, "--json", "--arch", "sm_90", "--no-fusion").stdout)


def test_plan_is_the_archs():
    # Below sm_90 the norm's tail runs in the matmul's prologue: the plan, and
    # the kernels built, are those of the arch compiled for.
    path = ROOT / "examples/held_rows/rms_norm_into_narrow_matmul.json"
    exe = kiln.compile(kiln.Graph.load(path), arch="sm_80")
    want = json.loads(kiln_cli("plan", path, "--json", "--arch", "sm_80").stdout)
    assert exe.plan == want != json.loads(kiln_cli("plan", path, "--json", "--arch", "sm_90").stdout)
    assert [k["kind"] for k in exe.kernels] == [k["kind"] for k in want["kernels"]]


def test_bad_arch_is_a_graph_error_and_a_failed_compile_a_compile_error(tmp_path):
    with pytest.raises(kiln.GraphError, match="arch 'sm_9'"):
        kiln.compile(simple_graph(), arch="sm_9")
    # NVRTC broken on purpose (the library reads KILN_TEST_NVRTC_FAIL once per process).
    script = ("import kiln\n"
              "b = kiln.GraphBuilder('g'); x = b.input('x', [8], 'f32'); b.output(b.exp(x))\n"
              "try:\n    kiln.compile(b.build(), arch='sm_90')\n"
              "except kiln.CompileError as e:\n    print('CompileError:', e)\n")
    env = dict(os.environ, KILN_TEST_NVRTC_FAIL="1", KILN_CACHE_DIR=str(tmp_path), TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert "CompileError:" in done.stdout, done.stderr
    assert "broken on purpose" in done.stdout and "repro folder" in done.stdout


def test_threads_compile_in_parallel_with_the_gil_released():
    # Two uncached compiles from two threads overlap in time: NVRTC runs without the GIL.
    spans = {}

    def work(i):
        b = kiln.GraphBuilder(f"parallel{i}")
        x = b.input("x", [1000 + i, 3], "f32")
        b.output(b.softmax(b.sin(x), axis=0))
        start = time.perf_counter()
        kiln.compile(b.build(), arch="sm_90", cache_dir=None)
        spans[i] = (start, time.perf_counter())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = spans[0], spans[1]
    assert a0 < b1 and b0 < a1, spans


def test_warm_fills_the_cache(tmp_path):
    os.environ["KILN_CACHE_DIR_FOR_WARM"] = str(tmp_path)
    summary = kiln.warm([ROOT / "examples/pointwise"], archs=["sm_80"], jobs=2)
    assert summary.startswith("warmed: ") and "0 failed" in summary
    with pytest.raises(kiln.GraphError, match="no such|not"):
        kiln.warm([tmp_path / "missing.json"])


def test_set_log_receives_the_librarys_warnings(tmp_path):
    # A cache folder that others may write to is refused (and the compile goes on in memory).
    messages = []
    kiln.set_log(lambda level, message: messages.append((level, message)))
    try:
        bad = tmp_path / "shared"
        bad.mkdir()
        bad.chmod(0o777)
        kiln.compile(simple_graph(), arch="sm_80", cache_dir=str(bad))
    finally:
        kiln.set_log(None)
    assert any(level == "warning" and "is not safe" in message for level, message in messages), messages


def test_a_cache_dir_holding_a_nul_is_refused(tmp_path):
    # (it was cut at the NUL: "cache\x00b" made and used the folder "cache")
    with pytest.raises(ValueError, match=r"cache_dir '.*cache\\x00b' holds a NUL character"):
        kiln.compile(simple_graph(), arch="sm_90", cache_dir=str(tmp_path / "cache\x00b"))
    assert not (tmp_path / "cache").exists()


def _bytes_strided(byte_strides, dtype=np.float32, shape=(3, 4)):
    """An array of `shape` over a byte buffer with the given byte strides."""
    return np.ndarray(shape, dtype, buffer=np.zeros(256, np.uint8), strides=byte_strides)


# Arrays kiln cannot read are BindingErrors (they were nanobind's TypeError).
@pytest.mark.parametrize("make, says", [
    # byte strides 17 and 5 read as 4 and 1 elements, which the graph declares
    (lambda: _bytes_strided((17, 5)), r"input 'x': byte strides \[17, 5\] are not multiples of the 4-byte item size"),
    (lambda: np.zeros((3, 4), ">f4"), "input 'x': big-endian"),
])
def test_numpy_arrays_kiln_cannot_read_are_binding_errors(make, says):
    exe = kiln.compile(simple_graph(), arch="sm_90")
    with pytest.raises(kiln.BindingError, match=says):
        exe(x=make(), w=np.zeros(4, np.float32))


def test_torch_tensors_kiln_cannot_read_are_binding_errors():
    torch = pytest.importorskip("torch")
    exe = kiln.compile(simple_graph(), arch="sm_90")
    w = torch.ones(4)
    with pytest.raises(kiln.BindingError, match="input 'x': a tensor on meta"):
        exe(x=torch.empty(3, 4, device="meta"), w=w)
    # A negative view's storage holds the values without the sign: read raw, the sign was lost.
    x = torch.arange(12.0).reshape(3, 4)
    with pytest.raises(kiln.BindingError, match="input 'x': a negative view"):
        exe(x=x._neg_view(), w=w)
    assert torch.equal(exe(x=x._neg_view().resolve_neg(), w=w)["y"], torch.zeros(3, 4))


def _sigint_by_default():
    """In the child: SIGINT's default action, also where the tests were started with it ignored
    (a background job of a script, as tools/dev.sh runs the shards: the shell ignores SIGINT there)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_a_long_reference_run(tmp_path):
    """A 4096^2 matmul on the reference interpreter takes tens of seconds;
    SIGINT raises KeyboardInterrupt within a second or so, not at its end."""
    import signal
    script = tmp_path / "long_run.py"
    script.write_text(
        "import sys, time\n"
        "import numpy as np\n"
        "import kiln\n"
        "b = kiln.GraphBuilder('long')\n"
        "a = b.input('a', [4096, 4096], 'f32')\n"
        "b.output(b.matmul(a, a), name='y')\n"
        "exe = kiln.compile(b.build(), arch='sm_90')\n"
        "x = np.ones((4096, 4096), np.float32)\n"
        "print('running', flush=True)\n"
        "try:\n"
        "    exe(a=x)\n"
        "    print('finished', flush=True)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n")
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_sigint_by_default)
    try:
        assert child.stdout.readline().strip() == "running"
        time.sleep(1.0)  # inside the run
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=120)
        waited = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.strip() == "interrupted", (out, err)
    assert child.returncode == 0, err
    assert waited < 5.0, f"KeyboardInterrupt came {waited:.1f} s after SIGINT"


def test_ctrl_c_stops_the_clis_reference_run(tmp_path):
    """`kiln run --device cpu` ends at once on SIGINT (the default action:
    nothing in the CLI or the interpreter holds the signal back)."""
    import signal
    graph = tmp_path / "long.json"
    graph.write_text('{"kiln": 1, "inputs": {"a": {"shape": [4096, 4096], "dtype": "f32"}}, '
                     '"ops": [{"op": "matmul", "in": ["a", "a"], "out": "y"}], "outputs": ["y"]}')
    child = subprocess.Popen([binary(), "run", str(graph), "--device", "cpu", "--random", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_sigint_by_default)
    try:
        time.sleep(3.0)  # drawing the inputs, then inside the run
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        child.communicate(timeout=120)
        waited = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode in (-signal.SIGINT, 128 + signal.SIGINT)
    assert waited < 5.0, f"the CLI ended {waited:.1f} s after SIGINT"
