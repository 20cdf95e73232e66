# attention_forward / attention_backward: collectives over a context's ring.

# The whole stria_attention_params_t of one call: the mask (documents, window, plan) and the score
# modifications (softcap, sinks) all travel in it, so each call is one stria_attention_forward or
# _backward. Its pointer fields address `docs` and the sinks' and dsinks' TensorRefs: build it
# under GC.@preserve of those, and make the call there.
function _params(layout, causal::Bool, softmax_scale::Real, plan::Union{Nothing,Plan}; docs::Vector{Int64},
                 num_seqs::Integer, window, softcap::Real, sinks::Union{Nothing,TensorRef},
                 dsinks::Union{Nothing,TensorRef} = nothing)
    base = _initialized(LibStria.stria_attention_params_t, LibStria.stria_attention_params_init,
                        :stria_attention_params_init)
    left, right = window === nothing ? (-1, -1) : window
    return Ref(_replace(base; layout = _layout(layout), causal = causal ? 1 : 0, softmax_scale = softmax_scale,
                        plan = plan === nothing ? C_NULL : _plan_handle(plan),
                        cu_seqlens = num_seqs == 0 ? Ptr{Int64}(C_NULL) : pointer(docs), num_seqs = num_seqs,
                        window_left = left, window_right = right, softcap = softcap,
                        sinks = _tensor_pointer(sinks), dsinks = _tensor_pointer(dsinks)))
end

# The address of a TensorRef's DLTensor, for a pointer field of a struct (a ccall argument gets it
# by conversion, a field does not); valid while the TensorRef is preserved.
_tensor_pointer(::Nothing) = Ptr{LibStria.DLTensor}(C_NULL)
_tensor_pointer(t::TensorRef) = Base.unsafe_convert(Ptr{LibStria.DLTensor}, t.ref)

# sinks or dsinks: nothing, or a vector of Hq values, which is the C tensor [Hq] as it is (one
# dimension: nothing to reverse). The vector is checked here because the library's message for a
# tensor of the wrong number of dimensions names attention's 4-D and 3-D shapes; the element type
# (Float32) and the length (Hq of q) the library checks, with its own messages.
function _head_vector(x, name::Symbol)
    x === nothing && return nothing
    x isa AbstractVector ||
        throw(ArgumentError("$name must be nothing or a Float32 vector of Hq values (one per query head), " *
                            "not a $(typeof(x))"))
    return TensorRef(x)
end

# Document boundaries as the library reads them (B rows of n + 1, in a row-major C array) for a
# q of `batch` batch rows, and n: a vector [0, s1, ..., S] is every batch row's; a matrix
# (n + 1, B) gives each batch row its own column. `nothing`: no document mask.
function _documents(cu_seqlens, batch::Integer)
    cu_seqlens === nothing && return Int64[], 0
    if cu_seqlens isa AbstractVector{<:Integer}
        per = length(cu_seqlens)
        docs = repeat(Vector{Int64}(cu_seqlens), batch)
    elseif cu_seqlens isa AbstractMatrix{<:Integer}
        size(cu_seqlens, 2) == batch ||
            throw(ArgumentError("cu_seqlens is $(size(cu_seqlens)): a matrix must be (n + 1, B) with B = $batch"))
        per = size(cu_seqlens, 1)
        docs = vec(Matrix{Int64}(cu_seqlens))  # column-major: column b is batch row b's boundaries
    else
        throw(ArgumentError("cu_seqlens must be integer boundaries [0, s1, ..., S] (a vector or an (n + 1, B) matrix)"))
    end
    per >= 2 || throw(ArgumentError("cu_seqlens needs at least two boundaries per batch row ([0, S] is one document)"))
    return docs, per - 1
end

_batch(q::AbstractArray) = ndims(q) == 4 ? size(q, 4) : 1

# A sliding window (left, right) as the library takes it: `nothing` (or (-1, -1)) for none.
function _window(window)
    window === nothing && return nothing
    (window isa Tuple{Integer,Integer}) ||
        throw(ArgumentError("window must be nothing or (left, right): two integers, each >= 0 or -1 (unbounded)"))
    return window == (-1, -1) ? nothing : (Int64(window[1]), Int64(window[2]))
end

"""
    attention_forward!(ctx, out, lse, q, k, v; layout = :striped, causal = true, softmax_scale = 0,
                       cu_seqlens = nothing, window = nothing, plan = nothing, softcap = 0, sinks = nothing)

Exact attention of this rank's queries over the whole sequence, into `out` (like q) and `lse`
(Float32, `(L, Hq, B)`: the natural log of each row's softmax denominator, -Inf for a row that
sees no key). Arrays are column-major: q `(D, Hq, L, B)`, k and v `(D, Hkv, L, B)` with Hq a
multiple of Hkv, holding this rank's L tokens in `layout` (see `shard`). Element types Float32,
Float16 or BFloat16, the same for all but lse. `softmax_scale = 0` means `1/sqrt(D)`.

`cu_seqlens` packs documents into the sequence: a query sees only the keys of its own document.
Global positions `[0, s1, ..., S]` (S = L * world size) for every batch row, or an `(n + 1, B)`
matrix with a column per batch row (a column with fewer documents repeats S), the same on every
rank.

`window = (left, right)` is a sliding window: the query at global position i sees the keys at
i - left .. i + right (when causal, up to i), within its document; -1 leaves a side unbounded.

`plan` (a `Plan`, made by every rank from the same boundaries and arguments) runs the ring on
the plan instead of `layout`: the arrays hold the plan's `local_len(plan)` slots per rank (see
`shard(plan, rank, full)`), B is the plan's batch, and the document mask is the plan's
boundaries (`cu_seqlens` may be left out, or must be the same).

`softcap > 0` caps the logits (Gemma 2's logit softcapping): a score s = softmax_scale * q.k
becomes softcap * tanh(s / softcap) before the mask; 0 leaves the scores as they are.

`sinks` is a `Float32` vector of Hq attention-sink logits, one per query head, the same on every
rank (gpt-oss): head h's logit z joins the softmax denominator of every row of head h once and
carries no value, so out = sum_j e^(s_j) v_j / (e^z + sum_j e^(s_j)). lse includes it, and a row
that sees no key gets out 0 and lse z.

A collective: every rank of the ring calls it at the same time with the same shapes and
parameters (see `run_ranks`). Throws a `StriaError` on bad arguments, on every rank.
"""
function attention_forward!(ctx::Context, out::AbstractArray, lse::AbstractArray, q::AbstractArray,
                            k::AbstractArray, v::AbstractArray; layout = :striped, causal::Bool = true,
                            softmax_scale::Real = 0, cu_seqlens = nothing, window = nothing,
                            plan::Union{Nothing,Plan} = nothing, softcap::Real = 0, sinks = nothing)
    docs, num_seqs = _documents(cu_seqlens, _batch(q))
    win = _window(window)
    tsinks = _head_vector(sinks, :sinks)
    tq, tk, tv, tout, tlse = TensorRef(q), TensorRef(k), TensorRef(v), TensorRef(out), TensorRef(lse)
    GC.@preserve ctx plan docs tsinks tq tk tv tout tlse begin
        params = _params(layout, causal, softmax_scale, plan; docs = docs, num_seqs = num_seqs, window = win,
                         softcap = softcap, sinks = tsinks)
        _call(:stria_attention_forward) do
            LibStria.stria_attention_forward(ctx.handle, params, tq.ref, tk.ref, tv.ref, tout.ref, tlse.ref, C_NULL)
        end
    end
    return out, lse
end

"""
    attention_forward(ctx, q, k, v; out = nothing, lse = nothing, kw...) -> (out, lse)

`attention_forward!` into new arrays (`similar(q)`, and `Array{Float32}(undef, L, Hq, B)`) or
into the `out`/`lse` given.
"""
function attention_forward(ctx::Context, q::AbstractArray, k::AbstractArray, v::AbstractArray;
                           out::Union{Nothing,AbstractArray} = nothing, lse::Union{Nothing,AbstractArray} = nothing,
                           kw...)
    out = out === nothing ? similar(q) : out
    lse = lse === nothing ? _lse_like(q) : lse
    return attention_forward!(ctx, out, lse, q, k, v; kw...)
end

# lse of a q of size (D, Hq, L, B): (L, Hq, B) Float32. A q of another rank is the library's to
# reject, so it gets an empty lse and the call reports the real problem.
_lse_like(q::AbstractArray) =
    ndims(q) == 4 ? Array{Float32}(undef, size(q, 3), size(q, 2), size(q, 4)) : Array{Float32}(undef, 0, 0, 0)

"""
    attention_backward!(ctx, dq, dk, dv, q, k, v, out, lse, dout; layout = :striped, causal = true,
                        softmax_scale = 0, cu_seqlens = nothing, window = nothing, plan = nothing,
                        softcap = 0, sinks = nothing, dsinks = nothing)
        -> (dq, dk, dv), or (dq, dk, dv, dsinks) with a dsinks

Gradients of the forward's `out` for `dout` (like out): `dq` like q, `dk` and `dv` like k.
`out` and `lse` are the forward's. The same parameters as the forward (`cu_seqlens`, `window`,
`plan`, `softcap` and `sinks` included); a collective too.

`dsinks` (a `Float32` vector of length Hq, with `sinks` only) receives this rank's part of the
sinks' gradient, summed over its rows and batch: the sum over the ranks is the whole gradient,
to be reduced like that of any weight every rank holds. Without it the sinks still shape the
other gradients, and theirs is not computed.
"""
function attention_backward!(ctx::Context, dq::AbstractArray, dk::AbstractArray, dv::AbstractArray,
                             q::AbstractArray, k::AbstractArray, v::AbstractArray, out::AbstractArray,
                             lse::AbstractArray, dout::AbstractArray; layout = :striped, causal::Bool = true,
                             softmax_scale::Real = 0, cu_seqlens = nothing, window = nothing,
                             plan::Union{Nothing,Plan} = nothing, softcap::Real = 0, sinks = nothing,
                             dsinks = nothing)
    docs, num_seqs = _documents(cu_seqlens, _batch(q))
    win = _window(window)
    tsinks, tdsinks = _head_vector(sinks, :sinks), _head_vector(dsinks, :dsinks)
    tq, tk, tv, tout, tlse, tdout = TensorRef(q), TensorRef(k), TensorRef(v), TensorRef(out), TensorRef(lse),
                                    TensorRef(dout)
    tdq, tdk, tdv = TensorRef(dq), TensorRef(dk), TensorRef(dv)
    GC.@preserve ctx plan docs tsinks tdsinks tq tk tv tout tlse tdout tdq tdk tdv begin
        params = _params(layout, causal, softmax_scale, plan; docs = docs, num_seqs = num_seqs, window = win,
                         softcap = softcap, sinks = tsinks, dsinks = tdsinks)
        _call(:stria_attention_backward) do
            LibStria.stria_attention_backward(ctx.handle, params, tq.ref, tk.ref, tv.ref, tout.ref, tlse.ref,
                                              tdout.ref, tdq.ref, tdk.ref, tdv.ref, C_NULL)
        end
    end
    return dsinks === nothing ? (dq, dk, dv) : (dq, dk, dv, dsinks)
end

"""
    attention_backward(ctx, q, k, v, out, lse, dout; dq = nothing, dk = nothing, dv = nothing,
                       sinks = nothing, dsinks = nothing, kw...)
        -> (dq, dk, dv), or (dq, dk, dv, dsinks) with sinks

`attention_backward!` into new arrays (`similar(q)`, `similar(k)`, `similar(v)`, and with
`sinks` a `zeros(Float32, Hq)` for dsinks) or into those given.
"""
function attention_backward(ctx::Context, q::AbstractArray, k::AbstractArray, v::AbstractArray,
                            out::AbstractArray, lse::AbstractArray, dout::AbstractArray;
                            dq::Union{Nothing,AbstractArray} = nothing, dk::Union{Nothing,AbstractArray} = nothing,
                            dv::Union{Nothing,AbstractArray} = nothing, sinks = nothing, dsinks = nothing, kw...)
    dq = dq === nothing ? similar(q) : dq
    dk = dk === nothing ? similar(k) : dk
    dv = dv === nothing ? similar(v) : dv
    # With sinks their gradient comes back too: the sinks are a weight, and the allocating call
    # returns every gradient. sinks that are no vector are attention_backward!'s ArgumentError.
    if sinks isa AbstractVector && dsinks === nothing
        dsinks = zeros(Float32, length(sinks))
    end
    return attention_backward!(ctx, dq, dk, dv, q, k, v, out, lse, dout; sinks = sinks, dsinks = dsinks, kw...)
end
