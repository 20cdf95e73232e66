"""Bad inputs raise the StriaError subclass of the library's status with the library's own
message (the one stria_get_last_error() holds), or a TypeError/BufferError naming the argument
for objects that cannot be tensors; nothing crashes."""

from __future__ import annotations

import builtins
import os
import socket
import threading

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S
from stria import capi

D = 16


@pytest.fixture
def ctx():
    with stria.Context(timeout_s=TIMEOUT_S) as c:
        yield c


def tensors(shape=(1, 8, 2, D), dtype=np.float32):
    rng = np.random.default_rng(7)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def raises_library_error(cls, fn, *args, match=None, **kwargs):
    """Calls fn, expects cls, and checks the message is the library's last error verbatim."""
    with pytest.raises(cls, match=match) as info:
        fn(*args, **kwargs)
    assert str(info.value) == capi.stria_get_last_error() != ""
    assert info.value.status == cls.status
    return info.value


def test_hierarchy_follows_the_status_codes():
    classes = {
        capi.STRIA_ERROR_INVALID_ARGUMENT: (stria.InvalidArgumentError, ValueError),
        capi.STRIA_ERROR_UNSUPPORTED: (stria.UnsupportedError, NotImplementedError),
        capi.STRIA_ERROR_OUT_OF_MEMORY: (stria.OutOfMemoryError, MemoryError),
        capi.STRIA_ERROR_TRANSPORT: (stria.TransportError, None),
        capi.STRIA_ERROR_TIMEOUT: (stria.TimeoutError, builtins.TimeoutError),
        capi.STRIA_ERROR_CUDA: (stria.CudaError, None),
        capi.STRIA_ERROR_ABORTED: (stria.AbortedError, None),
        capi.STRIA_ERROR_INTERNAL: (stria.InternalError, None),
    }
    for status, (cls, builtin) in classes.items():
        assert issubclass(cls, stria.StriaError) and issubclass(cls, RuntimeError)
        assert cls.status == status
        assert builtin is None or issubclass(cls, builtin)
        assert cls.__module__ == "stria"
    assert stria.TimeoutError is not builtins.TimeoutError


def test_mismatched_shapes(ctx):
    q, k, v = tensors()
    e = raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k[:, :4], v)
    assert "k" in str(e)


def test_heads_not_a_multiple(ctx):
    q = tensors((1, 8, 3, D))[0]
    k, v = tensors((1, 8, 2, D))[:2]
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k, v)


def test_mixed_dtypes(ctx):
    q, k, v = tensors()
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k.astype(np.float16), v)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_unsupported_dtype(ctx, dtype):
    q, k, v = (x.astype(dtype) for x in tensors())
    raises_library_error(stria.UnsupportedError, ctx.attention_forward, q, k, v, match="bfloat16")


def test_lse_must_be_float32(ctx):
    q, k, v = tensors()
    raises_library_error(
        stria.InvalidArgumentError, ctx.attention_forward, q, k, v, lse=np.empty((1, 2, 8), np.float64)
    )


def test_head_dim_out_of_range(ctx):
    q, k, v = tensors((1, 4, 1, 600))
    raises_library_error(stria.UnsupportedError, ctx.attention_forward, q, k, v, match="512")


def test_last_dim_must_be_contiguous(ctx):
    q, k, v = tensors((1, 8, 2, 2 * D))
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q[..., ::2], k[..., ::2], v[..., ::2])


def test_wrong_rank_of_tensor(ctx):
    q, k, v = tensors((8, 2, D))
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k, v)


def test_stream_on_cpu(ctx):
    q, k, v = tensors()
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k, v, stream=1234, match="stream")


def test_unknown_layout_number_reaches_the_library(ctx):
    q, k, v = tensors()
    raises_library_error(stria.InvalidArgumentError, ctx.attention_forward, q, k, v, layout=9, match="layout")


def test_unknown_layout_name():
    with pytest.raises(ValueError, match="striped"):
        stria.positions("diagonal", 8, 2, 0)


def test_backward_with_a_wrong_lse(ctx):
    q, k, v = tensors()
    out, lse = ctx.attention_forward(q, k, v)
    raises_library_error(stria.InvalidArgumentError, ctx.attention_backward, q, k, v, out, lse[:, :1], out)


def test_not_a_tensor(ctx):
    q, k, v = tensors()
    with pytest.raises(TypeError, match=r"attention_forward\(\): argument 'v' must be a tensor"):
        ctx.attention_forward(q, k, [[1.0]])


@pytest.mark.parametrize(
    "call, where",
    [
        (lambda c, x: c.attention_forward(None, x, x), r"attention_forward\(\): argument 'q'"),
        (lambda c, x: c.attention_forward([[1.0]], x, x), r"attention_forward\(\): argument 'q'"),
        (lambda c, x: c.attention_backward(x, x, None, x, x, x), r"attention_backward\(\): argument 'v'"),
        (lambda c, x: stria.shard(None, 2, 0), r"shard\(\): argument 'full'"),
        (lambda c, x: stria.unshard(None, 2, 0), r"unshard\(\): argument 'local'"),
    ],
    ids=["forward_q_none", "forward_q_list", "backward_v_none", "shard", "unshard"],
)
def test_non_tensor_arguments_are_named(ctx, call, where):
    """Also where the package needs the argument's shape (to allocate an output like it)."""
    with pytest.raises(TypeError, match=where + r" must be a tensor .*, not (NoneType|list)$"):
        call(ctx, tensors()[0])


def test_foreign_byte_order_input(ctx):
    """A writable big-endian array gets numpy's own reason; only a read-only one is borrowed
    through the buffer protocol, whose refusal says the same."""
    q, k, v = tensors()
    with pytest.raises(BufferError, match=r"argument 'q': .*native byte order") as info:
        ctx.attention_forward(q.astype(">f4"), k, v)
    assert "read-only" not in str(info.value)
    frozen = q.astype(">f4")
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match=r"argument 'q' \(read-only numpy.ndarray\).*not in native byte order"):
        ctx.attention_forward(frozen, k, v)


def test_read_only_output(ctx):
    q, k, v = tensors()
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(BufferError, match="argument 'out'"):
        ctx.attention_forward(q, k, v, out=out)


def test_closed_context():
    c = stria.Context()
    c.close()
    c.close()  # idempotent
    q, k, v = tensors()
    with pytest.raises(stria.InvalidArgumentError, match="closed"):
        c.attention_forward(q, k, v)


def test_destroyed_handle_is_reported_by_the_library():
    c = stria.Context()
    handle = c.handle
    c.close()
    raises_library_error(stria.InvalidArgumentError, capi.stria_context_get_rank, handle, match="not a live context")


def test_local_transport_takes_one_rank():
    """Refused in Python terms (the library's message names its C function)."""
    with pytest.raises(stria.InvalidArgumentError, match=r"made together by stria.local_group\(2\)"):
        stria.Context(0, 2)


@pytest.mark.parametrize("n", [0, -1, 100000])
def test_local_group_size(n):
    raises_library_error(stria.InvalidArgumentError, stria.local_group, n)


def test_local_group_on_devices():
    """Rank r on devices[r]: all CPU here (an ordinary local group); kinds mixed in one ring, or a
    count that is not world_size, are refused."""
    raises_library_error(
        stria.InvalidArgumentError,
        stria.local_group,
        2,
        devices=["cpu", "cuda:0"],
        match=r"devices\[1\] is cuda:0 but devices\[0\] is cpu:0",
    )
    with pytest.raises(ValueError, match="one per rank"):
        stria.local_group(3, devices=["cpu", "cpu"])
    with pytest.raises(TypeError, match="device_type, device_id"):
        capi.stria_context_create_local_group_on_devices(capi.stria_context_config_t(), [(1, 0), "cpu"])
    q = np.random.default_rng(5).standard_normal((1, 8, 2, D)).astype(np.float32)
    with stria.local_group(2, devices=["cpu", (capi.kDLCPU, 0)], timeout_s=TIMEOUT_S) as group:
        outs = group.run(lambda c, x: c.attention_forward(x, x, x, causal=False)[0], [q, q])
    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        want = group.run(lambda c, x: c.attention_forward(x, x, x, causal=False)[0], [q, q])
    for got, ref in zip(outs, want):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_bad_config_values():
    raises_library_error(stria.InvalidArgumentError, stria.Context, timeout_s=-1.0, match="timeout")
    raises_library_error(stria.InvalidArgumentError, stria.Context, num_threads=-2, match="num_threads")
    raises_library_error(stria.InvalidArgumentError, stria.Context, transport=7, match="transport")


def test_unique_id_must_be_128_bytes():
    with pytest.raises(ValueError, match="128 bytes"):
        stria.Context(unique_id=b"short")


def test_bad_device():
    with pytest.raises(ValueError, match="device"):
        stria.Context(device="tpu")


def test_layout_arguments():
    raises_library_error(stria.InvalidArgumentError, stria.positions, "zigzag", 10, 3, 0, match="divisible")
    raises_library_error(stria.InvalidArgumentError, stria.positions, "striped", 12, 3, 3)
    raises_library_error(stria.InvalidArgumentError, stria.positions, "striped", 12, 0, 0)
    raises_library_error(stria.InvalidArgumentError, stria.analyze_balance, "striped", 64, 4, tile=0)
    raises_library_error(stria.InvalidArgumentError, stria.analyze_balance_steps, "striped", 64, -4)


def test_shard_arguments():
    full = np.zeros((2, 12, 3), np.float32)
    raises_library_error(stria.InvalidArgumentError, stria.shard, full, 5, 0)  # 12 % 5
    raises_library_error(stria.InvalidArgumentError, stria.shard, full, 3, 0, seq_dim=3)
    raises_library_error(stria.InvalidArgumentError, stria.shard, full, 3, 0, out=np.zeros((2, 5, 3), np.float32))
    raises_library_error(stria.InvalidArgumentError, stria.unshard, full, 2, 0, out=np.zeros((2, 12, 3), np.float32))


def test_consumed_capsule_is_refused(ctx):
    q, k, v = tensors()
    capsule = q.__dlpack__()
    np.from_dlpack(_CapsuleHolder(capsule))  # consumes it: renamed "used_dltensor"
    with pytest.raises(TypeError, match="already consumed"):
        ctx.attention_forward(capsule, k, v, out=np.empty_like(q), lse=np.empty((1, 2, 8), np.float32))


def test_fresh_capsule_is_borrowed(ctx):
    """A "dltensor" capsule passed directly is borrowed, not consumed: it stays usable."""
    q, k, v = tensors()
    capsule = q.__dlpack__()
    out, _ = ctx.attention_forward(capsule, k, v, out=np.empty_like(q), lse=np.empty((1, 2, 8), np.float32))
    ref, _ = ctx.attention_forward(q, k, v)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(np.from_dlpack(_CapsuleHolder(capsule)), q)
    np.testing.assert_array_equal(out, ref)


class _CapsuleHolder:
    """Hands a ready capsule to np.from_dlpack, which wants an object with __dlpack__."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (capi.kDLCPU, 0)


def test_from_env_needs_a_launcher():
    with pytest.raises(stria.InvalidArgumentError, match="RANK and WORLD_SIZE"):
        stria.Context.from_env(environ={})


@pytest.mark.parametrize(
    "env", [{"RANK": "0", "WORLD_SIZE": "2"}, {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}]
)
def test_from_env_needs_stria_root(env):
    with pytest.raises(stria.InvalidArgumentError, match="STRIA_ROOT"):
        stria.Context.from_env(environ=env)


@pytest.mark.parametrize("causal", ["no", None, 1.0])
def test_causal_must_be_a_bool(causal):
    q = np.zeros((1, 8, 2, 16), np.float32)
    with stria.Context() as c, pytest.raises(TypeError, match="causal must be a bool"):
        c.attention_forward(q, q, q, causal=causal)


def test_from_env_world_of_one_needs_no_root():
    """torchrun --nproc-per-node 1 sets RANK and WORLD_SIZE but no peer is there to meet: a
    world of one runs without STRIA_ROOT."""
    q = np.random.default_rng(0).standard_normal((1, 8, 2, 16), dtype=np.float32)
    with stria.Context.from_env(environ={"RANK": "0", "WORLD_SIZE": "1"}) as c:
        assert (c.rank, c.world_size) == (0, 1)
        out, _ = c.attention_forward(q, q, q)
        assert np.isfinite(out).all()


def test_from_env_rejects_non_integers():
    with pytest.raises(stria.InvalidArgumentError, match="integers"):
        stria.Context.from_env(environ={"RANK": "zero", "WORLD_SIZE": "2", "STRIA_ROOT": "127.0.0.1:1"})


def refusing_port():
    """A bound socket that does not listen (connections to it are refused), and its port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def test_from_env_gives_the_library_the_mapping_s_root(ucx):
    env = {"RANK": "0", "WORLD_SIZE": "1", "STRIA_ROOT": "127.0.0.1:1"}
    with stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S) as c:
        assert (c.rank, c.world_size) == (0, 1)
    assert "STRIA_ROOT" not in os.environ  # put back as it was: absent


def test_from_env_connects_where_the_mapping_says(ucx, monkeypatch):
    """Rank 1 goes to the mapping's STRIA_ROOT, not the process's, and says why it failed there."""
    held, port = refusing_port()
    monkeypatch.setenv("STRIA_ROOT", "127.0.0.1:2")
    env = {"RANK": "1", "WORLD_SIZE": "2", "STRIA_ROOT": f"127.0.0.1:{port}"}
    with held, pytest.raises(stria.TimeoutError, match=rf"127\.0\.0\.1:{port} \(last error: Connection refused\)"):
        stria.Context.from_env(environ=env, timeout_s=1.0)
    assert os.environ["STRIA_ROOT"] == "127.0.0.1:2"


def test_from_env_gives_the_library_the_mapping_s_secret(ucx, monkeypatch):
    env = {"RANK": "0", "WORLD_SIZE": "1", "STRIA_ROOT": "127.0.0.1:1"}
    monkeypatch.setenv("STRIA_SECRET", "not hex")  # hidden from the library: the mapping has none
    stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S).close()
    assert os.environ["STRIA_SECRET"] == "not hex"
    with pytest.raises(stria.InvalidArgumentError, match="STRIA_SECRET is not hexadecimal"):
        stria.Context.from_env(environ=dict(env, STRIA_SECRET="zz" * 16), timeout_s=TIMEOUT_S)
    assert os.environ["STRIA_SECRET"] == "not hex"


def test_from_env_ranks_in_threads(ucx):
    """Ranks of one job created from mappings by threads of one process: the creates wait for each
    other, so their (equal) settings of the environment must not exclude each other."""
    held, port = refusing_port()
    held.close()  # free for rank 0 to listen on
    results = [None, None]

    def rank(r):
        env = {"RANK": str(r), "WORLD_SIZE": "2", "STRIA_ROOT": f"127.0.0.1:{port}", "STRIA_SECRET": "ab" * 16}
        try:
            with stria.Context.from_env(environ=env, timeout_s=TIMEOUT_S, num_threads=1) as c:
                results[r] = (c.rank, c.world_size)
        except Exception as e:  # noqa: BLE001 - reported below
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(0, 2), (1, 2)]
    assert "STRIA_ROOT" not in os.environ and "STRIA_SECRET" not in os.environ


def test_no_error_left_after_success(ctx):
    q, k, v = tensors()
    ctx.attention_forward(q, k, v)
    assert capi.stria_get_last_error() == ""
    assert capi.stria_status_string(capi.STRIA_ERROR_TIMEOUT) != ""


def test_device_and_enum_spellings():
    cpu, cuda = capi.kDLCPU, capi.kDLCUDA
    assert stria.parse_device("cpu") == (cpu, 0)
    assert stria.parse_device("cuda") == (cuda, 0)
    assert stria.parse_device("cuda:3") == (cuda, 3)
    assert stria.parse_device(2) == (cuda, 2)
    assert stria.parse_device((cpu, 0)) == (cpu, 0)
    assert stria.Layout.of("ZigZag") is stria.Layout.ZIGZAG
    assert stria.Layout.of(0) is stria.Layout.CONTIGUOUS
    assert stria.Transport.of("nccl") is stria.Transport.NCCL
    with pytest.raises(ValueError, match="transport"):
        stria.Transport.of("carrier-pigeon")
    with stria.Context(device="cpu:0") as c:
        assert c.device == (cpu, 0) and c.rank == 0 and c.world_size == 1


def test_shard_refuses_a_broadcast_output():
    """An output with stride 0 (torch's expand; numpy's as_strided) would have several tokens
    land on one element: refused, as for the attention outputs; as an input it is fine."""
    full = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)

    def broadcast(a):  # a writable [1, ...] array viewed as [2, ...] with batch stride 0
        return np.lib.stride_tricks.as_strided(a, shape=(2,) + a.shape[1:], strides=(0,) + a.strides[1:])

    with pytest.raises(stria.InvalidArgumentError, match="must not overlap"):
        stria.shard(full, 2, 0, out=broadcast(np.zeros((1, 4, 3), np.float32)))
    with pytest.raises(stria.InvalidArgumentError, match="must not overlap"):
        stria.unshard(np.zeros((2, 4, 3), np.float32), 2, 0, out=broadcast(np.zeros((1, 8, 3), np.float32)))
    local = stria.shard(broadcast(full[:1].copy()), 2, 1)
    assert np.array_equal(local, np.concatenate([full[:1, 1::2]] * 2))


def test_python_side_argument_errors_are_named():
    """What never reaches the library still fails with a message naming the argument."""
    q, k, v = tensors()
    with pytest.raises(TypeError, match=r"attention_forward\(\): argument 'ctx' must be a stria\.Context, not NoneType"):
        stria.attention_forward(None, q, k, v)
    with pytest.raises(TypeError, match=r"attention_backward\(\): argument 'ctx' must be a stria\.Context, not int"):
        stria.attention_backward(3, q, k, v, q, np.zeros((1, 2, 8), np.float32), q)
    with pytest.raises(TypeError, match="unique_id must be the 128 bytes"):
        stria.Context(unique_id="x" * 128)
    with pytest.raises(stria.InvalidArgumentError, match="num_threads 1099511627776 does not fit"):
        stria.Context(num_threads=2**40)
    with pytest.raises(stria.InvalidArgumentError, match="out of range"):
        stria.Context(num_threads=2**20)  # fits a C int: the library's own check


def test_nccl_comm_goes_with_the_nccl_transport():
    """A caller's communicator (stria_context_create_with_nccl_comm) is refused before it is
    touched: with another transport, and (no GPU or a CPU device) by the NCCL module."""
    with pytest.raises(stria.InvalidArgumentError, match="STRIA_TRANSPORT_NCCL"):
        stria.Context(nccl_comm=0x1234)
    with pytest.raises(stria.InvalidArgumentError, match="nccl_comm is NULL"):
        stria.Context(transport="nccl", nccl_comm=0)
    with pytest.raises(TypeError):
        stria.Context(transport="nccl", nccl_comm="0x1234")
    with pytest.raises(stria.StriaError):
        stria.Context(transport="nccl", nccl_comm=0x1234)  # CPU device: the module refuses it
