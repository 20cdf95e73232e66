# Stria.jl's tests: the ring against a dense Float64 reference (layouts, rank counts 1-4, causal
# and not, GQA/MQA, every dtype, forward and backward, strided views; documents, windows, softcap
# and sinks), bad inputs giving the library's errors, the layout helpers, document plans
# (positions, shard/unshard, rings on a plan against the reference, balance, bad boundaries,
# mismatched plans), and the generated structs against layout_table.json.
#
#   julia -t 4 --project=bindings/julia/Stria.jl -e 'using Pkg; Pkg.test()'
#   julia -t 4 --project=bindings/julia/Stria.jl bindings/julia/Stria.jl/test/runtests.jl
#
# Rank counts above Threads.nthreads() are skipped (with a warning): run with -t 4.

using LinearAlgebra
using Random
using Test
using Stria
using Stria: LibStria, BFloat16  # Stria.BFloat16 is not exported (BFloat16s.jl has one too)

include("reference.jl")
include("json.jl")

const RANK_COUNTS = [n for n in (1, 2, 3, 4) if n <= Threads.nthreads()]
if length(RANK_COUNTS) < 4
    @warn "Julia has $(Threads.nthreads()) threads: ring tests run with $(RANK_COUNTS) ranks only (use julia -t 4)"
end

const TOLERANCE = Dict(Float32 => 1e-5, Float16 => 2e-2, BFloat16 => 2e-2)

# The StriaError that f() throws (a test failure if it throws nothing or something else).
function stria_error(f)
    try
        f()
    catch e
        e isa StriaError && return e
        rethrow()
    end
    error("expected a StriaError, but the call succeeded")
end

poisoned(a) = fill!(similar(a), NaN)

# One ring run: shard random inputs, forward and backward on n ranks (one thread each), gather,
# compare with the dense reference of the whole sequence. With sinks, each rank's part of their
# gradient (poisoned, then written by attention_backward!) is summed over the ranks.
function check_ring(n, layout, causal, T, Hq, Hkv; B = 2, S = 24, D = 16, seed = 1, cu_seqlens = nothing,
                    window = nothing, softcap = 0, sinks = nothing, ulysses = 1)
    rng = MersenneTwister(seed)
    q = T.(randn(rng, Float32, D, Hq, S, B))
    k = T.(randn(rng, Float32, D, Hkv, S, B))
    v = T.(randn(rng, Float32, D, Hkv, S, B))
    dout = T.(randn(rng, Float32, D, Hq, S, B))
    L = S ÷ n
    # On a grid (ulysses > 1) every rank's tokens by grid_shard!, else by the layout alone.
    cut(x) = ulysses == 1 ? shard(layout, n, x; dims = 3) :
             [grid_shard!(similar(x, size(x, 1), size(x, 2), L, size(x, 4)), layout, n, ulysses, r, x; dims = 3)
              for r in 0:(n - 1)]
    qs, ks, vs, douts = (cut(x) for x in (q, k, v, dout))

    contexts = local_group(n; num_threads = 1, timeout_s = 60)
    foreach(ctx -> set_grid!(ctx, ulysses), contexts)
    results = run_ranks(contexts) do ctx
        r = ctx.rank + 1
        out, lse = poisoned(qs[r]), fill(NaN32, L, Hq, B)
        attention_forward!(ctx, out, lse, qs[r], ks[r], vs[r]; layout = layout, causal = causal,
                           cu_seqlens = cu_seqlens, window = window, softcap = softcap, sinks = sinks)
        dq, dk, dv = poisoned(qs[r]), poisoned(ks[r]), poisoned(vs[r])
        dsinks = sinks === nothing ? nothing : fill(NaN32, Hq)
        attention_backward!(ctx, dq, dk, dv, qs[r], ks[r], vs[r], out, lse, douts[r]; layout = layout,
                            causal = causal, cu_seqlens = cu_seqlens, window = window, softcap = softcap,
                            sinks = sinks, dsinks = dsinks)
        (out, lse, dq, dk, dv, dsinks)
    end
    foreach(close, contexts)

    function gather(i)
        ulysses == 1 && return unshard(layout, [res[i] for res in results]; dims = i == 2 ? 1 : 3)
        part = results[1][i]
        dims = i == 2 ? 1 : 3
        full = fill!(similar(part, ntuple(d -> d == dims ? n * size(part, d) : size(part, d), ndims(part))), NaN)
        for (r, res) in enumerate(results)
            grid_unshard!(full, layout, n, ulysses, r - 1, res[i]; dims = dims)
        end
        return full
    end
    gathered = [gather(i) for i in 1:5]
    scale = 1 / sqrt(D)
    ref_out, ref_lse = reference_forward(q, k, v; causal = causal, scale = scale, cu_seqlens = cu_seqlens,
                                         window = window, softcap = softcap, sinks = sinks)
    ref_grads = reference_backward(q, k, v, dout; causal = causal, scale = scale, cu_seqlens = cu_seqlens,
                                   window = window, softcap = softcap, sinks = sinks)
    tolerance = TOLERANCE[T]
    for (name, got, want) in zip(("out", "lse", "dq", "dk", "dv"), gathered, (ref_out, ref_lse, ref_grads[1:3]...))
        err = relative_error(got, want)
        ok = err < tolerance  # false for NaN
        ok || @error "mismatch" n layout causal T Hq Hkv softcap name err tolerance
        @test ok
    end
    if sinks !== nothing
        # A sum over every row of terms of both signs: looser than the elementwise outputs.
        name, err = "dsinks", relative_error(sum(res[6] for res in results), ref_grads[4])
        ok = err < 10 * tolerance
        ok || @error "mismatch" n layout causal T Hq Hkv softcap name err
        @test ok
    end
end

# `batch` columns of `num_seqs + 1` boundaries from 0 to S, cut at random (documents may be empty):
# the (n + 1, B) matrix the calls and plans take.
function random_documents(rng, S, num_seqs, batch)
    cu = zeros(Int64, num_seqs + 1, batch)
    for b in 1:batch
        cu[2:num_seqs, b] = sort(rand(rng, 0:S, num_seqs - 1))
        cu[num_seqs + 1, b] = S
    end
    return cu
end

# One ring on a plan, against the dense reference: inputs sharded by the plan, outputs poisoned,
# gathered by the plan's positions (not its unshard); padding slots must be rows that saw nothing.
function check_plan_ring(n, causal, T; B = 2, S = 29, Hq = 4, Hkv = 2, D = 8, num_seqs = 5, tile = 4,
                         window = nothing, pass_documents = false, local_len = 0, seed = 1)
    rng = MersenneTwister(seed)
    cu = random_documents(rng, S, num_seqs, B)
    plan = Plan(cu, S; world_size = n, causal = causal, window = window, tile = tile, local_len = local_len)
    L = Stria.local_len(plan)
    local_len > 0 && @test L == local_len
    q = T.(randn(rng, Float32, D, Hq, S, B))
    k = T.(randn(rng, Float32, D, Hkv, S, B))
    v = T.(randn(rng, Float32, D, Hkv, S, B))
    dout = T.(randn(rng, Float32, D, Hq, S, B))
    qs, ks, vs, douts = (shard(plan, x) for x in (q, k, v, dout))
    @test all(size(x) == (D, Hq, L, B) for x in qs)
    docs = pass_documents ? cu : nothing

    contexts = local_group(n; num_threads = 1, timeout_s = 60)
    results = run_ranks(contexts) do ctx
        r = ctx.rank + 1
        out, lse = poisoned(qs[r]), fill(NaN32, L, Hq, B)
        attention_forward!(ctx, out, lse, qs[r], ks[r], vs[r]; causal = causal, window = window, plan = plan,
                           cu_seqlens = docs)
        dq, dk, dv = poisoned(qs[r]), poisoned(ks[r]), poisoned(vs[r])
        attention_backward!(ctx, dq, dk, dv, qs[r], ks[r], vs[r], out, lse, douts[r]; causal = causal,
                            window = window, plan = plan, cu_seqlens = docs)
        (out, lse, dq, dk, dv)
    end
    foreach(close, contexts)

    got_out, got_dq = fill(NaN, D, Hq, S, B), fill(NaN, D, Hq, S, B)
    got_dk, got_dv = fill(NaN, D, Hkv, S, B), fill(NaN, D, Hkv, S, B)
    got_lse = fill(NaN, S, Hq, B)
    padding_bad = 0
    for (r, (out, lse, dq, dk, dv)) in enumerate(results)
        pos = positions(plan, r - 1)
        @test size(pos) == (L, B)
        for b in 1:B, i in 1:L
            p = pos[i, b]
            if p < 0
                nonzero = a -> count(x -> Float32(x) != 0, a)  # as Float32: any element type, -0 included
                padding_bad += nonzero(out[:, :, i, b]) + nonzero(dq[:, :, i, b]) + nonzero(dk[:, :, i, b]) +
                               nonzero(dv[:, :, i, b]) + count(x -> x != -Inf32, lse[i, :, b])
                continue
            end
            got_out[:, :, p + 1, b] = out[:, :, i, b]
            got_dq[:, :, p + 1, b] = dq[:, :, i, b]
            got_dk[:, :, p + 1, b] = dk[:, :, i, b]
            got_dv[:, :, p + 1, b] = dv[:, :, i, b]
            got_lse[p + 1, :, b] = lse[i, :, b]
        end
    end
    @test padding_bad == 0

    scale = 1 / sqrt(D)
    ref_out, ref_lse = reference_forward(q, k, v; causal = causal, scale = scale, cu_seqlens = cu, window = window)
    ref_dq, ref_dk, ref_dv = reference_backward(q, k, v, dout; causal = causal, scale = scale, cu_seqlens = cu,
                                                window = window)
    tolerance = TOLERANCE[T]
    for (name, got, want, tol) in zip(("out", "lse", "dq", "dk", "dv"), (got_out, got_lse, got_dq, got_dk, got_dv),
                                      (ref_out, ref_lse, ref_dq, ref_dk, ref_dv),
                                      (tolerance, 1e-5, tolerance, tolerance, tolerance))
        err = relative_error(got, want)
        ok = err < tol  # false for NaN
        ok || @error "mismatch on a plan" n causal T window pass_documents local_len name err tol
        @test ok
    end
    close(plan)
end

@testset "Stria.jl" begin
    @testset "library version and generated constants" begin
        v = library_version()
        @test v.major == LibStria.STRIA_VERSION_MAJOR
        @test LibStria.STRIA_VERSION ==
              10000 * LibStria.STRIA_VERSION_MAJOR + 100 * LibStria.STRIA_VERSION_MINOR + LibStria.STRIA_VERSION_PATCH
        @test LibStria.STRIA_LAYOUT_STRIPED == 1
        @test unsafe_string(LibStria.stria_status_string(LibStria.STRIA_ERROR_TIMEOUT)) == "timeout"
    end

    @testset "generated structs match layout_table.json" begin
        path = joinpath(@__DIR__, "..", "..", "layout_table.json")
        if !isfile(path)
            @info "layout_table.json is not beside this copy of Stria.jl: skipped"
        else
            table = parse_json(read(path, String))
            for entry in table["structs"]
                T = getfield(LibStria, Symbol(entry["julia"]))
                @test isbitstype(T)
                @test sizeof(T) == entry["size"]
                @test Base.datatype_alignment(T) == entry["align"]
                @test fieldcount(T) == length(entry["fields"])
                for (i, field) in enumerate(entry["fields"])
                    @test fieldname(T, i) == Symbol(field["name"])
                    @test Int(fieldoffset(T, i)) == field["offset"]
                    @test sizeof(fieldtype(T, i)) == field["size"]
                end
            end
            for entry in table["aliases"]
                @test sizeof(getfield(LibStria, Symbol(entry["julia"]))) == entry["size"]
            end
        end
    end

    @testset "BFloat16" begin
        @test Float32(BFloat16(1.5f0)) == 1.5f0
        @test Float32(BFloat16(1.00390625f0)) == 1.0f0  # a tie rounds to even
        @test Float32(BFloat16(1.01171875f0)) == 1.015625f0  # a tie rounds to even, upwards
        @test isnan(BFloat16(NaN32))
        @test Float32(BFloat16(Inf32)) == Inf32
        @test Float64(BFloat16(-3)) == -3.0
    end

    @testset "positions follow the layouts" begin
        for n in (1, 2, 3, 4), r in 0:(n - 1)
            S = 8 * n
            L = S ÷ n
            @test positions(:contiguous, S, n, r) == [r * L + i for i in 0:(L - 1)]
            @test positions(:striped, S, n, r) == [i * n + r for i in 0:(L - 1)]
            C = L ÷ 2
            @test positions(:zigzag, S, n, r) == [i < C ? r * C + i : (2n - 1 - r) * C + (i - C) for i in 0:(L - 1)]
        end
        # Every position once over the ranks.
        @test sort(vcat([positions(:zigzag, 24, 3, r) for r in 0:2]...)) == collect(0:23)
    end

    @testset "shard and unshard" begin
        x = reshape(collect(1:(3 * 2 * 12 * 2)), 3, 2, 12, 2)  # Int64, (D, H, S, B)
        for layout in (:contiguous, :striped, :zigzag), n in (1, 2, 3)
            parts = shard(layout, n, x; dims = 3)
            @test all(size(p) == (3, 2, 12 ÷ n, 2) for p in parts)
            for r in 0:(n - 1)  # the shard holds the tokens at the layout's positions
                @test parts[r + 1] == x[:, :, positions(layout, 12, n, r) .+ 1, :]
            end
            @test unshard(layout, parts; dims = 3) == x
        end
        lse = rand(Float32, 12, 2, 2)  # (L, H, B): the sequence is dimension 1
        @test unshard(:zigzag, shard(:zigzag, 2, lse; dims = 1); dims = 1) == lse
        @test_throws ArgumentError shard(:striped, 2, 0, x; dims = 5)
        @test_throws ArgumentError shard(:diagonal, 2, 0, x; dims = 3)
        e = stria_error(() -> shard(:striped, 5, 0, x; dims = 3))  # 12 tokens over 5 ranks
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && !isempty(e.message)
    end

    @testset "balance analysis" begin
        S, n = 64, 4
        dense = analyze_balance(:striped, S, n; causal = false)
        @test dense.total_work == S^2
        @test dense.imbalance ≈ 1
        causal = analyze_balance(:striped, S, n; causal = true)
        @test causal.total_work == S * (S + 1) ÷ 2
        @test causal.speedup ≈ causal.total_work / causal.ring_latency
        @test analyze_balance(:contiguous, S, n).imbalance > causal.imbalance  # striping balances
        steps = analyze_balance_steps(:striped, S, n; causal = true)
        @test size(steps) == (n, n)
        @test sum(steps) ≈ causal.total_work
        @test sum(maximum(steps; dims = 1)) ≈ causal.ring_latency  # busiest rank of each step
        e = stria_error(() -> analyze_balance(:striped, 10, 3))
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && !isempty(e.message)
        @test_throws StriaError analyze_balance_steps(:zigzag, 6, 2)
    end

    @testset "bad inputs give the library's errors" begin
        e = stria_error(() -> positions(7, 16, 2, 0))  # no such layout
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT
        @test !isempty(e.message) && e.func == :stria_layout_positions
        @test occursin("stria_layout_positions", sprint(showerror, e))
        @test stria_error(() -> positions(:zigzag, 6, 2, 0)).status == LibStria.STRIA_ERROR_INVALID_ARGUMENT
        @test stria_error(() -> positions(:striped, 16, 2, 2)).status == LibStria.STRIA_ERROR_INVALID_ARGUMENT
        @test !isempty(stria_error(() -> local_group(0)).message)
        mixed = stria_error(() -> local_group([(:cpu, 0), (:cuda, 0)]))
        @test mixed.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && occursin("devices[1]", mixed.message)
        on_cpus = local_group([(:cpu, 0), (:cpu, 0)]; num_threads = 1)
        @test [c.rank for c in on_cpus] == [0, 1]
        foreach(close, on_cpus)

        ctx = only(local_group(1; num_threads = 1))
        D, H, L, B = 8, 2, 4, 1
        q, k, v = rand(Float32, D, H, L, B), rand(Float32, D, H, L, B), rand(Float32, D, H, L, B)
        out, lse = similar(q), Array{Float32}(undef, L, H, B)
        strided_q = view(rand(Float32, 2D, H, L, B), 1:2:(2D), :, :, :)  # stride(q, 1) == 2
        bad_calls = [
            "k shorter than q" => () -> attention_forward!(ctx, out, lse, q, k[:, :, 1:2, :], v),
            "Float64 inputs" => () -> attention_forward(ctx, Float64.(q), Float64.(k), Float64.(v)),
            "q strided in D" => () -> attention_forward!(ctx, out, lse, strided_q, k, v),
            "lse not Float32" => () -> attention_forward!(ctx, out, zeros(Float64, L, H, B), q, k, v),
            "Hq not a multiple of Hkv" => () -> attention_forward(ctx, rand(Float32, D, 3, L, B), k, v),
            "q of 3 dimensions" => () -> attention_forward(ctx, q[:, :, :, 1], k, v),
            "bad layout code" => () -> attention_forward(ctx, q, k, v; layout = 9),
        ]
        for (what, call) in bad_calls
            e = stria_error(call)
            ok = e.status != LibStria.STRIA_SUCCESS && !isempty(e.message)
            ok || @error "no proper error for" what e
            @test ok
        end
        # The context still works after rejected calls.
        attention_forward!(ctx, out, lse, q, k, v)
        @test all(isfinite, out) && all(isfinite, lse)
        close(ctx)
        @test !isopen(ctx)
        close(ctx)  # twice is a no-op
        e = stria_error(() -> attention_forward(ctx, q, k, v))  # a closed context
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && !isempty(e.message)
        @test_throws ArgumentError Stria.TensorRef(1:3)
        @test_throws ArgumentError attention_forward(only(local_group(1)), q, k, v; layout = :diagonal)
    end

    @testset "abort" begin
        a, b = local_group(2; timeout_s = 30)
        abort!(a)
        q = rand(Float32, 8, 2, 4, 1)
        e = stria_error(() -> attention_forward(a, q, q, q))
        @test e.status == LibStria.STRIA_ERROR_ABORTED && !isempty(e.message)
        close(a)
        close(b)
    end

    @testset "packed documents: $n ranks" for n in RANK_COUNTS
        shared = [0, 5, 5, 13, 24]            # every batch column; one document empty
        per_column = [0 0; 7 3; 24 11; 24 24]  # a column per batch row, the second padded
        seed = 100
        for layout in (:contiguous, :striped, :zigzag), causal in (true, false), docs in (shared, per_column)
            seed += 1
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, cu_seqlens = docs)
        end
        ctx = Context()
        q = zeros(Float32, 16, 2, 8, 1)
        @test_throws ArgumentError attention_forward(ctx, q, q, q; cu_seqlens = [8])
        @test_throws ArgumentError attention_forward(ctx, q, q, q; cu_seqlens = [0 0; 8 8])
        @test occursin("decreases", stria_error(() -> attention_forward(ctx, q, q, q; cu_seqlens = [0, 5, 3, 8])).message)
        close(ctx)
    end

    @testset "sliding window: $n ranks" for n in RANK_COUNTS
        seed = 200
        for layout in (:contiguous, :striped, :zigzag), causal in (true, false)
            seed += 1
            window = causal ? (5, -1) : (4, 3)
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, window = window)
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, window = window, cu_seqlens = [0, 9, 24])
        end
        ctx = Context()
        q = zeros(Float32, 16, 2, 8, 1)
        @test_throws ArgumentError attention_forward(ctx, q, q, q; window = 3)
        @test occursin("window_left -2", stria_error(() -> attention_forward(ctx, q, q, q; window = (-2, 0))).message)
        close(ctx)
    end

    @testset "softcap and sinks: $n ranks" for n in RANK_COUNTS
        sinks = rand(MersenneTwister(400 + n), Float32, 4) .* 4 .- 0.5f0  # Hq = 4 logits near the scores' size
        per_column = [0 0; 9 5; 24 17; 24 24]
        seed = 400
        for layout in (:contiguous, :striped, :zigzag), causal in (true, false)
            seed += 1
            window = causal ? (5, -1) : (4, 3)
            # softcap 2 bends scores of about +-1 (randn q and k, scale 1/sqrt(D)) visibly.
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, softcap = 2)
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, sinks = sinks)
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, softcap = 2, sinks = sinks,
                       cu_seqlens = per_column, window = window)
        end
    end

    @testset "grids of all-to-all groups: $n ranks" for n in RANK_COUNTS
        seed = 500
        for ulysses in filter(u -> n % u == 0 && 4 % u == 0, 2:n), layout in (:contiguous, :striped, :zigzag),
            causal in (true, false)
            seed += 1
            check_ring(n, layout, causal, Float32, 4, 2; seed = seed, ulysses = ulysses)
            check_ring(n, layout, causal, Float32, 4, 1; seed = seed, ulysses = ulysses, softcap = 2,
                       sinks = Float32[0.5, -1, 0, 1], cu_seqlens = [0, 9, 24])
        end
        @test grid_positions(:striped, 8, 4, 2, 3) == [5, 7]
        @test analyze_balance(:zigzag, 96, 8; tile = 4, ulysses = 4).ring_latency ≈
              analyze_balance(:zigzag, 96, 2; tile = 4).ring_latency / 4
        plan = Plan([0, 2, 7], 7; world_size = 2, tile = 1, local_len = 4)
        @test vcat(grid_positions(plan, 2, 2), grid_positions(plan, 2, 3)) == positions(plan, 1)
        close(plan)
        ctx = Context()
        @test grid(ctx) == 1
        @test occursin("divide the world size", stria_error(() -> set_grid!(ctx, 2)).message)
        close(ctx)
    end

    @testset "decode over a sharded cache: $n ranks" for n in RANK_COUNTS
        D, Hq, Hkv, B, T, C = 8, 4, 2, 2, 2, 10
        rng = MersenneTwister(700 + n)
        S = n * C
        kf, vf = randn(rng, Float32, D, Hkv, S, B), randn(rng, Float32, D, Hkv, S, B)
        q = randn(rng, Float32, D, Hq, T, B)
        lens = [3, S - T]
        k_new = cat([kf[:, :, lens[b]+1:lens[b]+T, b] for b in 1:B]...; dims = 4)
        v_new = cat([vf[:, :, lens[b]+1:lens[b]+T, b] for b in 1:B]...; dims = 4)
        # The float64 reference over the whole cache: query t of sequence b (position lens[b] + t - 1)
        # against positions 0 .. lens[b] + t - 1.
        want = zeros(Float64, D, Hq, T, B)
        for b in 1:B, t in 1:T, h in 1:Hq
            hk = (h - 1) ÷ (Hq ÷ Hkv) + 1
            keys = 1:(lens[b] + t)
            s = [sum(Float64.(q[:, h, t, b]) .* Float64.(kf[:, hk, j, b])) / sqrt(D) for j in keys]
            w = exp.(s .- maximum(s))
            w ./= sum(w)
            want[:, h, t, b] = sum(w[i] .* Float64.(vf[:, hk, j, b]) for (i, j) in enumerate(keys))
        end
        outs = run_ranks(local_group(n; num_threads = 1, timeout_s = 60)) do ctx
            rank = ctx.rank
            # This rank's striped share of the prefix: position p on rank p % n, slot p ÷ n.
            kc, vc = fill(NaN32, D, Hkv, C, B), fill(NaN32, D, Hkv, C, B)
            for b in 1:B, p in rank:n:(lens[b] - 1)
                kc[:, :, p ÷ n + 1, b] = kf[:, :, p + 1, b]
                vc[:, :, p ÷ n + 1, b] = vf[:, :, p + 1, b]
            end
            out = similar(q)
            attention_decode!(ctx, out, q, kc, vc, lens; k_new = k_new, v_new = v_new)
            out
        end
        for out in outs
            @test norm(Float64.(out) .- want) / norm(want) < 1e-5
            @test out == outs[1]
        end
    end

    @testset "prefill over a sharded cache: $n ranks, $mode" for n in RANK_COUNTS, mode in (:pass_kv, :pass_q, :auto)
        D, Hq, Hkv, B, C, L = 8, 4, 2, 2, 12, 2
        P = L * n
        rng = MersenneTwister(800 + n)
        S = n * C
        kf, vf = randn(rng, Float32, D, Hkv, S, B), randn(rng, Float32, D, Hkv, S, B)
        qf = randn(rng, Float32, D, Hq, P, B)
        lens = [1, S - P]
        # The reference: chunk position c of sequence b at position lens[b] + c against positions 0 .. that.
        want = zeros(Float64, D, Hq, P, B)
        for b in 1:B, c in 1:P, h in 1:Hq
            hk = (h - 1) ÷ (Hq ÷ Hkv) + 1
            keys = 1:(lens[b] + c)
            s = [sum(Float64.(qf[:, h, c, b]) .* Float64.(kf[:, hk, j, b])) / sqrt(D) for j in keys]
            w = exp.(s .- maximum(s))
            w ./= sum(w)
            want[:, h, c, b] = sum(w[i] .* Float64.(vf[:, hk, j, b]) for (i, j) in enumerate(keys))
        end
        results = run_ranks(local_group(n; num_threads = 1, timeout_s = 60)) do ctx
            rank = ctx.rank
            kc, vc = fill(NaN32, D, Hkv, C, B), fill(NaN32, D, Hkv, C, B)
            for b in 1:B, p in rank:n:(lens[b] - 1)
                kc[:, :, p ÷ n + 1, b] = kf[:, :, p + 1, b]
                vc[:, :, p ÷ n + 1, b] = vf[:, :, p + 1, b]
            end
            mine = positions(:striped, P, n, rank) .+ 1  # 1-based chunk positions
            q = qf[:, :, mine, :]
            k = cat([kf[:, :, lens[b] .+ mine, b] for b in 1:B]...; dims = 4)
            v = cat([vf[:, :, lens[b] .+ mine, b] for b in 1:B]...; dims = 4)
            out = similar(q)
            attention_prefill!(ctx, out, q, k, v, kc, vc, lens; mode = mode)
            (mine, out)
        end
        for (mine, out) in results
            @test norm(Float64.(out) .- want[:, :, mine, :]) / norm(want[:, :, mine, :]) < 1e-5
        end
    end

    @testset "softcap and sinks: keywords, results and errors" begin
        ctx = Context()
        rng = MersenneTwister(410)
        q, k, v, dout = (randn(rng, Float32, 16, 4, 8, 2) for _ in 1:4)
        sinks = Float32[0.5, -1, 2, 0]
        scale = 1 / sqrt(16)
        out, lse = attention_forward(ctx, q, k, v; softcap = 3, sinks = sinks)
        grads = attention_backward(ctx, q, k, v, out, lse, dout; softcap = 3, sinks = sinks)
        @test length(grads) == 4 && size(grads[4]) == (4,) && eltype(grads[4]) == Float32
        ref_out, ref_lse = reference_forward(q, k, v; causal = true, scale = scale, softcap = 3, sinks = sinks)
        ref_grads = reference_backward(q, k, v, dout; causal = true, scale = scale, softcap = 3, sinks = sinks)
        @test relative_error(out, ref_out) < 1e-5
        @test relative_error(lse, ref_lse) < 1e-5
        for i in 1:3
            @test relative_error(grads[i], ref_grads[i]) < 1e-5
        end
        @test relative_error(grads[4], ref_grads[4]) < 1e-4
        # attention_backward! writes the dsinks given and returns it fourth; with sinks but no
        # dsinks, and without sinks, the gradients of q, k and v only.
        dsinks = fill(NaN32, 4)
        result = attention_backward!(ctx, similar(q), similar(k), similar(v), q, k, v, out, lse, dout;
                                     softcap = 3, sinks = sinks, dsinks = dsinks)
        @test length(result) == 4 && result[4] === dsinks
        @test relative_error(dsinks, ref_grads[4]) < 1e-4
        result = attention_backward!(ctx, similar(q), similar(k), similar(v), q, k, v, out, lse, dout;
                                     softcap = 3, sinks = sinks)
        @test length(result) == 3 && relative_error(result[1], ref_grads[1]) < 1e-5
        plain_out, plain_lse = attention_forward(ctx, q, k, v)
        @test length(attention_backward(ctx, q, k, v, plain_out, plain_lse, dout)) == 3

        e = stria_error(() -> attention_backward(ctx, q, k, v, out, lse, dout; dsinks = zeros(Float32, 4)))
        @test occursin("params->sinks is NULL", e.message)
        e = stria_error(() -> attention_forward(ctx, q, k, v; sinks = zeros(Float32, 3)))  # Hq is 4
        @test occursin("params->sinks", e.message)
        @test occursin("float32", stria_error(() -> attention_forward(ctx, q, k, v; sinks = zeros(Float64, 4))).message)
        @test occursin("params->softcap", stria_error(() -> attention_forward(ctx, q, k, v; softcap = -1)).message)
        @test_throws ArgumentError attention_forward(ctx, q, k, v; sinks = 0.5f0)
        @test_throws ArgumentError attention_forward(ctx, q, k, v; sinks = zeros(Float32, 4, 1))
        @test_throws ArgumentError attention_backward(ctx, q, k, v, out, lse, dout; sinks = sinks,
                                                      dsinks = zeros(Float32, 4, 1))
        close(ctx)
    end

    @testset "plans: positions cover each row once, shard and unshard round trip" begin
        rng = MersenneTwister(11)
        B = 2
        for n in 1:5, S in (1, 7, 29, 64), tile in (1, 4, 128), docs in (1, 3, 9)
            docs > S && continue
            cu = random_documents(rng, S, docs, B)
            plan = Plan(cu, S; world_size = n, tile = tile)
            @test plan_info(plan) == (world_size = n, batch = B, num_seqs = docs, seq_len = S,
                                      local_len = Stria.local_len(plan))
            L = Stria.local_len(plan)
            @test L >= cld(S, n)
            x = reshape(collect(Int64, 1:(3 * S * B)), 3, S, B)  # (3, S, B): the sequence is dimension 2
            seen = zeros(Int, S, B)
            parts = shard(plan, x; dims = 2)
            for r in 0:(n - 1)
                pos = positions(plan, r)
                @test size(pos) == (L, B)
                @test all(-1 .<= pos .< S)
                part = parts[r + 1]
                @test size(part) == (3, L, B)
                for b in 1:B, i in 1:L
                    p = pos[i, b]
                    if p < 0
                        @test all(iszero, part[:, i, b])  # padding is zeros
                    else
                        seen[p + 1, b] += 1
                        @test part[:, i, b] == x[:, p + 1, b]
                    end
                end
                @test shard!(fill(Int64(-7), 3, L, B), plan, r, x; dims = 2) == part
            end
            @test all(==(1), seen)  # every token of every row on exactly one rank
            @test unshard(plan, parts; dims = 2) == x
            close(plan)
        end
        # One document a row by default; a vector of boundaries serves every batch row.
        @test Plan(nothing, 10; world_size = 3, tile = 2).num_seqs == 1
        @test Plan([0, 4, 10], 10; world_size = 3, batch = 2, tile = 2).batch == 2
    end

    @testset "plans: ring vs dense reference" begin
        if 3 in RANK_COUNTS
            seed = 300
            for causal in (true, false), pass_documents in (false, true)
                seed += 1
                check_plan_ring(3, causal, Float32; pass_documents = pass_documents, seed = seed)
            end
            check_plan_ring(3, true, Float32; S = 40, window = (5, -1), seed = 310)
            check_plan_ring(3, false, Float32; S = 40, window = (4, 3), pass_documents = true, seed = 311)
            check_plan_ring(3, true, Float32; local_len = 24, seed = 312)
            check_plan_ring(3, true, Float32; S = 23, num_seqs = 2, tile = 128, seed = 313)
            check_plan_ring(3, true, BFloat16; seed = 314)
        end
        for n in RANK_COUNTS
            n == 3 || check_plan_ring(n, true, Float32; S = 31, seed = 320 + n)
        end
    end

    @testset "plans: bad boundaries and configs give the library's errors" begin
        plan_error(cu, S; kw...) = stria_error(() -> Plan(cu, S; world_size = 4, tile = 16, kw...))
        @test occursin("decreases", plan_error([0, 5, 3, 10], 10).message)
        @test occursin("ends at 9", plan_error([0, 5, 9], 10).message)
        @test occursin("starts at 1", plan_error([1, 5, 10], 10).message)
        @test occursin("batch 0", plan_error([0, 10], 10; batch = 0).message)
        @test occursin("too small", plan_error([0, 10], 10; local_len = 2).message)
        @test occursin("window_left -3", plan_error([0, 10], 10; window = (-3, -1)).message)
        e = plan_error([0, 10], 10; strategy = :zigzag)  # 10 tokens are no zigzag over 4 ranks
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && e.func == :stria_plan_create
        @test occursin("world_size 0", stria_error(() -> Plan([0, 10], 10; world_size = 0)).message)
        @test_throws ArgumentError Plan([0 0; 10 10], 10; world_size = 2, batch = 3)  # 2 columns, not 3
        @test_throws ArgumentError Plan([10], 10; world_size = 2)
        @test_throws ArgumentError Plan([0, 10], 10; world_size = 2, strategy = :diagonal)

        plan = Plan([0, 4, 10], 10; world_size = 4, tile = 16)
        @test occursin("rank 4", stria_error(() -> positions(plan, 4)).message)
        @test occursin("tile 0", stria_error(() -> analyze_balance(plan; tile = 0)).message)
        @test_throws StriaError analyze_balance_steps(plan; tile = 0)
        e = stria_error(() -> shard(plan, 0, zeros(Float32, 2, 9, 1)))  # 9 tokens for a plan of 10
        @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT && !isempty(e.message)
        @test_throws ArgumentError unshard(plan, [zeros(Float32, 2, Stria.local_len(plan), 1) for _ in 1:3])
        close(plan)
        @test !isopen(plan)
        close(plan)  # twice is a no-op
        @test_throws ArgumentError positions(plan, 0)
        ctx = Context()
        q = zeros(Float32, 8, 2, 10, 1)
        @test_throws ArgumentError attention_forward(ctx, q, q, q; plan = plan)  # never the layout instead
        close(ctx)
    end

    @testset "plans: balance" begin
        rng = MersenneTwister(3)
        S = 4096
        cu = [0, 2000]
        while cu[end] < S
            push!(cu, min(S, cu[end] + rand(rng, 1:64)))
        end
        for n in (2, 4, 8)
            plan = Plan(cu, S; world_size = n, tile = 16)
            b = analyze_balance(plan; tile = 16)
            steps = analyze_balance_steps(plan; tile = 16)
            @test size(steps) == (n, n)
            @test sum(steps) ≈ b.total_work
            @test sum(maximum(steps; dims = 1)) ≈ b.ring_latency  # busiest rank of each step
            @test 0 < b.ideal_latency <= b.ring_latency
            for layout in (:contiguous, :striped, :zigzag)
                fixed = analyze_balance(Plan(cu, S; world_size = n, tile = 16, strategy = layout); tile = 16)
                @test b.ideal_latency / b.ring_latency > fixed.ideal_latency / fixed.ring_latency
            end
        end
        # A layout's ideal at exact pairs: every causal pair once, over N.
        causal = analyze_balance(:striped, 64, 4; causal = true)
        @test causal.ideal_latency ≈ causal.total_work / 4
    end

    if Threads.nthreads() >= 3
        @testset "plans: mismatched plans fail on every rank" begin
            n, S, H, D = 3, 30, 2, 8
            cu, other = [0, 7, 19, 30], [0, 8, 19, 30]
            plan = Plan(cu, S; world_size = n, tile = 4)
            other_plan = Plan(other, S; world_size = n, tile = 4)
            wider = Plan(cu, S; world_size = n + 1, tile = 4)
            L = Stria.local_len(plan)
            contexts = local_group(n; num_threads = 1, timeout_s = 20)
            for mistake in (:other_plan_on_rank_one, :other_boundaries, :wrong_length, :wrong_world, :none)
                outcomes = run_ranks(contexts) do ctx
                    len = mistake === :wrong_length ? L + 1 : L
                    q = fill(0.5f0, D, H, len, 1)
                    p = plan
                    if mistake === :other_plan_on_rank_one && ctx.rank == 1
                        p = other_plan
                    elseif mistake === :wrong_world
                        p = wider
                    end
                    docs = mistake === :other_boundaries ? other : nothing
                    try
                        attention_forward(ctx, q, q, q; plan = p, cu_seqlens = docs)
                        nothing
                    catch e
                        e isa StriaError || rethrow()
                        e
                    end
                end
                for (r, e) in enumerate(outcomes)
                    if mistake === :none
                        @test e === nothing
                    else
                        ok = e isa StriaError && e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT &&
                             !isempty(e.message)
                        ok || @error "no proper error for" mistake r e
                        @test ok
                    end
                end
                if mistake === :other_boundaries
                    @test occursin("not the boundaries", outcomes[1].message)
                end
                if mistake === :wrong_length
                    @test occursin("local_len", outcomes[1].message)
                end
            end
            foreach(close, contexts)
            foreach(close, (plan, other_plan, wider))
        end
    end

    @testset "ring vs dense reference: $n ranks" for n in RANK_COUNTS
        seed = 0
        for layout in (:contiguous, :striped, :zigzag), causal in (true, false), T in (Float32, Float16, BFloat16)
            seed += 1
            Hq, Hkv = ((4, 2), (2, 2), (4, 1))[seed % 3 + 1]  # GQA, MHA, MQA in turn
            check_ring(n, layout, causal, T, Hq, Hkv; seed = seed)
        end
    end

    if Threads.nthreads() >= 2
        @testset "strided views and step times" begin
            n, D, Hq, Hkv, S, B = 2, 16, 4, 2, 16, 1
            qkv = randn(MersenneTwister(7), Float32, D, Hq + 2Hkv, S, B)  # packed heads
            parts = shard(:striped, n, qkv; dims = 3)
            contexts = local_group(n; num_threads = 1, timeout_s = 60)
            results = run_ranks(contexts) do ctx
                p = parts[ctx.rank + 1]
                q = view(p, :, 1:Hq, :, :)
                k = view(p, :, (Hq + 1):(Hq + Hkv), :, :)
                v = view(p, :, (Hq + Hkv + 1):(Hq + 2Hkv), :, :)
                out, lse = attention_forward(ctx, q, k, v; layout = :striped, causal = true)
                (out, lse, step_times(ctx), traffic(ctx))
            end
            foreach(close, contexts)
            full = unshard(:striped, parts; dims = 3)
            ref_out, _ = reference_forward(full[:, 1:Hq, :, :], full[:, (Hq + 1):(Hq + Hkv), :, :],
                                           full[:, (Hq + Hkv + 1):end, :, :]; causal = true, scale = 1 / sqrt(D))
            @test relative_error(unshard(:striped, [r[1] for r in results]; dims = 3), ref_out) < 1e-5
            @test all(length(r[3]) == n for r in results)
            # Whole blocks (no plan), one K/V message a step but the last; a forward sends no dK/dV.
            @test all(r[4].messages == n - 1 && r[4].kv_bytes > 0 && r[4].dkv_bytes == 0 for r in results)
        end

        @testset "calls tagged differently fail instead of pairing" begin
            contexts = local_group(2; num_threads = 1, timeout_s = 60)
            q = rand(Float32, 8, 2, 4, 1)
            outcomes = run_ranks(contexts) do ctx
                set_call_tag!(ctx, 5)
                attention_forward(ctx, q, q, q)  # alike: runs
                set_call_tag!(ctx, ctx.rank == 0 ? 0xa1 : 0xb2)
                e = stria_error(() -> attention_forward(ctx, q, q, q))
                attention_forward(ctx, q, q, q)  # untagged on both: the failed call took its tag
                e
            end
            for e in outcomes
                @test e.status == LibStria.STRIA_ERROR_INVALID_ARGUMENT
                @test occursin("paired different calls", e.message) && occursin("0xa1", e.message)
            end
            @test_throws ArgumentError set_call_tag!(contexts[1], -1)
            foreach(close, contexts)
        end

        @testset "a deterministic backward repeats its bits" begin
            ctx = Context()
            q, k, v, dout = (rand(Float32, 16, 2, 8, 1) for _ in 1:4)
            out, lse = attention_forward(ctx, q, k, v)
            runs = map((true, false)) do on
                set_deterministic!(ctx, on)
                attention_backward(ctx, q, k, v, out, lse, dout)
            end
            @test all(isequal.(runs[1], runs[2]))  # the CPU backend: the same bits either way
            close(ctx)
        end

        @testset "a rank that throws aborts its peers" begin
            contexts = local_group(2; num_threads = 1, timeout_s = 60)
            q = rand(Float32, 8, 2, 4, 1)
            function failing(ctx)
                ctx.rank == 1 && error("rank 1 fails before the collective")
                return attention_forward(ctx, q, q, q)  # rank 0 waits in it for rank 1
            end
            started = time()
            @test_throws Exception run_ranks(failing, contexts)
            @test time() - started < 30  # rank 0 was released by the abort, not by the timeout
            foreach(close, contexts)
        end
    end
end
