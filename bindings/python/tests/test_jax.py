"""stria.jax (XLA FFI custom calls) against the float64 reference: a world of one in this process,
rings of threads (a local group) and of processes (UCX) in subprocesses (jax_ring.py), every
layout, causal and not, GQA, float32/bfloat16/float16, forward and gradients, packed documents;
and its errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S
from reference import LAYOUTS, attention_backward_ref, attention_ref, rel_err


def _jax_or_skip():
    """jax, or a skip where it is missing, unless STRIA_REQUIRE_JAX=1 (the test script sets it)."""
    try:
        import jax  # noqa: F401
    except ImportError:
        if os.environ.get("STRIA_REQUIRE_JAX") == "1":
            raise
        pytest.skip("jax is not installed")


_jax_or_skip()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

if os.environ.get("STRIA_REQUIRE_JAX") == "1":
    import stria.jax as sj  # noqa: E402
else:
    sj = pytest.importorskip("stria.jax")  # built only where jaxlib's FFI headers were found
# The tests below are CPU programs with CPU contexts unless they say otherwise; where JAX also has a
# GPU (the GPU run), its default device would be the GPU. The CUDA tests place their arrays there.
jax.config.update("jax_default_device", jax.devices("cpu")[0])
# What a failed custom call raises: JAX's runtime error, or ValueError on some of XLA's execution
# paths (its status-to-exception mapping), with stria's status and message either way.
XLA_ERRORS = (jax.errors.JaxRuntimeError, ValueError)
HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2}


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x as the kernels see it: rounded to dtype, then exactly in float64."""
    return np.asarray(jnp.asarray(x, dtype=dtype).astype(jnp.float32), dtype=np.float64)


@pytest.fixture
def ctx():
    with stria.Context(0, 1, timeout_s=TIMEOUT_S) as c:
        yield c


def inputs(rng, b=2, seq=40, hq=4, hkv=2, d=32):
    q = rng.standard_normal((b, seq, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, seq, hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, seq, hkv, d), dtype=np.float32)
    return q, k, v


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("causal", [True, False])
def test_world_of_one_matches_reference(ctx, rng, dtype, causal):
    """Forward (out, lse) and the gradients of a weighted sum, under jit, against float64."""
    q, k, v = inputs(rng)
    w = rng.standard_normal(q.shape, dtype=np.float32)
    qj, kj, vj = (jnp.asarray(x, dtype=dtype) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1])

    def loss(q, k, v):
        return jnp.sum(sj.ring_attention(q, k, v, ctx, causal=causal).astype(jnp.float32) * w)

    _, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(qj, kj, vj)
    out, lse = jax.jit(lambda q, k, v: sj.attention_forward(ctx, q, k, v, causal=causal))(qj, kj, vj)
    assert out.dtype == jnp.dtype(dtype) and lse.dtype == jnp.float32 and lse.shape == (2, 4, 40)
    qr, kr, vr = (rounded(x, dtype) for x in (q, k, v))
    out_ref, lse_ref = attention_ref(qr, kr, vr, causal, scale)
    grads_ref = attention_backward_ref(qr, kr, vr, w, causal, scale)
    tol = TOLERANCE[dtype]
    assert rel_err(out, out_ref) < tol
    assert rel_err(lse, lse_ref) < 1e-5
    for got, ref in zip(grads, grads_ref):
        assert got.dtype == jnp.dtype(dtype)
        assert rel_err(got, ref) < tol


def test_backward_by_itself_and_an_explicit_scale(ctx, rng):
    q, k, v = inputs(rng, hq=2, hkv=2)
    dout = rng.standard_normal(q.shape, dtype=np.float32)
    out, lse = sj.attention_forward(ctx, q, k, v, causal=True, softmax_scale=0.3)
    dq, dk, dv = sj.attention_backward(ctx, q, k, v, out, lse, dout, causal=True, softmax_scale=0.3)
    for got, ref in zip((dq, dk, dv), attention_backward_ref(q, k, v, dout, True, 0.3)):
        assert rel_err(got, ref) < 1e-5
    assert rel_err(out, attention_ref(q, k, v, True, 0.3)[0]) < 1e-5


def run_ring(mode: str, n: int, layout: str, causal: bool, dtype: str, tmp_path) -> dict[str, np.ndarray]:
    """Every rank's results from jax_ring.py (see there), one dict of arrays named <what><rank>."""
    path = str(tmp_path / "ring.npz")
    flag = "1" if causal else "0"
    base = [sys.executable, os.path.join(HERE, "jax_ring.py"), mode, str(n), layout, flag, dtype, path]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if mode.partition("+")[0] in ("local", "shard_map"):
        procs = [subprocess.Popen(base, env=env)]
    else:
        with socket.socket() as s:  # a free port for rank 0 to listen on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([*base, str(r), str(port)], env=env) for r in range(n)]
    try:
        codes = [p.wait(timeout=2 * TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0] * len(procs)
    files = [path] if mode.partition("+")[0] in ("local", "shard_map") else [path.replace(".npz", f".rank{r}.npz") for r in range(n)]
    results: dict[str, np.ndarray] = {}
    for f in files:
        with np.load(f) as data:
            results.update({name: data[name] for name in data.files})
    return results


def check_ring(results, n: int, layout: str, causal: bool, dtype: str, docs: bool = False, ulysses: int = 1) -> None:
    sys.path.insert(0, HERE)
    import jax_ring

    q, k, v, w = jax_ring.full_inputs()
    q, k, v = (rounded(x, dtype) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1])
    cu = jax_ring.DOCUMENTS if docs else None
    out, lse = attention_ref(q, k, v, causal, scale, cu)
    dq, dk, dv = attention_backward_ref(q, k, v, w, causal, scale, cu)
    tol = TOLERANCE[dtype]
    seq = q.shape[1]
    for r in range(n):
        pos = stria.positions(layout, seq, n, r, ulysses=ulysses)
        assert rel_err(results[f"out{r}"], out[:, pos]) < tol, r
        assert rel_err(results[f"lse{r}"], lse[:, :, pos]) < 1e-5, r
        for name, ref in (("dq", dq), ("dk", dk), ("dv", dv)):
            assert rel_err(results[f"{name}{r}"], ref[:, pos]) < tol, (name, r)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_local_group_of_three_threads(tmp_path, layout, causal):
    check_ring(run_ring("local", 3, layout, causal, "float32", tmp_path), 3, layout, causal, "float32")


def test_local_group_bfloat16(tmp_path):
    check_ring(run_ring("local", 4, "striped", True, "bfloat16", tmp_path), 4, "striped", True, "bfloat16")


@pytest.mark.parametrize(("mode", "n", "layout", "causal"), [
    ("local", 3, "striped", True), ("local", 4, "zigzag", False), ("shard_map", 3, "contiguous", True),
    ("shard_map", 2, "zigzag", True)])
def test_documents_over_a_ring(tmp_path, mode, n, layout, causal):
    """Packed documents over rings of threads and under shard_map (the boundaries replicated)."""
    results = run_ring(mode + "+docs", n, layout, causal, "float32", tmp_path)
    check_ring(results, n, layout, causal, "float32", docs=True)


@pytest.mark.parametrize(("mode", "layout", "causal", "dtype"), [
    ("local", "zigzag", True, "float32"), ("local", "striped", False, "bfloat16"), ("shard_map", "striped", True,
                                                                                    "float32")])
def test_a_grid_under_jit_and_shard_map(tmp_path, mode, layout, causal, dtype):
    """A local group of 4 as a grid of all-to-all groups of 2 (Context.ulysses): jit, grad and
    shard_map are the same as on a ring; the tokens by the grid's positions."""
    results = run_ring(mode + "+grid2", 4, layout, causal, dtype, tmp_path)
    check_ring(results, 4, layout, causal, dtype, ulysses=2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shard_map_over_jax_devices(tmp_path, layout):
    """A whole LocalGroup under shard_map, rank r on JAX device r: JAX's own SPMD over a mesh."""
    check_ring(run_ring("shard_map", 3, layout, True, "float32", tmp_path), 3, layout, True, "float32")


def test_shard_map_of_eight_devices_bfloat16(tmp_path):
    check_ring(run_ring("shard_map", 8, "zigzag", False, "bfloat16", tmp_path), 8, "zigzag", False, "bfloat16")


def test_a_context_of_a_ring_serves_one_device(tmp_path, ucx):
    """Two UCX processes of two JAX devices each, each calling its one Context from both devices
    (data parallel over B): the second device's calls would pair with the peer's calls for other
    batch shards in any order, so they fail, naming the devices, rather than return wrong numbers."""
    path = str(tmp_path / "two.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, os.path.join(HERE, "jax_ring.py"), "two_devices", "2", "striped", "1", "float32", path]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([*base, str(r), str(port)], env=env) for r in range(2)]
    try:
        codes = [p.wait(timeout=2 * TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0]
    for r in range(2):
        with open(path.replace(".json", f".rank{r}.json")) as f:
            outcomes = json.load(f)
        assert len(outcomes) == 3
        for o in outcomes:
            assert "serves one XLA device" in o and "now from device" in o, o


def test_ring_of_three_processes_over_ucx(tmp_path, ucx):
    """The production shape: one rank per process, a transport between processes."""
    check_ring(run_ring("ucx", 3, "striped", True, "float32", tmp_path), 3, "striped", True, "float32")


def test_ring_of_three_processes_of_a_jax_distributed_job(tmp_path, ucx):
    """A JAX multi-process job: the contexts come from jax.distributed's coordination service
    (stria.jax.context_from_distributed), the blocks travel over UCX."""
    check_ring(run_ring("distributed", 3, "zigzag", True, "float32", tmp_path), 3, "zigzag", True, "float32")


def test_context_from_distributed_needs_a_job():
    with pytest.raises(RuntimeError, match="jax.distributed.initialize"):
        sj.context_from_distributed()


def test_on_a_gpu_with_xla_s_stream(rng):
    """The CUDA handlers: XLA's device buffers and stream, bfloat16, forward and gradients."""
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")
    try:
        ctx = stria.Context(0, 1, device=f"cuda:{device.id}", timeout_s=TIMEOUT_S)
    except (stria.UnsupportedError, stria.CudaError) as e:
        pytest.skip(f"stria has no CUDA backend here: {e}")
    q, k, v = inputs(rng, seq=256, d=64)
    w = rng.standard_normal(q.shape, dtype=np.float32)
    with ctx:
        qj, kj, vj = (jax.device_put(jnp.asarray(x, dtype=jnp.bfloat16), device) for x in (q, k, v))

        def loss(q, k, v):
            return jnp.sum(sj.ring_attention(q, k, v, ctx).astype(jnp.float32) * w)

        out = jax.jit(lambda q, k, v: sj.ring_attention(q, k, v, ctx))(qj, kj, vj)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qj, kj, vj)
        qr, kr, vr = (rounded(x, "bfloat16") for x in (q, k, v))
        scale = 1 / np.sqrt(q.shape[-1])
        assert rel_err(np.asarray(out.astype(jnp.float32)), attention_ref(qr, kr, vr, True, scale)[0]) < 2e-2
        for got, ref in zip(grads, attention_backward_ref(qr, kr, vr, w, True, scale)):
            assert rel_err(np.asarray(got.astype(jnp.float32)), ref) < 2e-2
        # Packed documents: the boundaries are XLA's device buffer, read on XLA's stream.
        cu = np.array([[0, 100, 101, 256], [0, 64, 200, 256]])

        def doc_loss(q, k, v, cu):
            return jnp.sum(sj.ring_attention(q, k, v, ctx, cu_seqlens=cu).astype(jnp.float32) * w)

        cu_d = jax.device_put(jnp.asarray(cu), device)
        out = jax.jit(lambda q, k, v, cu: sj.ring_attention(q, k, v, ctx, cu_seqlens=cu))(qj, kj, vj, cu_d)
        grads = jax.jit(jax.grad(doc_loss, argnums=(0, 1, 2)))(qj, kj, vj, cu_d)
        ref_out = attention_ref(qr, kr, vr, True, scale, cu)[0]
        assert rel_err(np.asarray(out.astype(jnp.float32)), ref_out) < 2e-2
        for got, ref in zip(grads, attention_backward_ref(qr, kr, vr, w, True, scale, cu)):
            assert rel_err(np.asarray(got.astype(jnp.float32)), ref) < 2e-2


def test_a_context_of_the_other_platform_is_named(rng):
    """A CPU context called from a program on the GPU, and a GPU context from one on the CPU: an
    error that says which platform each is on and what to change, not the library's own refusal
    of the buffers."""
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")
    q, k, v = inputs(rng)
    with stria.Context(0, 1, timeout_s=TIMEOUT_S) as cpu_ctx:
        on_gpu = [jax.device_put(x, device) for x in (q, k, v)]
        with pytest.raises(XLA_ERRORS, match=r"runs on XLA's CUDA device \d+ but its stria context is a CPU context"):
            jax.block_until_ready(jax.jit(lambda q, k, v: sj.ring_attention(q, k, v, cpu_ctx))(*on_gpu))
    try:
        gpu_ctx = stria.Context(0, 1, device=f"cuda:{device.id}", timeout_s=TIMEOUT_S)
    except (stria.UnsupportedError, stria.CudaError) as e:
        pytest.skip(f"stria has no CUDA backend here: {e}")
    with gpu_ctx:
        with pytest.raises(XLA_ERRORS, match=r"runs on XLA's CPU but its stria context is on cuda:\d+"):
            jax.block_until_ready(jax.jit(lambda q, k, v: sj.ring_attention(q, k, v, gpu_ctx))(q, k, v))


def test_shard_map_over_two_gpus():
    """A local group on two GPUs under shard_map: the CUDA handlers find each device's rank."""
    try:
        gpus = jax.devices("cuda")
    except RuntimeError:
        pytest.skip("JAX has no CUDA device here")
    if len(gpus) < 2:
        pytest.skip("needs two CUDA devices")
    try:
        group = stria.local_group(2, devices=[f"cuda:{d.id}" for d in gpus[:2]], timeout_s=TIMEOUT_S)
    except (stria.UnsupportedError, stria.CudaError) as e:
        pytest.skip(f"stria has no CUDA backend here: {e}")
    sys.path.insert(0, HERE)
    import jax_ring

    with group:
        results = jax_ring.run_shard_map(group, "striped", True, "bfloat16")
    merged = {f"{name}{r}": x for r, res in enumerate(results) for name, x in res.items()}
    check_ring(merged, 2, "striped", True, "bfloat16")


# ---- call tags ---------------------------------------------------------------------------------


def _tags(lowered) -> list[int]:
    """The tag attributes of a lowered program's stria calls, in program order."""
    import re

    return [int(t) for t in re.findall(r"tag = (\d+) : ui64", lowered.as_text())]


def test_each_call_site_has_its_own_tag(ctx, rng):
    """Two sites in one program get two tags, and so do two calls of one site in a loop; tracing
    again gives the same tags; ring_attention's forward and backward share theirs."""
    q, k, v = inputs(rng)

    def two_sites(q, k, v):
        a = sj.ring_attention(q, k, v, ctx)
        b = sj.ring_attention(q, k, v, ctx)
        return a + b

    def layers(q, k, v):
        for _ in range(3):
            q = sj.ring_attention(q, k, v, ctx)
        return q

    a, b = _tags(jax.jit(two_sites).lower(q, k, v))
    assert a != b and a > 0 and b > 0
    assert _tags(jax.jit(two_sites).lower(q, k, v)) == [a, b]
    loop = _tags(jax.jit(layers).lower(q, k, v))
    assert len(set(loop)) == 3 and a not in loop and b not in loop
    assert _tags(jax.jit(layers).lower(q, k, v)) == loop
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(sj.ring_attention(q, k, v, ctx)), argnums=(0, 1, 2)))
    forward_tag, backward_tag = _tags(grad.lower(q, k, v))
    assert forward_tag == backward_tag > 0
    explicit = jax.jit(lambda q, k, v: sj.attention_forward(ctx, q, k, v, tag=12345)[0])
    assert _tags(explicit.lower(q, k, v)) == [12345]
    untagged = jax.jit(lambda q, k, v: sj.attention_forward(ctx, q, k, v, tag=0)[0])
    assert _tags(untagged.lower(q, k, v)) == [0]


def test_tags_through_nested_transformations(ctx, rng):
    """jax.grad or jax.vmap traces its function afresh each time it is called: calls at two
    places, or in a loop, still get tags of their own (counted in the program being built, the
    caller's frames hashed up to the outermost jit); and a call on constants inside jit is
    staged, so it is tagged too."""
    q, k, v = inputs(rng)

    def loss(q):
        return jnp.sum(sj.ring_attention(q, k, v, ctx))

    def grads_in_a_loop(q):
        for _ in range(3):
            q = q + jax.grad(loss)(q)
        return q

    def vmaps_at_two_places(q):
        a = jax.vmap(lambda x: sj.ring_attention(x, k, v, ctx))(q[None])
        b = jax.vmap(lambda x: sj.ring_attention(x, k, v, ctx))(q[None])
        return a + b

    loop = _tags(jax.jit(grads_in_a_loop).lower(q))  # a forward and a backward per grad
    assert len(loop) == 6 and len(set(loop)) == 3 and all(t > 0 for t in loop), loop
    assert _tags(jax.jit(grads_in_a_loop).lower(q)) == loop
    a, b = _tags(jax.jit(vmaps_at_two_places).lower(q))
    assert a != b and a > 0 and b > 0
    constants = _tags(jax.jit(lambda: sj.attention_forward(ctx, q, k, v)[0]).lower())
    assert len(constants) == 1 and constants[0] > 0


def test_calls_of_different_sites_fail_instead_of_pairing(tmp_path):
    """Rank 0 calls from one site, the others from another: every rank raises, naming its own
    site and both tags, and no block moves; then a call from one site works on every rank."""
    import json

    path = str(tmp_path / "outcomes.json")
    script = os.path.join(HERE, "jax_ring.py")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, script, "mispaired", "3", "striped", "1", "float32", path], env=env,
                   check=True, timeout=2 * TIMEOUT_S)
    with open(path) as f:
        outcomes = json.load(f)
    assert len(outcomes) == 3
    for rank, (first, second) in enumerate(outcomes):
        assert "INVALID_ARGUMENT" in first and "paired different calls" in first, (rank, first)
        site = "site_a" if rank == 0 else "site_b"
        assert "[called at jax_ring.py:" in first and f"({site})" in first, (rank, first)
        assert second == "ok", (rank, second)


def test_a_scale_below_float32_s_range_is_refused(ctx, rng):
    """The call carries the scale as a float32: a positive one that would round to 0 (which
    stria reads as 1/sqrt(D)) raises instead of silently meaning the default."""
    q, k, v = inputs(rng)
    for bad in (1e-46, 1e39, 0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="softmax_scale must be"):
            sj.ring_attention(q, k, v, ctx, softmax_scale=bad)


def test_a_local_group_needs_a_shard_map_of_its_size(rng):
    """A LocalGroup of n ranks outside a shard_map of n shards would leave some rank uncalled and
    the others waiting for it until their timeout: refused when traced."""
    q, k, v = inputs(rng)
    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        with pytest.raises(ValueError, match="LocalGroup of 2 ranks is called under no shard_map"):
            jax.jit(lambda q: sj.ring_attention(q, k, v, group))(q)


def test_a_collected_group_leaves_no_binding_behind(rng):
    """Bindings are keyed by the object, weakly: a group collected while its contexts stay open
    takes its entry with it (keyed by id(), a new object given the same id was served by the old
    group's contexts, and waited for their peers until its timeout)."""
    import gc

    group = stria.local_group(2, timeout_s=TIMEOUT_S)
    contexts = list(group)
    try:
        sj._key(group, "test")
        assert group in sj._keys
        before = len(sj._keys)
        del group
        gc.collect()
        assert len(sj._keys) == before - 1
    finally:
        for c in contexts:
            c.close()


def test_a_tag_must_fit_xla_s_attribute(ctx, rng):
    q, k, v = inputs(rng)
    for bad in (-1, 2**63, True, 1.5):
        with pytest.raises(ValueError, match="tag must be"):
            sj.ring_attention(q, k, v, ctx, tag=bad)


# ---- errors ----------------------------------------------------------------------------------


def test_the_library_s_message_reaches_the_caller(ctx, rng):
    q, k, v = inputs(rng, hq=3, hkv=2)  # 3 query heads over 2 K/V heads
    with pytest.raises(XLA_ERRORS, match=r"INVALID_ARGUMENT: stria attention_forward: .*head"):
        jax.block_until_ready(sj.attention_forward(ctx, q, k, v))


@pytest.mark.parametrize("dtype", ["int32", "bool", "float8_e4m3fn", "complex64"])
def test_an_unsupported_dtype_is_named(ctx, rng, dtype):
    """Refused when traced, in JAX's own names (the handler sees only XLA's element types, and
    used to call most of them unknown)."""
    q, k, v = (jnp.asarray(x).astype(dtype) for x in inputs(rng))
    for call in (lambda: sj.attention_forward(ctx, q, k, v), lambda: sj.ring_attention(q, k, v, ctx)):
        with pytest.raises(ValueError, match=rf"q has dtype {dtype}; stria takes float32, float16, bfloat16"):
            jax.jit(call)()


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_fp8_forward_matches_reference(ctx, rng, out_dtype):
    """float8_e4m3fn q, k and v with a per-head descale for q and one for k, under jit, against
    float64 on the values the codes stand for; a descale of the wrong shape is the library's error."""
    q, k, v = inputs(rng)
    q_scale = np.abs(q).max(axis=(0, 1, 3)) / 448
    k_scale = np.array([np.abs(k).max() / 448], np.float32)
    q8 = jnp.asarray(q / q_scale[None, None, :, None]).astype(jnp.float8_e4m3fn)
    k8 = jnp.asarray(k / k_scale).astype(jnp.float8_e4m3fn)
    v8 = jnp.asarray(v).astype(jnp.float8_e4m3fn)
    seen = [np.asarray(x.astype(jnp.float32) * s, np.float64)
            for x, s in ((q8, q_scale[None, None, :, None]), (k8, k_scale), (v8, 1.0))]
    out, lse = jax.jit(lambda q, k, v: sj.attention_forward_fp8(ctx, q, k, v, q_descale=q_scale, k_descale=k_scale,
                                                                out_dtype=out_dtype))(q8, k8, v8)
    assert out.dtype == jnp.dtype(out_dtype) and lse.dtype == jnp.float32
    out_ref, lse_ref = attention_ref(*seen, True, 1 / np.sqrt(q.shape[-1]))
    assert rel_err(out, out_ref) < TOLERANCE[out_dtype]
    # In bfloat16 the scaled inputs are rounded to it, which moves the scores (and the LSE) a little.
    assert rel_err(lse, lse_ref) < (1e-5 if out_dtype == "float32" else 1e-3)
    with pytest.raises(XLA_ERRORS, match=r"INVALID_ARGUMENT: stria attention_forward: .*params->q_descale has shape"):
        jax.block_until_ready(sj.attention_forward_fp8(ctx, q8, k8, v8, q_descale=np.ones(3, np.float32)))
    with pytest.raises(ValueError, match=r"q has dtype float32; it must be float8_e4m3fn"):
        sj.attention_forward_fp8(ctx, jnp.asarray(q), k8, v8)


def test_a_closed_context_is_not_touched(rng):
    q, k, v = inputs(rng)
    c = stria.Context(0, 1, timeout_s=TIMEOUT_S)
    f = jax.jit(lambda q, k, v: sj.ring_attention(q, k, v, c))
    jax.block_until_ready(f(q, k, v))
    c.close()
    with pytest.raises(XLA_ERRORS, match="FAILED_PRECONDITION: stria: the context .* is closed"):
        jax.block_until_ready(f(q, k, v))  # the cached executable, with the closed context's key
    with pytest.raises(ValueError, match="closed"):
        sj.ring_attention(q, k, v, c)  # a new trace


def test_a_local_group_needs_synchronous_dispatch(rng):
    """Under JAX's default asynchronous CPU dispatch, a local group's ranks would queue on XLA's
    pool and time out: refused at once, with the setting to change (jax_ring.py runs them)."""
    q, k, v = inputs(rng)
    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        with pytest.raises(ValueError, match="jax_cpu_enable_async_dispatch"):
            sj.ring_attention(q, k, v, group[0])


def test_python_side_checks(ctx, rng):
    q, k, v = inputs(rng)
    with pytest.raises(TypeError, match="stria.Context"):
        sj.ring_attention(q, k, v, "ctx")
    with pytest.raises(ValueError, match=r"q must be \[B, L, H, D\]"):
        sj.attention_forward(ctx, q[0], k, v)
    with pytest.raises(ValueError, match="softmax_scale"):
        sj.ring_attention(q, k, v, ctx, softmax_scale=-1.0)
    with pytest.raises(ValueError):
        sj.ring_attention(q, k, v, ctx, layout="diagonal")


def test_second_order_gradients_raise(ctx, rng):
    """stria's backward is not itself differentiable: differentiating it must fail, not give 0."""
    q, k, v = inputs(rng)

    def grad_norm(q):
        g = jax.grad(lambda q: jnp.sum(sj.ring_attention(q, k, v, ctx) ** 2))(q)
        return jnp.sum(g**2)

    with pytest.raises(Exception, match="(?i)differentiat|jvp|transpose"):
        jax.grad(grad_norm)(q)


def test_vmap_folds_the_mapped_axes_into_the_batch(ctx, rng):
    """vmap (twice nested; over q alone, k and v shared) and per-example gradients (vmap of
    grad): one call for all mapped elements, against the reference element by element."""
    q = rng.standard_normal((2, 3, 1, 16, 4, 8), dtype=np.float32)  # two mapped axes, then [B, L, Hq, D]
    k = rng.standard_normal((2, 3, 1, 16, 2, 8), dtype=np.float32)
    v = rng.standard_normal((2, 3, 1, 16, 2, 8), dtype=np.float32)
    w = rng.standard_normal(q.shape[2:], dtype=np.float32)
    scale = 1 / np.sqrt(q.shape[-1])

    def attend(q, k, v):
        return sj.attention_forward(ctx, q, k, v)

    out, lse = jax.jit(jax.vmap(jax.vmap(attend)))(q, k, v)
    assert out.shape == q.shape and lse.shape == (2, 3, 1, 4, 16)
    shared = jax.jit(jax.vmap(lambda q: sj.ring_attention(q, k[0, 0], v[0, 0], ctx)))(q[0])

    def loss(q, k, v):
        return jnp.sum(sj.ring_attention(q, k, v, ctx) * w)

    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(q[1], k[1], v[1])
    for i in range(2):
        for j in range(3):
            ref_out, ref_lse = attention_ref(q[i, j], k[i, j], v[i, j], True, scale)
            assert rel_err(out[i, j], ref_out) < 1e-5 and rel_err(lse[i, j], ref_lse) < 1e-5, (i, j)
    for j in range(3):
        assert rel_err(shared[j], attention_ref(q[0, j], k[0, 0], v[0, 0], True, scale)[0]) < 1e-5, j
        ref_grads = attention_backward_ref(q[1, j], k[1, j], v[1, j], w, True, scale)
        for got, ref in zip(grads, ref_grads):
            assert rel_err(got[j], ref) < 1e-5, j


def test_the_plain_api_points_jax_arrays_to_stria_jax(ctx):
    """JAX arrays are immutable: the plain API cannot write its outputs into new ones, and says
    where attention on them belongs."""
    q = jnp.ones((1, 8, 2, 16))
    with pytest.raises(TypeError, match=r"pass the outputs explicitly .*stria\.jax"):
        ctx.attention_forward(q, q, q)


def test_under_jax_checkpoint(ctx, rng):
    """jax.checkpoint runs the forward again in the backward pass: the same gradients."""
    q, k, v = inputs(rng)

    def loss(q, k, v):
        return jnp.sum(sj.ring_attention(q, k, v, ctx) ** 2)

    plain = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(plain, remat):
        assert rel_err(b, a) < 1e-6


# Packed documents: one row for every batch row, or a row each (an empty document included).
JAX_DOCUMENTS = {
    "shared": np.array([0, 7, 23, 40]),
    "per_row": np.array([[0, 12, 12, 40], [0, 1, 39, 40]]),
}


@pytest.mark.parametrize("docs", sorted(JAX_DOCUMENTS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False])
def test_documents_world_of_one(ctx, rng, docs, dtype, causal):
    """A document mask (cu_seqlens traced as a JAX array: the jitted function is not retraced
    for new boundaries) against the float64 reference, forward and gradients."""
    q, k, v = inputs(rng)
    w = rng.standard_normal(q.shape, dtype=np.float32)
    cu = JAX_DOCUMENTS[docs]
    qj, kj, vj = (jnp.asarray(x, dtype=dtype) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1])

    def loss(q, k, v, cu):
        out = sj.ring_attention(q, k, v, ctx, causal=causal, cu_seqlens=cu)
        return jnp.sum(out.astype(jnp.float32) * w)

    _, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(qj, kj, vj, jnp.asarray(cu))
    forward = jax.jit(lambda q, k, v, cu: sj.attention_forward(ctx, q, k, v, causal=causal, cu_seqlens=cu))
    out, lse = forward(qj, kj, vj, jnp.asarray(cu))
    qr, kr, vr = (rounded(x, dtype) for x in (q, k, v))
    out_ref, lse_ref = attention_ref(qr, kr, vr, causal, scale, cu)
    grads_ref = attention_backward_ref(qr, kr, vr, w, causal, scale, cu)
    tol = TOLERANCE[dtype]
    assert rel_err(out, out_ref) < tol
    assert rel_err(lse, lse_ref) < 1e-5
    for got, ref in zip(grads, grads_ref):
        assert rel_err(got, ref) < tol
    # The mask matters here: without it the numbers differ.
    assert rel_err(out, attention_ref(qr, kr, vr, causal, scale)[0]) > 10 * tol
    # Other boundaries through the same compiled function.
    other = np.array([0, 40]) if docs == "per_row" else np.array([[0, 3, 40, 40], [0, 20, 21, 40]])
    out2, _ = forward(qj, kj, vj, jnp.asarray(other))
    assert rel_err(out2, attention_ref(qr, kr, vr, causal, scale, other)[0]) < tol


def test_documents_as_int64_and_from_numpy(ctx, rng):
    """With JAX's 64-bit integers the boundaries pass as they are; numpy and lists work too, and
    the backward by itself takes the forward's boundaries."""
    q, k, v = inputs(rng, hq=2, hkv=1)
    dout = rng.standard_normal(q.shape, dtype=np.float32)
    cu = [0, 9, 31, 40]
    ref_out = attention_ref(q, k, v, True, 1 / np.sqrt(32), cu)[0]
    ref_grads = attention_backward_ref(q, k, v, dout, True, 1 / np.sqrt(32), cu)
    with jax.enable_x64(True):
        cu64 = jnp.asarray(cu, dtype=jnp.int64)
        assert cu64.dtype == jnp.int64
        out, lse = jax.jit(lambda q, cu: sj.attention_forward(ctx, q, k, v, cu_seqlens=cu))(q, cu64)
        assert rel_err(out, ref_out) < 1e-5
    out, lse = sj.attention_forward(ctx, q, k, v, cu_seqlens=cu)
    assert rel_err(out, ref_out) < 1e-5
    grads = sj.attention_backward(ctx, q, k, v, out, lse, dout, cu_seqlens=np.array(cu, np.uint16))
    for got, ref in zip(grads, ref_grads):
        assert rel_err(got, ref) < 1e-5


def test_documents_under_vmap(ctx, rng):
    """vmap folds the mapped axis into B, the boundaries' rows with it: each element its own."""
    q = rng.standard_normal((3, 1, 16, 2, 8), dtype=np.float32)
    cu = np.array([[0, 5, 16, 16], [0, 1, 2, 16], [0, 16, 16, 16]])
    out, _ = jax.jit(jax.vmap(lambda q, cu: sj.attention_forward(ctx, q, q, q, cu_seqlens=cu)))(q, cu)
    for i in range(3):
        ref = attention_ref(q[i], q[i], q[i], True, 1 / np.sqrt(8), cu[i])[0]
        assert rel_err(out[i], ref) < 1e-5, i


def test_documents_bad_boundaries(ctx, rng):
    q, k, v = inputs(rng)  # B = 2, L = 40
    with pytest.raises(TypeError, match="cu_seqlens must hold integers"):
        sj.ring_attention(q, k, v, ctx, cu_seqlens=np.array([0.0, 40.0]))
    # One row for two batch rows: a 1-D array means every row, as in the rest of the package.
    for bad in (np.array([40]), np.zeros((3, 3), np.int32), np.zeros((2, 2, 2), np.int32), np.array([[0, 40]])):
        with pytest.raises(ValueError, match=r"cu_seqlens must be \[n \+ 1\] or \[B, n \+ 1\]"):
            sj.attention_forward(ctx, q, k, v, cu_seqlens=bad)
    forward = jax.jit(lambda q, cu: sj.attention_forward(ctx, q, k, v, cu_seqlens=cu))
    for bad, needle in (
        ([0, 30, 20, 40], "decreases at entry 2"),
        ([1, 40], "starts at 1"),
        ([0, 39], "ends at 39"),
        ([[0, 40], [0, 41]], "row 1 ends at 41"),
    ):
        with pytest.raises(XLA_ERRORS, match=needle):
            jax.block_until_ready(forward(q, jnp.asarray(bad)))
    # The context is fine afterwards.
    out, _ = forward(q, jnp.asarray([0, 40]))
    assert rel_err(out, attention_ref(q, k, v, True, 1 / np.sqrt(32))[0]) < 1e-5


@pytest.mark.parametrize(("causal", "window", "docs"), [(True, (9, -1), None), (False, (6, 3), "per_row")])
def test_sliding_window_world_of_one(ctx, rng, causal, window, docs):
    """window=(left, right) (static), alone and with documents, forward and gradients under jit."""
    q, k, v = inputs(rng)
    w = rng.standard_normal(q.shape, dtype=np.float32)
    cu = None if docs is None else JAX_DOCUMENTS[docs]
    scale = 1 / np.sqrt(q.shape[-1])

    def loss(q, k, v):
        return jnp.sum(sj.ring_attention(q, k, v, ctx, causal=causal, cu_seqlens=cu, window=window) * w)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    out, lse = jax.jit(lambda q: sj.attention_forward(ctx, q, k, v, causal=causal, cu_seqlens=cu, window=window))(q)
    out_ref, lse_ref = attention_ref(q, k, v, causal, scale, cu, window)
    assert rel_err(out, out_ref) < 1e-5 and rel_err(lse, lse_ref) < 1e-5
    for got, ref in zip(grads, attention_backward_ref(q, k, v, w, causal, scale, cu, window)):
        assert rel_err(got, ref) < 1e-5
    assert rel_err(out, attention_ref(q, k, v, causal, scale, cu)[0]) > 1e-3  # the window matters
    with pytest.raises(ValueError, match="window right"):
        sj.ring_attention(q, k, v, ctx, window=(3, -4))


def _dense_with_mods(q, k, v, sinks, causal, softcap):
    """Attention of the whole sequence in plain JAX, with softcap * tanh(s / softcap) on the scores
    and the sinks as one more softmax column that carries no value: the reference JAX's own
    autodiff differentiates (in float64, under enable_x64)."""
    group = q.shape[2] // k.shape[2]
    kk, vv = (jnp.repeat(x, group, axis=2) for x in (k, v))
    s = jnp.einsum("bihd,bjhd->bhij", q, kk) / np.sqrt(q.shape[-1])
    s = softcap * jnp.tanh(s / softcap)
    n = q.shape[1]
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    z = jnp.broadcast_to(sinks[None, :, None, None], (*s.shape[:3], 1))
    p = jax.nn.softmax(jnp.concatenate([s, z], axis=-1), axis=-1)[..., :n]
    return jnp.einsum("bhij,bjhd->bihd", p, vv)


@pytest.mark.parametrize("causal", [True, False])
def test_softcap_and_sinks_under_jit_and_grad(ctx, rng, causal):
    """ring_attention with a softcap and sinks, differentiated in q, k, v and the sinks (a
    bfloat16 weight, cast inside), against plain JAX's attention in float64."""
    q, k, v = (2 * x for x in inputs(rng))
    w = rng.standard_normal(q.shape, dtype=np.float32)
    sinks = jnp.asarray(rng.uniform(-0.5, 4.0, q.shape[2]), dtype=jnp.bfloat16)

    def loss(q, k, v, z):
        out = sj.ring_attention(q, k, v, ctx, causal=causal, softcap=5.0, sinks=z)
        return jnp.sum(out * w)

    _, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, sinks)
    assert grads[3].dtype == jnp.bfloat16 and grads[3].shape == (q.shape[2],)
    # The reference alone runs in float64 (jax.enable_x64; older JAX has it in jax.experimental).
    enable_x64 = jax.enable_x64 if hasattr(jax, "enable_x64") else __import__("jax.experimental").experimental.enable_x64
    with enable_x64(True):
        args64 = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, k, v, sinks.astype(jnp.float32))]
        ref = jax.grad(lambda *a: jnp.sum(_dense_with_mods(*a, causal, 5.0) * w), argnums=(0, 1, 2, 3))(*args64)
        out_ref = _dense_with_mods(*args64, causal, 5.0)
    out, lse = sj.attention_forward(ctx, q, k, v, causal=causal, softcap=5.0, sinks=sinks)
    assert rel_err(out, np.asarray(out_ref)) < 1e-5
    for got, want in zip(grads[:3], ref[:3]):
        assert rel_err(got, np.asarray(want)) < 1e-5
    # The sinks' gradient comes back in their own bfloat16.
    assert rel_err(np.asarray(grads[3], np.float32), np.asarray(ref[3])) < 1e-2
    *_, dz = sj.attention_backward(ctx, q, k, v, out, lse, w, causal=causal, softcap=5.0, sinks=sinks)
    assert dz.dtype == jnp.float32 and rel_err(dz, np.asarray(ref[3])) < 1e-5


def test_sinks_under_vmap_are_refused(ctx, rng):
    q, k, v = inputs(rng)
    z = jnp.zeros(q.shape[2])
    f = jax.vmap(lambda q, k, v: sj.ring_attention(q, k, v, ctx, sinks=z))
    with pytest.raises(Exception, match="vmap"):
        jax.block_until_ready(f(q[None], k[None], v[None]))
