# Stria.jl's tests: the ring against a dense Float64 reference (layouts, rank counts 1-4, causal
# and not, GQA/MQA, every dtype, forward and backward, strided views), bad inputs giving the
# library's errors, the layout helpers, and the generated structs against layout_table.json.
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
# compare with the dense reference of the whole sequence.
function check_ring(n, layout, causal, T, Hq, Hkv; B = 2, S = 24, D = 16, seed = 1, cu_seqlens = nothing,
                    window = nothing)
    rng = MersenneTwister(seed)
    q = T.(randn(rng, Float32, D, Hq, S, B))
    k = T.(randn(rng, Float32, D, Hkv, S, B))
    v = T.(randn(rng, Float32, D, Hkv, S, B))
    dout = T.(randn(rng, Float32, D, Hq, S, B))
    qs, ks, vs, douts = (shard(layout, n, x; dims = 3) for x in (q, k, v, dout))
    L = S ÷ n

    contexts = local_group(n; num_threads = 1, timeout_s = 60)
    results = run_ranks(contexts) do ctx
        r = ctx.rank + 1
        out, lse = poisoned(qs[r]), fill(NaN32, L, Hq, B)
        attention_forward!(ctx, out, lse, qs[r], ks[r], vs[r]; layout = layout, causal = causal,
                           cu_seqlens = cu_seqlens, window = window)
        dq, dk, dv = poisoned(qs[r]), poisoned(ks[r]), poisoned(vs[r])
        attention_backward!(ctx, dq, dk, dv, qs[r], ks[r], vs[r], out, lse, douts[r]; layout = layout,
                            causal = causal, cu_seqlens = cu_seqlens, window = window)
        (out, lse, dq, dk, dv)
    end
    foreach(close, contexts)

    gathered = [unshard(layout, [res[i] for res in results]; dims = i == 2 ? 1 : 3) for i in 1:5]
    scale = 1 / sqrt(D)
    ref_out, ref_lse = reference_forward(q, k, v; causal = causal, scale = scale, cu_seqlens = cu_seqlens,
                                         window = window)
    ref_dq, ref_dk, ref_dv = reference_backward(q, k, v, dout; causal = causal, scale = scale,
                                                cu_seqlens = cu_seqlens, window = window)
    tolerance = TOLERANCE[T]
    for (name, got, want) in zip(("out", "lse", "dq", "dk", "dv"), gathered, (ref_out, ref_lse, ref_dq, ref_dk, ref_dv))
        err = relative_error(got, want)
        ok = err < tolerance  # false for NaN
        ok || @error "mismatch" n layout causal T Hq Hkv name err tolerance
        @test ok
    end
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
                (out, lse, step_times(ctx))
            end
            foreach(close, contexts)
            full = unshard(:striped, parts; dims = 3)
            ref_out, _ = reference_forward(full[:, 1:Hq, :, :], full[:, (Hq + 1):(Hq + Hkv), :, :],
                                           full[:, (Hq + Hkv + 1):end, :, :]; causal = true, scale = 1 / sqrt(D))
            @test relative_error(unshard(:striped, [r[1] for r in results]; dims = 3), ref_out) < 1e-5
            @test all(length(r[3]) == n for r in results)
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
