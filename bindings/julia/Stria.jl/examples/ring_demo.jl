# Ring attention in one Julia process: a local group of N ranks, one Julia thread each, runs a
# causal forward over a sequence in the striped layout; the gathered output is compared with a
# dense Float64 attention over the whole sequence.
#
#   julia -t 4 --project=bindings/julia/Stria.jl bindings/julia/Stria.jl/examples/ring_demo.jl [N]
#
# (STRIA_LIB=/path/to/libstria.so.0 when the library is not on the dynamic linker's path.)
# Exit status 0 when the result matches, 1 when it does not.

using LinearAlgebra: norm
using Random: MersenneTwister, randn
using Stria

# Dense attention of the whole sequence in Float64: q (D, Hq, S, B), k and v (D, Hkv, S, B).
# Query head h reads key/value head (h - 1) ÷ (Hq ÷ Hkv) + 1 (grouped-query attention).
function dense_attention(q, k, v; causal::Bool, scale::Float64)
    D, Hq, S, B = size(q)
    group = Hq ÷ size(k, 2)
    out = zeros(Float64, D, Hq, S, B)
    lse = zeros(Float64, S, Hq, B)
    for b in 1:B, h in 1:Hq
        g = (h - 1) ÷ group + 1
        Q, K, V = Float64.(q[:, h, :, b]), Float64.(k[:, g, :, b]), Float64.(v[:, g, :, b])
        scores = scale .* (transpose(K) * Q)  # scores[j, i]: key j, query i
        if causal
            for i in 1:S, j in (i + 1):S
                scores[j, i] = -Inf
            end
        end
        m = maximum(scores; dims = 1)
        p = exp.(scores .- m)
        denominator = sum(p; dims = 1)
        out[:, h, :, b] = V * (p ./ denominator)
        lse[:, h, b] = vec(m .+ log.(denominator))
    end
    return out, lse
end

function main(n::Int)
    B, S, Hq, Hkv, D = 2, 32 * n, 4, 2, 32
    layout = :striped
    rng = MersenneTwister(2024)
    q = randn(rng, Float32, D, Hq, S, B)
    k = randn(rng, Float32, D, Hkv, S, B)
    v = randn(rng, Float32, D, Hkv, S, B)

    # Rank r holds the tokens at positions r, r + n, r + 2n, ...: Julia dimension 3 is the
    # sequence of a (D, H, S, B) array.
    qs, ks, vs = shard(layout, n, q; dims = 3), shard(layout, n, k; dims = 3), shard(layout, n, v; dims = 3)

    contexts = local_group(n; num_threads = 1)
    results = run_ranks(contexts) do ctx
        r = ctx.rank + 1
        out = fill!(similar(qs[r]), NaN32)  # poisoned: a token left unwritten cannot pass
        lse = fill(NaN32, S ÷ n, Hq, B)
        attention_forward!(ctx, out, lse, qs[r], ks[r], vs[r]; layout = layout, causal = true)
    end
    foreach(close, contexts)

    out = unshard(layout, [res[1] for res in results]; dims = 3)
    lse = unshard(layout, [res[2] for res in results]; dims = 1)  # lse is (L, Hq, B)
    ref_out, ref_lse = dense_attention(q, k, v; causal = true, scale = 1 / sqrt(D))
    out_error = norm(Float64.(out) .- ref_out) / norm(ref_out)
    lse_error = norm(Float64.(lse) .- ref_lse) / norm(ref_lse)
    println("ring_demo: $n ranks, B=$B S=$S Hq=$Hq Hkv=$Hkv D=$D, causal $layout, Float32, ",
            "libstria $(library_version())")
    println("ring_demo: relative error out $(round(out_error; sigdigits = 3)), lse $(round(lse_error; sigdigits = 3))")
    ok = out_error < 1e-5 && lse_error < 1e-5  # NaN compares false: a NaN fails
    println(ok ? "ring_demo: OK" : "ring_demo: FAILED (limit 1e-5)")
    return ok
end

n = isempty(ARGS) ? min(4, Threads.nthreads()) : parse(Int, ARGS[1])
exit(main(n) ? 0 : 1)
