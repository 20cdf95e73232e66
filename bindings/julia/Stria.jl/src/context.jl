# Contexts: one per rank, destroyed by close() or, failing that, by the garbage collector.

_symbol_arg(x::Integer, ::Type{T}, what) where {T} = T(x)  # a raw C value: the library checks it
function _symbol_arg(x::Symbol, ::Type{T}, what) where {T}
    for (name, value) in what
        x === name && return T(value)
    end
    throw(ArgumentError("unknown value :$x; expected one of $(join((repr(n) for (n, _) in what), ", "))"))
end

const _LAYOUTS = ((:contiguous, LibStria.STRIA_LAYOUT_CONTIGUOUS), (:striped, LibStria.STRIA_LAYOUT_STRIPED),
                  (:zigzag, LibStria.STRIA_LAYOUT_ZIGZAG))
const _TRANSPORTS = ((:local, LibStria.STRIA_TRANSPORT_LOCAL), (:ucx, LibStria.STRIA_TRANSPORT_UCX),
                     (:nccl, LibStria.STRIA_TRANSPORT_NCCL))
const _DEVICES = ((:cpu, LibStria.kDLCPU), (:cuda, LibStria.kDLCUDA))

_layout(x) = _symbol_arg(x, LibStria.stria_layout_t, _LAYOUTS)
_transport(x) = _symbol_arg(x, LibStria.stria_transport_t, _TRANSPORTS)
_device_type(x) = _symbol_arg(x, LibStria.DLDeviceType, _DEVICES)

# A copy of the immutable struct x with some fields replaced.
function _replace(x::T; kw...) where {T}
    new_values = values(kw)
    return T(map(f -> haskey(new_values, f) ? new_values[f] : getfield(x, f), fieldnames(T))...)
end

# The defaults of a C struct from its _init function. A newer libstria of the same major
# version may have grown the struct at its end, and its _init writes all of it: it writes into
# a buffer with room to spare, and we keep the prefix this binding knows, with struct_size
# saying how much that is (the library accepts an older, shorter struct).
function _initialized(::Type{T}, init, func::Symbol) where {T}
    buffer = zeros(UInt8, max(4096, 2 * sizeof(T)))
    value = GC.@preserve buffer begin
        p = Ptr{T}(pointer(buffer))
        _call(() -> init(p), func)
        unsafe_load(p)
    end
    return _replace(value; struct_size = sizeof(T))
end

"""
    UniqueId

Rank 0's rendezvous identity for the UCX and NCCL transports (`unique_id()`), to hand to every
rank (`Stria.bytes(id)` gives its 128 bytes to broadcast, `UniqueId(bytes)` rebuilds it).
"""
struct UniqueId
    id::LibStria.stria_unique_id_t
end

const _UNIQUE_ID_BYTES = sizeof(LibStria.stria_unique_id_t)

function UniqueId(bytes::AbstractVector{UInt8})
    length(bytes) == _UNIQUE_ID_BYTES ||
        throw(ArgumentError("a UniqueId has $_UNIQUE_ID_BYTES bytes, got $(length(bytes))"))
    return UniqueId(LibStria.stria_unique_id_t(ntuple(i -> reinterpret(Cchar, bytes[i]), _UNIQUE_ID_BYTES)))
end

bytes(u::UniqueId) = UInt8[reinterpret(UInt8, c) for c in u.id.internal]

"""
    unique_id() -> UniqueId

Opens rank 0's rendezvous (UCX/NCCL transports): call it on rank 0 only, and hand the result
to every rank's `Context(...; unique_id = id)`.
"""
function unique_id()
    id = Ref{LibStria.stria_unique_id_t}()
    _call(() -> LibStria.stria_get_unique_id(id), :stria_get_unique_id)
    return UniqueId(id[])
end

function _config(; rank::Integer = 0, world_size::Integer = 1, transport = :local, device = :cpu,
                 device_id::Integer = 0, unique_id::Union{Nothing,UniqueId} = nothing, timeout_s::Real = 0.0,
                 num_threads::Integer = 0)
    base = _initialized(LibStria.stria_context_config_t, LibStria.stria_context_config_init,
                        :stria_context_config_init)
    return _replace(base; rank = rank, world_size = world_size, transport = _transport(transport),
                    device = LibStria.DLDevice(_device_type(device), device_id),
                    unique_id = unique_id === nothing ? base.unique_id : unique_id.id, timeout_s = timeout_s,
                    num_threads = num_threads)
end

"""
    Context

One rank of a ring. Fields `rank` (0-based) and `world_size`. A context is driven by one
thread at a time; `close(ctx)` destroys it (the garbage collector does it otherwise).

    Context(; rank = 0, world_size = 1, transport = :local, device = :cpu, device_id = 0,
            unique_id = nothing, timeout_s = 0.0, num_threads = 0)

A context of its own (`stria_context_create`): with `transport = :ucx` or `:nccl` one per
process, all given rank 0's `unique_id()`. For ranks in one process use `local_group(n)`.
`timeout_s = 0` means the library's default; `num_threads = 0` all cores.
"""
mutable struct Context
    handle::Ptr{Cvoid}
    rank::Int
    world_size::Int

    # Takes ownership of a handle made by LibStria (it is destroyed with the Context).
    function Context(handle::Ptr{Cvoid})
        ctx = new(handle, -1, -1)
        finalizer(_destroy_quietly, ctx)  # first, so that an error below still frees the handle
        rank = Ref{Cint}(-1)
        world_size = Ref{Cint}(-1)
        _call(() -> LibStria.stria_context_get_rank(handle, rank), :stria_context_get_rank)
        _call(() -> LibStria.stria_context_get_world_size(handle, world_size), :stria_context_get_world_size)
        ctx.rank = rank[]
        ctx.world_size = world_size[]
        return ctx
    end
end

function Context(; kw...)
    _check_library()
    config = Ref(_config(; kw...))
    handle = Ref{LibStria.stria_context_t}(C_NULL)
    _call(() -> LibStria.stria_context_create(config, handle), :stria_context_create)
    return Context(handle[])
end

"""
    local_group(n; num_threads = 0, timeout_s = 0.0, device = :cpu, device_id = 0) -> Vector{Context}

`n` contexts of one process joined by the in-process transport, in rank order. A collective
(attention_forward/backward) needs all of them inside it at once, each on its own thread:
see `run_ranks`. `num_threads` is the library's CPU threads for the whole group (0: all).
"""
function local_group(n::Integer; kw...)
    _check_library()
    config = Ref(_config(; kw...))
    handles = fill(C_NULL, max(Int(n), 0))
    _call(() -> LibStria.stria_context_create_local_group(config, n, handles), :stria_context_create_local_group)
    return [Context(h) for h in handles]
end

"""
    local_group(devices; num_threads = 0, timeout_s = 0.0) -> Vector{Context}

A local group with rank `r` on `devices[r + 1]`, each a `(device, device_id)` pair such as
`(:cuda, 1)` (`stria_context_create_local_group_on_devices`): a ring over the GPUs of one process,
each rank on its own. The ranks are all `:cpu` or all `:cuda`.
"""
function local_group(devices::AbstractVector; kw...)
    _check_library()
    config = Ref(_config(; kw...))
    dl = [LibStria.DLDevice(_device_type(device), id) for (device, id) in devices]
    handles = fill(C_NULL, length(dl))
    _call(() -> LibStria.stria_context_create_local_group_on_devices(config, dl, length(dl), handles),
          :stria_context_create_local_group_on_devices)
    return [Context(h) for h in handles]
end

_destroy_quietly(ctx::Context) = _destroy(ctx, false)

function _destroy(ctx::Context, throw_errors::Bool)
    handle = ctx.handle
    handle == C_NULL && return nothing
    ctx.handle = C_NULL
    if throw_errors
        _call(() -> LibStria.stria_context_destroy(handle), :stria_context_destroy)
    else
        LibStria.stria_context_destroy(handle)  # a finalizer must not throw
    end
    return nothing
end

"""
    close(ctx::Context)

Destroys the context (`stria_context_destroy`); later calls with it fail with the library's
error. Closing twice is a no-op.
"""
Base.close(ctx::Context) = _destroy(ctx, true)

Base.isopen(ctx::Context) = ctx.handle != C_NULL

function Base.show(io::IO, ctx::Context)
    print(io, "Stria.Context(rank ", ctx.rank, " of ", ctx.world_size, isopen(ctx) ? "" : ", closed", ")")
end

"""
    abort!(ctx::Context)

Makes a call in progress on `ctx` (on another thread) fail with STRIA_ERROR_ABORTED, and every
later one too; its peers see it leave. May be called from any thread. An aborted context can
only be closed.
"""
function abort!(ctx::Context)
    GC.@preserve ctx _call(() -> LibStria.stria_context_abort(ctx.handle), :stria_context_abort)
    return ctx
end

"""
    run_ranks(f, contexts) -> Vector

Calls `f(ctx)` for every context of a local group at once, each on its own Julia thread
(`Threads.@threads :static`), and returns the results in rank order. Julia must have at least
`length(contexts)` threads (`julia -t N`): a rank left waiting for a thread would leave the
others blocked in the collective. A rank whose `f` throws aborts its context, so that its
peers fail too instead of waiting for it, and the error is rethrown.
"""
function run_ranks(f, contexts::AbstractVector{Context})
    n = length(contexts)
    if n > Threads.nthreads()
        throw(ArgumentError("$n ranks need $n Julia threads, this Julia has $(Threads.nthreads()): " *
                            "start it with `julia -t $n` (or JULIA_NUM_THREADS=$n)"))
    end
    results = Vector{Any}(undef, n)
    Threads.@threads :static for i in 1:n
        try
            results[i] = f(contexts[i])
        catch
            isopen(contexts[i]) && LibStria.stria_context_abort(contexts[i].handle)
            rethrow()
        end
    end
    return [result for result in results]  # the narrowest element type (e.g. Vector{Array{Float32,4}})
end

"""
    set_call_tag!(ctx, tag::Integer) -> ctx

Tags the context's next attention call, which takes the tag whatever its outcome (an untagged
call's is 0): ranks whose calls pair up with different tags all throw a `StriaError`
(`STRIA_ERROR_INVALID_ARGUMENT`) before any block moves, instead of exchanging blocks of
different calls (`stria_context_set_call_tag`).
"""
function set_call_tag!(ctx::Context, tag::Integer)
    0 <= tag <= typemax(UInt64) || throw(ArgumentError("tag must be in 0:typemax(UInt64), not $tag"))
    GC.@preserve ctx _call(() -> LibStria.stria_context_set_call_tag(ctx.handle, UInt64(tag)),
                           :stria_context_set_call_tag)
    return ctx
end

"""
    set_deterministic!(ctx, on::Bool) -> ctx

Makes the context's backward calls give the same bits on every run (off by default). CPU
contexts always do; on CUDA the tensor-core backward then computes dQ in a pass of its own
instead of with float atomics (`stria_context_set_deterministic`).
"""
function set_deterministic!(ctx::Context, on::Bool)
    GC.@preserve ctx _call(() -> LibStria.stria_context_set_deterministic(ctx.handle, Cint(on)),
                           :stria_context_set_deterministic)
    return ctx
end

"""
    set_grid!(ctx, ulysses::Integer) -> ctx

Makes the context's ranks a grid of all-to-all groups of `ulysses` consecutive ranks within a
ring of `world_size ÷ ulysses` groups (`stria_context_set_grid`; 1, the plain ring, by default).
A call then swaps sequence shards for head shards within the group, runs the ring across the
groups and swaps back; `ulysses` must divide the query heads, and divide the K/V heads or be a
multiple of them. Tokens are placed by `grid_positions` (`grid_shard!`). Every rank sets the
same value, between calls.
"""
function set_grid!(ctx::Context, ulysses::Integer)
    GC.@preserve ctx _call(() -> LibStria.stria_context_set_grid(ctx.handle, Cint(ulysses)), :stria_context_set_grid)
    return ctx
end

"""
    grid(ctx) -> Int

The size of the context's all-to-all groups (`set_grid!`; `stria_context_get_grid`).
"""
function grid(ctx::Context)
    out = Ref{Cint}(0)
    GC.@preserve ctx _call(() -> LibStria.stria_context_get_grid(ctx.handle, out), :stria_context_get_grid)
    return Int(out[])
end

"""
    traffic(ctx) -> NamedTuple

What this rank sent in the context's last attention call:
`(kv_bytes, dkv_bytes, messages, all_to_all_bytes)` (`stria_context_get_traffic`). A call on a
document plan sends only the K/V rows that ranks further along the ring see; a grid's call also
sends its all-to-all within the group.
"""
function traffic(ctx::Context)
    out = Ref(LibStria.stria_traffic_t(sizeof(LibStria.stria_traffic_t), 0, 0, 0, 0))
    GC.@preserve ctx _call(() -> LibStria.stria_context_get_traffic(ctx.handle, out), :stria_context_get_traffic)
    t = out[]
    return (kv_bytes = Int(t.kv_bytes), dkv_bytes = Int(t.dkv_bytes), messages = Int(t.messages),
            all_to_all_bytes = Int(t.all_to_all_bytes))
end

"""
    step_times(ctx) -> Vector{NamedTuple}

Where the time of the context's last attention call went, one entry per ring step:
`(compute_s, compute_cpu_s, wait_s)` (`stria_context_get_step_times`).
"""
function step_times(ctx::Context)
    count = Ref{Cint}(0)
    steps = GC.@preserve ctx begin
        _call(() -> LibStria.stria_context_get_step_times(ctx.handle, C_NULL, 0, count),
              :stria_context_get_step_times)
        buffer = Vector{LibStria.stria_step_time_t}(undef, count[])
        _call(() -> LibStria.stria_context_get_step_times(ctx.handle, buffer, length(buffer), count),
              :stria_context_get_step_times)
        buffer
    end
    return [(compute_s = s.compute_s, compute_cpu_s = s.compute_cpu_s, wait_s = s.wait_s)
            for s in steps[1:min(length(steps), count[])]]
end
