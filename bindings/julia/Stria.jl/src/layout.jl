# Token layouts: which global positions a rank holds, cutting full tensors into ranks' shards and
# back, and the balance of causal work under a layout. None of these needs a context.

"""
    positions(layout, seq_len, world_size, rank) -> Vector{Int64}

The global position (0-based, as RoPE ids or labels want it) of each of the
`seq_len ÷ world_size` tokens that `rank` (0-based) holds under `layout` (`:contiguous`,
`:striped` or `:zigzag`).
"""
function positions(layout, seq_len::Integer, world_size::Integer, rank::Integer)
    # Room for seq_len ÷ world_size entries; the library checks the arguments before it writes.
    n = world_size > 0 ? max(Int(seq_len ÷ world_size), 0) : 0
    result = Vector{Int64}(undef, n)
    _call(() -> LibStria.stria_layout_positions(_layout(layout), seq_len, world_size, rank, result),
          :stria_layout_positions)
    return result
end

# The C API's seq_dim for Julia dimension `dims` of an N-dimensional array: the dimensions are
# reversed (Julia dim 1 is C dim N-1), so it is N - dims. Julia dimensions are checked here,
# as the C API would otherwise read an out-of-range value as one counted from the end.
function _seq_dim(a::AbstractArray, dims::Integer)
    1 <= dims <= ndims(a) || throw(ArgumentError("dims = $dims, but the array has $(ndims(a)) dimensions"))
    return ndims(a) - Int(dims)
end

"""
    shard!(local_part, layout, world_size, rank, full; dims = ndims(full) - 1)

Copies the tokens of `rank` out of `full` along Julia dimension `dims` (the sequence; the
default is dimension 3 of a `(D, H, S, B)` array, the C API's `seq_dim = 1`) into
`local_part`, whose dimension `dims` is `S ÷ world_size` long. Any element type.
"""
function shard!(local_part::AbstractArray, layout, world_size::Integer, rank::Integer, full::AbstractArray;
                dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve tfull tlocal begin
        _call(:stria_shard) do
            LibStria.stria_shard(_layout(layout), world_size, rank, seq_dim, tfull.ref, tlocal.ref, C_NULL)
        end
    end
    return local_part
end

"""
    shard(layout, world_size, rank, full; dims = ndims(full) - 1) -> Array
    shard(layout, world_size, full; dims = ndims(full) - 1) -> Vector of every rank's shard

`shard!` into a new array.
"""
function shard(layout, world_size::Integer, rank::Integer, full::AbstractArray; dims::Integer = ndims(full) - 1)
    _seq_dim(full, dims)
    local_size = ntuple(d -> d == dims ? (world_size > 0 ? size(full, d) ÷ world_size : 0) : size(full, d),
                        ndims(full))
    return shard!(similar(full, local_size), layout, world_size, rank, full; dims = dims)
end

shard(layout, world_size::Integer, full::AbstractArray; dims::Integer = ndims(full) - 1) =
    [shard(layout, world_size, r, full; dims = dims) for r in 0:(world_size - 1)]

"""
    unshard!(full, layout, world_size, rank, local_part; dims = ndims(full) - 1)

Copies the tokens of `rank` from `local_part` back to their places in `full` (the inverse of
`shard!`); the other ranks' tokens of `full` are left as they are.
"""
function unshard!(full::AbstractArray, layout, world_size::Integer, rank::Integer, local_part::AbstractArray;
                  dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve tfull tlocal begin
        _call(:stria_unshard) do
            LibStria.stria_unshard(_layout(layout), world_size, rank, seq_dim, tlocal.ref, tfull.ref, C_NULL)
        end
    end
    return full
end

"""
    unshard(layout, parts; dims = ndims(parts[1]) - 1) -> Array

The full sequence from every rank's shard (`parts[r + 1]` is rank r's, `world_size =
length(parts)`).
"""
function unshard(layout, parts::AbstractVector; dims::Integer = ndims(first(parts)) - 1)
    isempty(parts) && throw(ArgumentError("no shards to unshard"))
    all(p -> p isa AbstractArray, parts) || throw(ArgumentError("unshard takes a vector of arrays"))
    first_part = first(parts)
    _seq_dim(first_part, dims)
    n = length(parts)
    full = similar(first_part, ntuple(d -> d == dims ? n * size(first_part, d) : size(first_part, d),
                                      ndims(first_part)))
    for (i, part) in enumerate(parts)
        unshard!(full, layout, n, i - 1, part; dims = dims)
    end
    return full
end

"""
    grid_positions(layout, seq_len, world_size, ulysses, rank) -> Vector{Int64}

`positions` for `rank` of a grid of all-to-all groups of `ulysses` ranks (`set_grid!`): rank
g·U + u holds the u-th of U contiguous pieces of the tokens `layout` gives rank g of a ring of
`world_size ÷ ulysses` (`stria_grid_positions`).
"""
function grid_positions(layout, seq_len::Integer, world_size::Integer, ulysses::Integer, rank::Integer)
    n = world_size > 0 ? max(Int(seq_len ÷ world_size), 0) : 0
    result = Vector{Int64}(undef, n)
    _call(() -> LibStria.stria_grid_positions(_layout(layout), seq_len, world_size, ulysses, rank, result),
          :stria_grid_positions)
    return result
end

"""
    grid_shard!(local_part, layout, world_size, ulysses, rank, full; dims = ndims(full) - 1)
    grid_unshard!(full, layout, world_size, ulysses, rank, local_part; dims = ndims(full) - 1)

`shard!` and `unshard!` for `rank` of a grid of all-to-all groups of `ulysses` ranks
(`stria_grid_shard`, `stria_grid_unshard`).
"""
function grid_shard!(local_part::AbstractArray, layout, world_size::Integer, ulysses::Integer, rank::Integer,
                     full::AbstractArray; dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve tfull tlocal begin
        _call(:stria_grid_shard) do
            LibStria.stria_grid_shard(_layout(layout), world_size, ulysses, rank, seq_dim, tfull.ref, tlocal.ref, C_NULL)
        end
    end
    return local_part
end

function grid_unshard!(full::AbstractArray, layout, world_size::Integer, ulysses::Integer, rank::Integer,
                       local_part::AbstractArray; dims::Integer = ndims(full) - 1)
    seq_dim = _seq_dim(full, dims)
    tfull, tlocal = TensorRef(full), TensorRef(local_part)
    GC.@preserve tfull tlocal begin
        _call(:stria_grid_unshard) do
            LibStria.stria_grid_unshard(_layout(layout), world_size, ulysses, rank, seq_dim, tlocal.ref, tfull.ref,
                                        C_NULL)
        end
    end
    return full
end

"""
    analyze_balance(layout, seq_len, world_size; causal = true, tile = 1, ulysses = 1) -> NamedTuple

The work of one attention call under `layout`, in visible (query, key) pairs at tile
granularity: `(total_work, ring_latency, speedup, imbalance, ideal_latency, kv_rows_sent)`,
where ring_latency sums over steps the busiest rank's work, speedup = total_work / ring_latency
(world_size is perfect), imbalance = ring_latency / (total_work / world_size) (1 is perfect),
ideal_latency is one device's work on the whole sequence at the same tile size over world_size
(the latency no ring can beat) and kv_rows_sent the K/V token rows a forward call sends (whole
blocks at every step but the last). `ulysses > 1`: a grid of all-to-all groups of that many ranks,
the ring of groups with each member computing its share of the heads (`stria_grid_analyze_balance`).
"""
function analyze_balance(layout, seq_len::Integer, world_size::Integer; causal::Bool = true, tile::Integer = 1,
                         ulysses::Integer = 1)
    out = _balance_out()
    if ulysses == 1
        _call(:stria_analyze_balance) do
            LibStria.stria_analyze_balance(_layout(layout), causal, seq_len, world_size, tile, out)
        end
    else  # a grid: the ring of groups, each member a ulysses-th of the heads
        _call(:stria_grid_analyze_balance) do
            LibStria.stria_grid_analyze_balance(_layout(layout), causal, seq_len, world_size, ulysses, tile, out)
        end
    end
    return _balance_tuple(out[])
end

"""
    analyze_balance_steps(layout, seq_len, world_size; causal = true, tile = 1) -> Matrix{Float64}

The per-rank, per-step work behind `analyze_balance`: `w[r + 1, s + 1]` is the work of rank r
at ring step s (the C array `work[s * world_size + r]`, read column-major).
"""
function analyze_balance_steps(layout, seq_len::Integer, world_size::Integer; causal::Bool = true,
                               tile::Integer = 1)
    # The same arguments through analyze_balance first: a bad world_size is then the library's
    # error, not a failed world_size^2 allocation here.
    analyze_balance(layout, seq_len, world_size; causal = causal, tile = tile)
    work = Matrix{Float64}(undef, world_size, world_size)
    _call(:stria_analyze_balance_steps) do
        LibStria.stria_analyze_balance_steps(_layout(layout), causal, seq_len, world_size, tile, work)
    end
    return work
end
