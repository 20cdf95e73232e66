# Document plans: which tokens of a packed sequence each rank holds, chosen so that every rank does
# about the same work at every ring step. A plan is immutable once made and may serve any number
# of contexts and threads; it is destroyed by close() or, failing that, by the garbage collector.

"""
    Plan

A document plan (`stria_plan_create`): for one set of document boundaries and one ring size,
the global position of every rank's slots. Long documents are cut into whole tiles spread over
the ranks, short ones kept whole and spread by their cost. Any `seq_len` works with any
`world_size`: a slot without a token is padding (position -1) that attends to nothing and that
nothing attends to. Fields `world_size`, `batch`, `num_seqs`, `seq_len` and `local_len` (the
L of every rank's `(D, H, L, B)` arrays).

    Plan(cu_seqlens, seq_len; world_size, batch = 1, causal = true, window = nothing, tile = 128,
         strategy = :balanced, local_len = 0)

`cu_seqlens` are the boundaries as the attention calls take them: a vector `[0, s1, ..., S]`
for every batch row, or an `(n + 1, B)` matrix with a column per batch row (`batch` is then its
number of columns); `nothing` is one document a row. `causal` and `window = (left, right)` are
the mask whose work the plan balances (the calls compute their own); `tile` the kernels' tile
size (0: 128); `strategy` `:balanced`, or a layout (`:contiguous`, `:striped`, `:zigzag`) to
compare with; `local_len` a fixed L at least what the plan needs (0: what it needs).

Every rank makes the same plan from the same arguments, shards its arrays with it
(`shard(plan, rank, full)`) and passes it to the calls (`attention_forward!(...; plan)`).
"""
mutable struct Plan
    handle::Ptr{Cvoid}
    world_size::Int
    batch::Int
    num_seqs::Int
    seq_len::Int
    local_len::Int

    # Takes ownership of a handle made by LibStria (it is destroyed with the Plan).
    function Plan(handle::Ptr{Cvoid})
        plan = new(handle, -1, -1, -1, -1, -1)
        finalizer(_destroy_quietly, plan)  # first, so that an error below still frees the handle
        info = Ref(LibStria.stria_plan_info_t(sizeof(LibStria.stria_plan_info_t), 0, 0, 0, 0, 0))
        _call(() -> LibStria.stria_plan_get_info(handle, info), :stria_plan_get_info)
        plan.world_size = info[].world_size
        plan.batch = info[].batch
        plan.num_seqs = info[].num_seqs
        plan.seq_len = info[].seq_len
        plan.local_len = info[].local_len
        return plan
    end
end

# :balanced, or a layout whose fixed positions the plan takes (for comparison).
function _plan_strategy(strategy::Symbol)
    if strategy === :balanced
        return (LibStria.STRIA_PLAN_BALANCED, LibStria.STRIA_LAYOUT_STRIPED)
    end
    return (LibStria.STRIA_PLAN_LAYOUT, _layout(strategy))
end

function Plan(cu_seqlens, seq_len::Integer; world_size::Integer,
              batch::Integer = cu_seqlens isa AbstractMatrix ? size(cu_seqlens, 2) : 1, causal::Bool = true,
              window = nothing, tile::Integer = 128, strategy::Symbol = :balanced, local_len::Integer = 0)
    _check_library()
    # Boundaries in the library's order (B rows of n + 1); their count matches batch by construction.
    docs, num_seqs = _documents(cu_seqlens === nothing ? [0, seq_len] : cu_seqlens, batch)
    win = _window(window)
    left, right = win === nothing ? (-1, -1) : win
    kind, layout = _plan_strategy(strategy)
    base = _initialized(LibStria.stria_plan_config_t, LibStria.stria_plan_config_init, :stria_plan_config_init)
    config = Ref(_replace(base; world_size = world_size, causal = causal ? 1 : 0, window_left = left,
                          window_right = right, tile = tile, strategy = kind, layout = layout,
                          local_len = local_len))
    handle = Ref{LibStria.stria_plan_t}(C_NULL)
    GC.@preserve docs begin
        _call(:stria_plan_create) do
            LibStria.stria_plan_create(config, isempty(docs) ? C_NULL : pointer(docs), num_seqs, batch, seq_len,
                                       handle)
        end
    end
    return Plan(handle[])
end

_destroy_quietly(plan::Plan) = _destroy(plan, false)

function _destroy(plan::Plan, throw_errors::Bool)
    handle = plan.handle
    handle == C_NULL && return nothing
    plan.handle = C_NULL
    if throw_errors
        _call(() -> LibStria.stria_plan_destroy(handle), :stria_plan_destroy)
    else
        LibStria.stria_plan_destroy(handle)  # a finalizer must not throw
    end
    return nothing
end

"""
    close(plan::Plan)

Destroys the plan (`stria_plan_destroy`) without waiting for the garbage collector. Closing
twice is a no-op; a closed plan cannot be used.
"""
Base.close(plan::Plan) = _destroy(plan, true)

Base.isopen(plan::Plan) = plan.handle != C_NULL

function Base.show(io::IO, plan::Plan)
    print(io, "Stria.Plan(", plan.world_size, " ranks, batch ", plan.batch, ", ", plan.num_seqs, " documents of ",
          plan.seq_len, " tokens, local_len ", plan.local_len, isopen(plan) ? "" : ", closed", ")")
end

# The handle a call passes. C_NULL would mean "no plan" to the library: a closed plan must not
# quietly become a call on the layout.
function _plan_handle(plan::Plan)
    isopen(plan) || throw(ArgumentError("the plan is closed"))
    return plan.handle
end

"""
    local_len(plan) -> Int

Slots per rank: the L of every rank's `(D, H, L, B)` arrays (and `(L, Hq, B)` lse).
"""
local_len(plan::Plan) = plan.local_len

"""
    plan_info(plan) -> NamedTuple

What the plan was made for: `(world_size, batch, num_seqs, seq_len, local_len)`.
"""
plan_info(plan::Plan) = (world_size = plan.world_size, batch = plan.batch, num_seqs = plan.num_seqs,
                         seq_len = plan.seq_len, local_len = plan.local_len)

"""
    positions(plan, rank) -> Matrix{Int64}

The global position (0-based) of each slot of `rank` (0-based), as a `(local_len, batch)`
matrix: column b + 1 is batch row b (the C array `positions[b * local_len + i]`, read
column-major). Padding slots are -1.
"""
function positions(plan::Plan, rank::Integer)
    result = Matrix{Int64}(undef, plan.local_len, plan.batch)
    GC.@preserve plan begin
        _call(() -> LibStria.stria_plan_positions(_plan_handle(plan), rank, result), :stria_plan_positions)
    end
    return result
end

"""
    grid_positions(plan, ulysses, rank) -> Matrix{Int64}
    grid_shard!(local_part, plan, ulysses, rank, full; dims = ndims(full) - 1)
    grid_unshard!(full, plan, ulysses, rank, local_part; dims = ndims(full) - 1)

`positions`, `shard!` and `unshard!` for `rank` of a grid of all-to-all groups of `ulysses` ranks
on the plan's ring (`set_grid!`): rank g·U + u holds the u-th of U pieces of ring rank g's slots,
`local_len ÷ ulysses` of them (`stria_plan_grid_positions`, `_shard`, `_unshard`).
"""
function grid_positions(plan::Plan, ulysses::Integer, rank::Integer)
    ulysses > 0 || throw(ArgumentError("ulysses must be positive, not $ulysses"))
    result = Matrix{Int64}(undef, plan.local_len ÷ ulysses, plan.batch)
    GC.@preserve plan begin
        _call(() -> LibStria.stria_plan_grid_positions(_plan_handle(plan), ulysses, rank, result),
              :stria_plan_grid_positions)
    end
    return result
end

function grid_shard!(local_part::AbstractArray, plan::Plan, ulysses::Integer, rank::Integer, full::AbstractArray;
                     dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve plan tfull tlocal begin
        _call(:stria_plan_grid_shard) do
            LibStria.stria_plan_grid_shard(_plan_handle(plan), ulysses, rank, seq_dim, tfull.ref, tlocal.ref, C_NULL)
        end
    end
    return local_part
end

function grid_unshard!(full::AbstractArray, plan::Plan, ulysses::Integer, rank::Integer, local_part::AbstractArray;
                       dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve plan tfull tlocal begin
        _call(:stria_plan_grid_unshard) do
            LibStria.stria_plan_grid_unshard(_plan_handle(plan), ulysses, rank, seq_dim, tlocal.ref, tfull.ref, C_NULL)
        end
    end
    return full
end

"""
    shard!(local_part, plan, rank, full; dims = ndims(full) - 1)

Copies the tokens of `rank` out of `full` along Julia dimension `dims` (the sequence, `seq_len`
long) into `local_part`, whose dimension `dims` is `local_len(plan)` long; padding slots get
zeros. With several batch rows the batch is the last Julia dimension. Any element type.
"""
function shard!(local_part::AbstractArray, plan::Plan, rank::Integer, full::AbstractArray;
                dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve plan tfull tlocal begin
        _call(:stria_plan_shard) do
            LibStria.stria_plan_shard(_plan_handle(plan), rank, seq_dim, tfull.ref, tlocal.ref, C_NULL)
        end
    end
    return local_part
end

"""
    shard(plan, rank, full; dims = ndims(full) - 1) -> Array
    shard(plan, full; dims = ndims(full) - 1) -> Vector of every rank's shard

`shard!` into a new array.
"""
function shard(plan::Plan, rank::Integer, full::AbstractArray; dims::Integer = ndims(full) - 1)
    _seq_dim(full, dims)
    local_size = ntuple(d -> d == dims ? plan.local_len : size(full, d), ndims(full))
    return shard!(similar(full, local_size), plan, rank, full; dims = dims)
end

shard(plan::Plan, full::AbstractArray; dims::Integer = ndims(full) - 1) =
    [shard(plan, r, full; dims = dims) for r in 0:(plan.world_size - 1)]

"""
    unshard!(full, plan, rank, local_part; dims = ndims(full) - 1)

Copies the tokens of `rank` from `local_part` back to their places in `full` (the inverse of
`shard!`); the other ranks' positions of `full` are left as they are.
"""
function unshard!(full::AbstractArray, plan::Plan, rank::Integer, local_part::AbstractArray;
                  dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve plan tfull tlocal begin
        _call(:stria_plan_unshard) do
            LibStria.stria_plan_unshard(_plan_handle(plan), rank, seq_dim, tlocal.ref, tfull.ref, C_NULL)
        end
    end
    return full
end

"""
    unshard(plan, parts; dims = ndims(parts[1]) - 1) -> Array

The full sequence from every rank's shard (`parts[r + 1]` is rank r's; one per rank of the
plan).
"""
function unshard(plan::Plan, parts::AbstractVector; dims::Integer = ndims(first(parts)) - 1)
    isempty(parts) && throw(ArgumentError("no shards to unshard"))
    all(p -> p isa AbstractArray, parts) || throw(ArgumentError("unshard takes a vector of arrays"))
    length(parts) == plan.world_size ||
        throw(ArgumentError("$(length(parts)) shards for a plan of world_size $(plan.world_size): one per rank"))
    first_part = first(parts)
    _seq_dim(first_part, dims)
    full = similar(first_part, ntuple(d -> d == dims ? plan.seq_len : size(first_part, d), ndims(first_part)))
    for (i, part) in enumerate(parts)
        unshard!(full, plan, i - 1, part; dims = dims)
    end
    return full
end

_balance_tuple(b::LibStria.stria_balance_t) =
    (total_work = b.total_work, ring_latency = b.ring_latency, speedup = b.speedup, imbalance = b.imbalance,
     ideal_latency = b.ideal_latency, kv_rows_sent = b.kv_rows_sent)

_balance_out() = Ref(LibStria.stria_balance_t(sizeof(LibStria.stria_balance_t), 0, 0, 0, 0, 0, 0))

"""
    analyze_balance(plan; tile = 1) -> NamedTuple

The balance of the plan's ring under the mask it was made for, at `tile` granularity (1: exact
pairs), counted as the kernels compute: `(total_work, ring_latency, speedup, imbalance,
ideal_latency, kv_rows_sent)` as for a layout. `ideal_latency / ring_latency` is the ring's
fraction of ideal; kv_rows_sent counts the K/V token rows a forward call sends, each block trimmed
to the rows that ranks further along the ring see, in whole tiles.
"""
function analyze_balance(plan::Plan; tile::Integer = 1)
    out = _balance_out()
    GC.@preserve plan begin
        _call(:stria_plan_analyze_balance) do
            LibStria.stria_plan_analyze_balance(_plan_handle(plan), tile, out, C_NULL)
        end
    end
    return _balance_tuple(out[])
end

"""
    analyze_balance_steps(plan; tile = 1) -> Matrix{Float64}

The per-rank, per-step work behind `analyze_balance(plan)`: `w[r + 1, s + 1]` is the work of
rank r at ring step s.
"""
function analyze_balance_steps(plan::Plan; tile::Integer = 1)
    analyze_balance(plan; tile = tile)  # a bad tile is then the library's error, before any allocation
    out = _balance_out()
    work = Matrix{Float64}(undef, plan.world_size, plan.world_size)
    GC.@preserve plan begin
        _call(:stria_plan_analyze_balance) do
            LibStria.stria_plan_analyze_balance(_plan_handle(plan), tile, out, work)
        end
    end
    return work
end
