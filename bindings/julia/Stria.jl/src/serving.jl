# attention_decode!: serving over a KV cache sharded across the ranks of a context.

"""
    attention_decode!(ctx, out, q, k_cache, v_cache, cache_lens; k_new = nothing, v_new = nothing,
                      lse = nothing, block_table = nothing, layout = :striped, causal = true,
                      softmax_scale = 0, window_left = -1, softcap = 0, sinks = nothing)

Attention of new query tokens to a KV cache spread over the ranks, into `out` (like q). Arrays are
column-major: q `(D, Hq, T, B)`, query t of sequence b at position `cache_lens[b] + t - 1`
(positions count from 0); `cache_lens` holds the tokens cached per sequence before the call, the
same on every rank.

Each rank passes its own share of the cache, placed by `layout`: `:striped` keeps position p on
rank `p % N` at slot `p ÷ N` (0-based slots), so the shares grow evenly; `:contiguous` and
`:zigzag` place by the per-rank capacity C. A contiguous cache is `k_cache`, `v_cache` of
`(D, Hkv, C, B)`; a paged one, as serving engines keep theirs, is pools `(D, Hkv, block_size,
num_blocks)` with `block_table`, an `Int32` `(max_blocks, B)` matrix of 0-based block numbers: slot
s of sequence b is row `s % block_size` of block `block_table[s ÷ block_size + 1, b]`.

`k_new`, `v_new` (`(D, Hkv, T, B)`): the new tokens' keys and values, stored first by the ranks
that hold their positions and seen by the queries (causally unless `causal = false`); advance
`cache_lens` by T afterwards. `lse`, if given: Float32 `(T, Hq, B)`. `window_left >= 0` limits how
far back a query sees; `softcap` and `sinks` as in `attention_forward!`.

A collective: every rank calls it with the same q, new tokens, lengths and parameters, and gets the
same `out`, bit for bit. Throws a `StriaError` on bad arguments, on every rank.
"""
function attention_decode!(ctx::Context, out::AbstractArray, q::AbstractArray, k_cache::AbstractArray,
                           v_cache::AbstractArray, cache_lens::AbstractVector{<:Integer}; k_new = nothing,
                           v_new = nothing, lse = nothing, block_table = nothing, layout = :striped,
                           causal::Bool = true, softmax_scale::Real = 0, window_left::Integer = -1,
                           softcap::Real = 0, sinks = nothing)
    length(cache_lens) == _batch(q) ||
        throw(ArgumentError("cache_lens has $(length(cache_lens)) entries but q has $(_batch(q)) sequences: " *
                            "one length each"))
    (k_new === nothing) == (v_new === nothing) ||
        throw(ArgumentError("k_new and v_new go together: give both or neither"))
    lens = Vector{Int64}(cache_lens)
    tsinks = _head_vector(sinks, :sinks)
    tq, tout, tk, tv = TensorRef(q), TensorRef(out), TensorRef(k_cache), TensorRef(v_cache)
    ttable = block_table === nothing ? nothing : TensorRef(block_table)
    tkn = k_new === nothing ? nothing : TensorRef(k_new)
    tvn = v_new === nothing ? nothing : TensorRef(v_new)
    tlse = lse === nothing ? nothing : TensorRef(lse)
    GC.@preserve ctx lens tsinks tq tout tk tv ttable tkn tvn tlse begin
        params = _params(layout, causal, softmax_scale, nothing; docs = Int64[], num_seqs = 0,
                         window = (Int64(window_left), Int64(-1)), softcap = softcap, sinks = tsinks)
        base = _initialized(LibStria.stria_kv_cache_t, LibStria.stria_kv_cache_init, :stria_kv_cache_init)
        cache = Ref(_replace(base; k = _tensor_pointer(tk), v = _tensor_pointer(tv),
                             block_table = _tensor_pointer(ttable), lens = pointer(lens)))
        _call(:stria_attention_decode) do
            LibStria.stria_attention_decode(ctx.handle, params, cache, tq.ref, _tensor_pointer(tkn),
                                            _tensor_pointer(tvn), tout.ref, _tensor_pointer(tlse), C_NULL)
        end
    end
    return out
end

const _PREFILL_MODES = Dict(:auto => 0, :pass_kv => 1, :pass_q => 2)

"""
    attention_prefill!(ctx, out, q, k, v, k_cache, v_cache, cache_lens; mode = :auto, lse = nothing,
                       block_table = nothing, layout = :striped, causal = true, softmax_scale = 0,
                       window_left = -1, softcap = 0, sinks = nothing)

Prefill with a KV cache sharded over the ranks (chunked prefill, a new turn), into `out` (like q).
P new tokens per sequence are sharded by `layout` as `attention_forward!` takes a sequence: q
`(D, Hq, L, B)`, k and v `(D, Hkv, L, B)` hold this rank's L = P / N of them, local token i at chunk
position `positions(layout, P, N, rank)[i]` (0-based), which is position `cache_lens[b] + that`.
Each attends to the whole cache (every rank's share, as in `attention_decode!`) and causally to the
new tokens; their keys and values are stored where `layout` puts their positions (advance
`cache_lens` by P afterwards). `mode = :pass_kv` sends each rank's keys and values around the ring,
`:pass_q` the queries (their partial results go home), `:auto` whichever moves fewer bytes.
"""
function attention_prefill!(ctx::Context, out::AbstractArray, q::AbstractArray, k::AbstractArray, v::AbstractArray,
                            k_cache::AbstractArray, v_cache::AbstractArray, cache_lens::AbstractVector{<:Integer};
                            mode::Symbol = :auto, lse = nothing, block_table = nothing, layout = :striped,
                            causal::Bool = true, softmax_scale::Real = 0, window_left::Integer = -1,
                            softcap::Real = 0, sinks = nothing)
    length(cache_lens) == _batch(q) ||
        throw(ArgumentError("cache_lens has $(length(cache_lens)) entries but q has $(_batch(q)) sequences: " *
                            "one length each"))
    haskey(_PREFILL_MODES, mode) ||
        throw(ArgumentError("mode must be :auto, :pass_kv or :pass_q, not $(repr(mode))"))
    lens = Vector{Int64}(cache_lens)
    tsinks = _head_vector(sinks, :sinks)
    tq, tk, tv, tout = TensorRef(q), TensorRef(k), TensorRef(v), TensorRef(out)
    tkc, tvc = TensorRef(k_cache), TensorRef(v_cache)
    ttable = block_table === nothing ? nothing : TensorRef(block_table)
    tlse = lse === nothing ? nothing : TensorRef(lse)
    GC.@preserve ctx lens tsinks tq tk tv tout tkc tvc ttable tlse begin
        params = _params(layout, causal, softmax_scale, nothing; docs = Int64[], num_seqs = 0,
                         window = (Int64(window_left), Int64(-1)), softcap = softcap, sinks = tsinks)
        base = _initialized(LibStria.stria_kv_cache_t, LibStria.stria_kv_cache_init, :stria_kv_cache_init)
        cache = Ref(_replace(base; k = _tensor_pointer(tkc), v = _tensor_pointer(tvc),
                             block_table = _tensor_pointer(ttable), lens = pointer(lens)))
        _call(:stria_attention_prefill) do
            LibStria.stria_attention_prefill(ctx.handle, params, cache, LibStria.stria_prefill_t(_PREFILL_MODES[mode]),
                                             tq.ref, tk.ref, tv.ref, tout.ref, _tensor_pointer(tlse), C_NULL)
        end
    end
    return out
end
