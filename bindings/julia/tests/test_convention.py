"""Stria.jl's conventions, run against libstria from Python (no Julia here).

The Julia layer passes a column-major array of size (D, H, L, B) as the C tensor [B, L, H, D]
by reversing its shape and strides (tensors.jl, TensorRef), reads lse as (L, Hq, B), maps a
Julia dimension `dims` to the C API's seq_dim = ndims - dims (layout.jl, _seq_dim), reads
stria_analyze_balance_steps' buffer as a column-major (N, N) matrix w[r, s], and passes a plan's
boundaries as an (n + 1, B) matrix and reads its positions as a (local_len, B) one (plan.jl).
This file does exactly the same with Fortran-ordered numpy arrays through ctypes, with the
structs built from layout_table.json (what LibStria.jl assumes), and checks the results against
a float64 dense reference of the whole sequence: if the convention or a layout were wrong, these
would fail.

Needs STRIA_LIB_PATH (a built libstria.so.0) and numpy; skipped otherwise.
"""

import ctypes
import json
import os
import threading
import unittest

try:
    import numpy as np
except ImportError:  # pragma: no cover - the test script installs numpy
    np = None

JULIA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_PATH = os.environ.get("STRIA_LIB_PATH")

# Julia primitive -> ctypes, for the types layout_table.json uses.
CTYPES = {
    "Cint": ctypes.c_int, "Cuint": ctypes.c_uint, "Csize_t": ctypes.c_size_t, "Cdouble": ctypes.c_double,
    "Cfloat": ctypes.c_float, "UInt8": ctypes.c_uint8, "UInt16": ctypes.c_uint16, "Int64": ctypes.c_int64,
    "UInt64": ctypes.c_uint64, "Cchar": ctypes.c_char,
}


def load_abi():
    """ctypes mirrors of LibStria.jl's structs and functions, from layout_table.json."""
    with open(os.path.join(JULIA_DIR, "layout_table.json"), encoding="utf-8") as f:
        table = json.load(f)
    aliases = {a["julia"]: a["julia_type"] for a in table["aliases"]}
    structs = {}

    def ctype(julia_type):
        julia_type = aliases.get(julia_type, julia_type)
        if julia_type.startswith("Ptr{"):
            return ctypes.c_void_p
        if julia_type.startswith("NTuple{"):
            count, element = julia_type[len("NTuple{"):-1].split(", ")
            return ctype(element) * int(count)
        return structs.get(julia_type) or CTYPES[julia_type]

    for entry in table["structs"]:
        fields = [(f["name"], ctype(f["julia_type"])) for f in entry["fields"]]
        structs[entry["julia"]] = type(entry["julia"], (ctypes.Structure,), {"_fields_": fields})
        assert ctypes.sizeof(structs[entry["julia"]]) == entry["size"], entry["julia"]
    lib = ctypes.CDLL(LIB_PATH)
    for entry in table["functions"]:
        fn = getattr(lib, entry["name"])
        fn.restype = ctype(entry["return"])
        fn.argtypes = [ctype(a["julia_type"]) for a in entry["args"]]
    consts = {c["name"]: c["value"] for c in table["constants"]}
    return lib, structs, consts


class Stria:
    """The Julia layer's logic, line for line where it matters."""

    def __init__(self):
        self.lib, self.s, self.c = load_abi()

    def call(self, status, func):
        if status != self.c["STRIA_SUCCESS"]:
            raise RuntimeError(f"{func}: {self.last_error()}")

    def last_error(self):
        return ctypes.string_at(self.lib.stria_get_last_error()).decode()

    def initialized(self, name, init):
        # _initialized: a roomy buffer for a newer, longer struct; keep our prefix, our size.
        buffer = ctypes.create_string_buffer(4096)
        self.call(init(ctypes.addressof(buffer)), init.__name__)
        value = self.s[name].from_buffer_copy(buffer.raw[:ctypes.sizeof(self.s[name])])
        value.struct_size = ctypes.sizeof(self.s[name])
        return value

    def dltype(self, array):
        if array.dtype == np.float32:
            return self.c["kDLFloat"], 32
        if array.dtype == np.float16:
            return self.c["kDLFloat"], 16
        if array.dtype == np.uint16:  # bfloat16 storage
            return self.c["kDLBfloat"], 16
        if array.dtype == np.int64:
            return self.c["kDLInt"], 64
        if array.dtype == np.int32:
            return self.c["kDLInt"], 32
        raise TypeError(array.dtype)

    def tensor(self, a):
        # TensorRef: the Julia array (n1, ..., nN) is the C tensor [nN, ..., n1], strides reversed.
        n = a.ndim
        shape = (ctypes.c_int64 * n)(*[a.shape[n - 1 - i] for i in range(n)])
        strides = (ctypes.c_int64 * n)(*[a.strides[n - 1 - i] // a.itemsize for i in range(n)])
        t = self.s["DLTensor"]()
        t.data = a.ctypes.data
        t.device = self.s["DLDevice"](self.c["kDLCPU"], 0)
        t.ndim = n
        code, bits = self.dltype(a)
        t.dtype = self.s["DLDataType"](code, bits, 1)
        t.shape = ctypes.cast(shape, ctypes.c_void_p)
        t.strides = ctypes.cast(strides, ctypes.c_void_p)
        t.byte_offset = 0
        return (t, shape, strides, a)  # everything the pointers point into stays alive

    @staticmethod
    def ptr(tensor_ref):
        return ctypes.addressof(tensor_ref[0])

    def local_group(self, n):
        config = self.initialized("stria_context_config_t", self.lib.stria_context_config_init)
        config.num_threads = 1
        handles = (ctypes.c_void_p * n)()
        self.call(self.lib.stria_context_create_local_group(ctypes.addressof(config), n, handles), "local_group")
        return list(handles)

    def params(self, layout, causal):
        p = self.initialized("stria_attention_params_t", self.lib.stria_attention_params_init)
        p.layout = self.c[f"STRIA_LAYOUT_{layout.upper()}"]
        p.causal = int(causal)
        return p

    def run_ring(self, params, parts, lse_len, Hq, B, sinks=None):
        """Forward then backward on a local group of len(parts[0]) ranks, one thread each, outputs
        poisoned with NaN (0x7FC0 is bfloat16's: a value left unwritten fails); parts are the
        ranks' (q, k, v, dout). With sinks (a float32 vector of Hq), each rank's params point at
        them and at its own dsinks, as _params builds them. Returns each rank's (out, lse, dq, dk,
        dv), and dsinks after them with sinks, and the errors raised."""
        n = len(parts[0])
        contexts = self.local_group(n)
        results, errors = [None] * n, []

        def rank(r):
            try:
                q, k, v, dout = (p[r] for p in parts)
                nan = 0x7FC0 if q.dtype == np.uint16 else np.nan
                out = np.full_like(q, nan, order="F")
                lse = np.full((lse_len, Hq, B), np.nan, dtype=np.float32, order="F")  # (L, Hq, B)
                grads = [np.full_like(x, nan, order="F") for x in (q, k, v)]
                t = [self.tensor(x) for x in (q, k, v, out, lse, dout, *grads)]
                ptrs = [self.ptr(x) for x in t]
                p = params
                extra = []
                if sinks is not None:
                    # A vector is the one-dimensional C tensor [Hq] as it is.
                    dsinks = np.full(Hq, np.nan, dtype=np.float32)
                    ts, tds = self.tensor(sinks), self.tensor(dsinks)
                    p = type(params).from_buffer_copy(params)
                    p.sinks, p.dsinks = self.ptr(ts), self.ptr(tds)
                    extra = [dsinks]
                self.call(self.lib.stria_attention_forward(contexts[r], ctypes.addressof(p), *ptrs[:5], None),
                          "forward")
                self.call(self.lib.stria_attention_backward(contexts[r], ctypes.addressof(p), *ptrs, None),
                          "backward")
                results[r] = (out, lse, *grads, *extra)
            except Exception as e:  # reported to the caller; the peers fail too
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for h in contexts:
            self.lib.stria_context_destroy(h)
        return results, errors

    def seq_dim(self, a, dims):  # _seq_dim: Julia dimension dims (1-based) -> C seq_dim
        assert 1 <= dims <= a.ndim
        return a.ndim - dims

    def shard(self, layout, n, r, full, dims):
        shape = list(full.shape)
        shape[dims - 1] //= n
        local = np.empty(shape, dtype=full.dtype, order="F")
        tf, tl = self.tensor(full), self.tensor(local)
        self.call(self.lib.stria_shard(self.c[f"STRIA_LAYOUT_{layout.upper()}"], n, r, self.seq_dim(full, dims),
                                       self.ptr(tf), self.ptr(tl), None), "stria_shard")
        return local

    def plan(self, cu, S, n, tile, causal=True, local_len=0):
        # Plan(cu, S; world_size, tile, causal, local_len): cu is the (n + 1, B) column-major
        # matrix, whose memory is the C array of B rows of n + 1 (_documents).
        config = self.initialized("stria_plan_config_t", self.lib.stria_plan_config_init)
        config.world_size, config.causal, config.tile, config.local_len = n, int(causal), tile, local_len
        docs = np.asfortranarray(cu, dtype=np.int64)
        handle = ctypes.c_void_p()
        self.call(self.lib.stria_plan_create(ctypes.addressof(config), docs.ctypes.data, docs.shape[0] - 1,
                                             docs.shape[1], S, ctypes.byref(handle)), "stria_plan_create")
        info = self.s["stria_plan_info_t"]()
        info.struct_size = ctypes.sizeof(info)
        self.call(self.lib.stria_plan_get_info(handle, ctypes.addressof(info)), "stria_plan_get_info")
        return handle, info

    def plan_positions(self, handle, info, r):  # positions(plan, rank): a (local_len, batch) Matrix
        pos = np.empty((info.local_len, info.batch), dtype=np.int64, order="F")
        self.call(self.lib.stria_plan_positions(handle, r, pos.ctypes.data), "stria_plan_positions")
        return pos

    def plan_shard(self, handle, info, r, full, dims):
        shape = list(full.shape)
        shape[dims - 1] = info.local_len
        local = np.empty(shape, dtype=full.dtype, order="F")
        tf, tl = self.tensor(full), self.tensor(local)
        self.call(self.lib.stria_plan_shard(handle, r, self.seq_dim(full, dims), self.ptr(tf), self.ptr(tl), None),
                  "stria_plan_shard")
        return local

    def unshard(self, layout, parts, dims):
        shape = list(parts[0].shape)
        shape[dims - 1] *= len(parts)
        full = np.empty(shape, dtype=parts[0].dtype, order="F")
        for r, part in enumerate(parts):
            tf, tl = self.tensor(full), self.tensor(part)
            self.call(self.lib.stria_unshard(self.c[f"STRIA_LAYOUT_{layout.upper()}"], len(parts), r,
                                             self.seq_dim(full, dims), self.ptr(tl), self.ptr(tf), None),
                      "stria_unshard")
        return full


def to_bf16(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.astype(np.uint16)


def from_storage(a):
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def reference(q, k, v, dout, causal, scale, cu=None, window=None, softcap=0.0, sinks=None):
    """Dense float64 attention over (D, H, S, B) arrays (Julia's index order), forward and
    backward; query head h reads key/value head h // (Hq // Hkv). With document boundaries cu
    (an (n + 1, B) matrix), a query sees only the keys of its own document; with a window
    (left, right), query i only keys i - left .. i + right (-1: unbounded). softcap > 0 turns a
    score s into softcap * tanh(s / softcap); sinks (Hq logits) add e^z to each row's denominator
    with no value, and then the sinks' gradient comes back sixth."""
    D, Hq, S, B = q.shape
    group = Hq // k.shape[1]
    out, lse = np.zeros(q.shape), np.zeros((S, Hq, B))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dsinks = np.zeros(Hq)
    i, j = np.arange(S)[None, :], np.arange(S)[:, None]  # [key j, query i]
    for b in range(B):
        for h in range(Hq):
            g = h // group
            Q, K, V, dO = q[:, h, :, b], k[:, g, :, b], v[:, g, :, b], dout[:, h, :, b]
            scores = scale * K.T @ Q  # [key j, query i]
            slope = np.ones_like(scores)  # d(capped score) / d(score)
            if softcap > 0:
                t = np.tanh(scores / softcap)
                scores, slope = softcap * t, 1 - t**2
            visible = np.ones((S, S), dtype=bool)
            if causal:
                visible &= j <= i
            if cu is not None:
                doc = np.searchsorted(cu[:, b], np.arange(S), side="right") - 1
                visible &= doc[:, None] == doc[None, :]
            if window is not None:
                left, right = window
                if left >= 0:
                    visible &= j >= i - left
                if right >= 0:
                    visible &= j <= i + right
            scores[~visible] = -np.inf
            z = -np.inf if sinks is None else float(sinks[h])
            m = np.maximum(scores.max(axis=0), z)
            p = np.exp(scores - m)
            den = p.sum(axis=0) + np.exp(z - m)
            P = p / den
            O = V @ P
            out[:, h, :, b], lse[:, h, b] = O, m + np.log(den)
            dv[:, g, :, b] += dO @ P.T
            delta = (dO * O).sum(axis=0)
            dS = P * (V.T @ dO - delta) * slope
            dq[:, h, :, b] += scale * K @ dS
            dk[:, g, :, b] += scale * Q @ dS.T
            if sinks is not None:  # the sink's probability in row i is e^(z - lse_i)
                dsinks[h] -= (np.exp(z - lse[:, h, b]) * delta).sum()
    return (out, lse, dq, dk, dv) if sinks is None else (out, lse, dq, dk, dv, dsinks)


def rel_error(got, want):
    got = from_storage(got)
    if np.isnan(got).any():
        return np.inf
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@unittest.skipUnless(LIB_PATH and np is not None, "needs STRIA_LIB_PATH and numpy")
class ColumnMajorConvention(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.st = Stria()

    def ring(self, n, layout, causal, dtype, Hq=4, Hkv=2, B=2, S=24, D=16, seed=0):
        st = self.st
        rng = np.random.default_rng(seed)
        store = to_bf16 if dtype == "bf16" else (lambda x: np.asarray(x, dtype=dtype))
        full = [np.asfortranarray(store(rng.standard_normal(shape, dtype=np.float32)))
                for shape in ((D, Hq, S, B), (D, Hkv, S, B), (D, Hkv, S, B), (D, Hq, S, B))]
        parts = [[st.shard(layout, n, r, x, dims=3) for r in range(n)] for x in full]
        params = st.params(layout, causal)
        results, errors = st.run_ring(params, parts, S // n, Hq, B)
        self.assertEqual(errors, [])
        gathered = [st.unshard(layout, [res[i] for res in results], dims=1 if i == 1 else 3) for i in range(5)]
        want = reference(*(from_storage(x) for x in full), causal, 1 / np.sqrt(D))
        tolerance = 1e-5 if dtype == np.float32 else 2e-2
        for name, got, ref in zip(("out", "lse", "dq", "dk", "dv"), gathered, want):
            err = rel_error(got, ref)
            self.assertLess(err, tolerance, f"{n} ranks {layout} causal={causal} {dtype}: {name} error {err}")

    def test_float32_every_layout(self):
        seed = 0
        for n in (1, 2, 3):
            for layout in ("contiguous", "striped", "zigzag"):
                for causal in (True, False):
                    seed += 1
                    with self.subTest(n=n, layout=layout, causal=causal):
                        self.ring(n, layout, causal, np.float32, seed=seed)

    def test_half_types(self):
        self.ring(2, "striped", True, np.float16, Hq=4, Hkv=1, seed=11)
        self.ring(3, "zigzag", False, "bf16", Hq=2, Hkv=2, seed=12)

    def test_shard_follows_positions(self):
        st = self.st
        x = np.asfortranarray(np.arange(3 * 2 * 12 * 2, dtype=np.int64).reshape((3, 2, 12, 2), order="F"))
        for layout in ("striped", "zigzag"):
            for r in range(2):
                pos = (ctypes.c_int64 * 6)()
                st.call(st.lib.stria_layout_positions(st.c[f"STRIA_LAYOUT_{layout.upper()}"], 12, 2, r, pos), "pos")
                # Julia dims = 3 is the sequence of a (D, H, S, B) array.
                np.testing.assert_array_equal(st.shard(layout, 2, r, x, dims=3), x[:, :, list(pos), :])

    def test_strided_views_and_errors(self):
        st = self.st
        D, H, L = 8, 2, 4
        packed = np.asfortranarray(np.random.default_rng(3).standard_normal((D, 3 * H, L, 1), dtype=np.float32))
        q, k, v = packed[:, 0:H], packed[:, H:2 * H], packed[:, 2 * H:]  # views: non-compact strides
        handle = st.local_group(1)[0]
        params = st.params("striped", True)
        out = np.empty((D, H, L, 1), dtype=np.float32, order="F")
        lse = np.empty((L, H, 1), dtype=np.float32, order="F")
        t = [st.tensor(x) for x in (q, k, v, out, lse)]
        st.call(st.lib.stria_attention_forward(handle, ctypes.addressof(params), *[st.ptr(x) for x in t], None), "f")
        want = reference(*(x.astype(np.float64) for x in (q, k, v, q)), True, 1 / np.sqrt(D))
        self.assertLess(rel_error(out, want[0]), 1e-5)
        # D strided (stride(a, 1) != 1): the library refuses it with a message.
        bad = st.tensor(np.asfortranarray(np.zeros((2 * D, H, L, 1), dtype=np.float32))[::2])
        rest = [st.ptr(x) for x in t[1:]]
        status = st.lib.stria_attention_forward(handle, ctypes.addressof(params), st.ptr(bad), *rest, None)
        self.assertEqual(status, st.c["STRIA_ERROR_INVALID_ARGUMENT"])
        self.assertIn("stride", st.last_error())
        st.lib.stria_context_destroy(handle)

    def test_balance_steps_orientation(self):
        st = self.st
        n, S = 4, 64
        balance = st.s["stria_balance_t"]()
        balance.struct_size = ctypes.sizeof(balance)
        layout = st.c["STRIA_LAYOUT_CONTIGUOUS"]
        st.call(st.lib.stria_analyze_balance(layout, 1, S, n, 1, ctypes.addressof(balance)), "balance")
        work = np.empty((n, n), dtype=np.float64, order="F")  # Julia's Matrix: w[r, s]
        st.call(st.lib.stria_analyze_balance_steps(layout, 1, S, n, 1, work.ctypes.data), "steps")
        self.assertAlmostEqual(work.max(axis=0).sum(), balance.ring_latency)  # busiest rank per step s
        # Contiguous and causal: at step s >= 1 rank r holds the keys of rank (r - s) mod n, all
        # visible when that rank is before r, none when after. So rank 0 idles after step 0 and
        # rank n-1 computes full L x L blocks; at step 0 every rank computes its causal diagonal.
        L = S // n
        np.testing.assert_array_equal(work[0, 1:], 0)
        np.testing.assert_array_equal(work[n - 1, 1:], L * L)
        np.testing.assert_array_equal(work[:, 0], L * (L + 1) // 2)

    def random_documents(self, rng, S, num_seqs, B):
        cu = np.zeros((num_seqs + 1, B), dtype=np.int64, order="F")
        for b in range(B):
            cu[1:num_seqs, b] = np.sort(rng.integers(0, S + 1, num_seqs - 1))
            cu[num_seqs, b] = S
        return cu

    def test_plan_positions_and_shard_orientation(self):
        st = self.st
        rng = np.random.default_rng(5)
        S, B = 29, 2
        for n in (1, 3, 4):
            cu = self.random_documents(rng, S, 4, B)
            handle, info = st.plan(cu, S, n, 4)
            self.assertEqual((info.world_size, info.batch, info.num_seqs, info.seq_len), (n, B, 4, S))
            x = np.asfortranarray(np.arange(3 * S * B, dtype=np.int64).reshape((3, S, B), order="F") + 1)
            seen = np.zeros((S, B), dtype=int)
            for r in range(n):
                pos = st.plan_positions(handle, info, r)  # column b: batch row b
                part = st.plan_shard(handle, info, r, x, dims=2)
                for b in range(B):
                    for i, p in enumerate(pos[:, b]):
                        if p < 0:
                            np.testing.assert_array_equal(part[:, i, b], 0)
                        else:
                            seen[p, b] += 1
                            np.testing.assert_array_equal(part[:, i, b], x[:, p, b])
            np.testing.assert_array_equal(seen, 1)
            st.lib.stria_plan_destroy(handle)

    def test_plan_ring(self):
        st = self.st
        n, S, B, Hq, Hkv, D = 3, 29, 2, 4, 2, 8
        for causal, local_len in ((True, 0), (False, 0), (True, 24)):
            rng = np.random.default_rng(17 + local_len + causal)
            cu = self.random_documents(rng, S, 5, B)
            handle, info = st.plan(cu, S, n, 4, causal=causal, local_len=local_len)
            L = info.local_len
            full = [np.asfortranarray(rng.standard_normal(shape, dtype=np.float32))
                    for shape in ((D, Hq, S, B), (D, Hkv, S, B), (D, Hkv, S, B), (D, Hq, S, B))]
            parts = [[st.plan_shard(handle, info, r, x, dims=3) for r in range(n)] for x in full]
            params = st.params("striped", causal)
            params.plan = handle
            results, errors = st.run_ring(params, parts, L, Hq, B)
            self.assertEqual(errors, [])
            # Gathered by positions; padding slots are rows that saw nothing.
            got = [np.full(x.shape, np.nan) for x in (full[0], full[0], full[1], full[2])]
            got_lse = np.full((S, Hq, B), np.nan)
            for r, (out, lse, dq, dk, dv) in enumerate(results):
                pos = st.plan_positions(handle, info, r)
                for b in range(B):
                    for i, p in enumerate(pos[:, b]):
                        if p < 0:
                            for x in (out, dq, dk, dv):
                                np.testing.assert_array_equal(x[:, :, i, b], 0)
                            np.testing.assert_array_equal(lse[i, :, b], -np.inf)
                            continue
                        for g, x in zip(got, (out, dq, dk, dv)):
                            g[:, :, p, b] = x[:, :, i, b]
                        got_lse[p, :, b] = lse[i, :, b]
            st.lib.stria_plan_destroy(handle)
            want = reference(*(x.astype(np.float64) for x in full), causal, 1 / np.sqrt(D), cu=cu)
            for name, g, ref in zip(("out", "lse", "dq", "dk", "dv"), (got[0], got_lse, *got[1:]), want):
                err = rel_error(g, ref)
                self.assertLess(err, 1e-5, f"plan causal={causal} local_len={local_len}: {name} error {err}")

    def test_softcap_sinks_documents_and_window_in_params(self):
        # Everything in the one params struct, as attention.jl's _params fills it: the boundaries
        # (an (n + 1, B) matrix, column-major: the C array of B rows), the window's two sides, the
        # softcap, and pointers to the sinks' and dsinks' one-dimensional tensors. The sinks'
        # gradient is each rank's part: summed over the ranks it is the whole one.
        st = self.st
        S, B, Hq, Hkv, D = 24, 2, 4, 2, 16
        seed = 40
        for n in (1, 2, 3):
            for layout in ("contiguous", "striped", "zigzag"):
                for causal, softcap, masks in ((True, 2.0, False), (False, 0.0, False), (True, 3.0, True),
                                               (False, 2.0, True)):
                    seed += 1
                    rng = np.random.default_rng(seed)
                    full = [np.asfortranarray(rng.standard_normal(shape, dtype=np.float32))
                            for shape in ((D, Hq, S, B), (D, Hkv, S, B), (D, Hkv, S, B), (D, Hq, S, B))]
                    sinks = (rng.random(Hq, dtype=np.float32) * 4 - 0.5).astype(np.float32)
                    cu = np.asfortranarray(np.array([[0, 0], [9, 5], [24, 17], [24, 24]], dtype=np.int64))
                    window = (5, -1) if causal else (4, 3)
                    parts = [[st.shard(layout, n, r, x, dims=3) for r in range(n)] for x in full]
                    params = st.params(layout, causal)
                    params.softcap = softcap
                    if masks:
                        params.cu_seqlens, params.num_seqs = cu.ctypes.data, cu.shape[0] - 1
                        params.window_left, params.window_right = window
                    results, errors = st.run_ring(params, parts, S // n, Hq, B, sinks=sinks)
                    self.assertEqual(errors, [])
                    gathered = [st.unshard(layout, [res[i] for res in results], dims=1 if i == 1 else 3)
                                for i in range(5)]
                    gathered.append(sum(res[5].astype(np.float64) for res in results))
                    want = reference(*(x.astype(np.float64) for x in full), causal, 1 / np.sqrt(D),
                                     cu=cu if masks else None, window=window if masks else None, softcap=softcap,
                                     sinks=sinks)
                    for name, got, ref in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), gathered, want):
                        err = rel_error(got, ref)
                        self.assertLess(err, 1e-5, f"{n} ranks {layout} causal={causal} softcap={softcap} "
                                                   f"masks={masks}: {name} error {err}")

    def test_decode_paged_column_major(self):
        # attention_decode!: pools (D, Hkv, block_size, num_blocks), a block table (max_blocks, B) of
        # 0-based Int32 block numbers, q and the new tokens (D, H, T, B), out like q; the cache
        # struct's pointers as _replace sets them. Every rank the same bits, and the float64
        # reference over the whole cache.
        st = self.st
        D, Hq, Hkv, B, T, bs, blocks = 8, 4, 2, 2, 2, 4, 3
        for n in (1, 2, 3):
            with self.subTest(n=n):
                rng = np.random.default_rng(40 + n)
                cap = bs * blocks
                S = n * cap
                kf, vf = (np.asfortranarray(rng.standard_normal((D, Hkv, S, B), dtype=np.float32)) for _ in "kv")
                q = np.asfortranarray(rng.standard_normal((D, Hq, T, B), dtype=np.float32))
                lens = np.array([3, S - T], dtype=np.int64)
                k_new = np.asfortranarray(np.stack([kf[:, :, lens[b]:lens[b] + T, b] for b in range(B)], axis=3))
                v_new = np.asfortranarray(np.stack([vf[:, :, lens[b]:lens[b] + T, b] for b in range(B)], axis=3))
                contexts = st.local_group(n)
                outs, errors = [None] * n, []

                def rank(r):
                    try:
                        # Striped: position p on rank p % n, slot p // n; blocks numbered backwards.
                        table = np.asfortranarray(
                            np.arange(B * blocks, dtype=np.int32)[::-1].reshape(B, blocks).T.copy())
                        pk = np.full((D, Hkv, bs, B * blocks), np.nan, dtype=np.float32, order="F")
                        pv = np.full_like(pk, np.nan)
                        for b in range(B):
                            for p in range(r, lens[b], n):
                                slot = p // n
                                pk[:, :, slot % bs, table[slot // bs, b]] = kf[:, :, p, b]
                                pv[:, :, slot % bs, table[slot // bs, b]] = vf[:, :, p, b]
                        out = np.full_like(q, np.nan, order="F")
                        t = [st.tensor(x) for x in (pk, pv, table, q, k_new, v_new, out)]
                        cache = st.initialized("stria_kv_cache_t", st.lib.stria_kv_cache_init)
                        cache.k, cache.v, cache.block_table = (st.ptr(x) for x in t[:3])
                        cache.lens = lens.ctypes.data
                        params = st.params("striped", True)
                        st.call(st.lib.stria_attention_decode(contexts[r], ctypes.addressof(params),
                                                              ctypes.addressof(cache), *(st.ptr(x) for x in t[3:]),
                                                              None, None), "decode")
                        outs[r] = out
                    except Exception as e:  # reported below; the peers fail too
                        errors.append(e)

                threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(timeout=120)
                for h in contexts:
                    st.lib.stria_context_destroy(h)
                self.assertEqual(errors, [])
                want = np.zeros((D, Hq, T, B))
                for b in range(B):
                    for t in range(T):
                        keys = lens[b] + t + 1
                        for h in range(Hq):
                            kk = kf[:, h // (Hq // Hkv), :keys, b].astype(np.float64)
                            s = q[:, h, t, b].astype(np.float64) @ kk / np.sqrt(D)
                            w = np.exp(s - s.max())
                            want[:, h, t, b] = vf[:, h // (Hq // Hkv), :keys, b].astype(np.float64) @ (w / w.sum())
                for out in outs:
                    self.assertLess(rel_error(out, want), 1e-5)
                    np.testing.assert_array_equal(out, outs[0])


if __name__ == "__main__":
    unittest.main()
