# Dense attention over the whole sequence in Float64, forward and backward, written directly from
# the definition (independent of the library). Arrays are column-major as in Stria.jl:
# q (D, Hq, S, B), k and v (D, Hkv, S, B), lse (S, Hq, B). Query head h reads key/value head
# (h - 1) ÷ (Hq ÷ Hkv) + 1; causal means key j is visible to query i iff j <= i (global
# positions: the full sequence is in order here). With document boundaries `cu_seqlens` (a vector
# [0, s1, ..., S] for every batch column, or an (n + 1, B) matrix), a query sees only keys of its
# own document; with a sliding window (left, right), query i only keys i - left .. i + right
# (-1: unbounded). `softcap` > 0 turns a score s into softcap * tanh(s / softcap) before the
# masks; `sinks` (Hq logits, or nothing) adds e^z_h to the softmax denominator of every row of
# head h, with no value.

# The softmax probabilities P[j, i] (key j, query i) of one (head, batch), their lse (the sink's
# term included), and the softcap's derivative at each score (all ones without a softcap).
function _probabilities(Q, K, causal::Bool, scale::Float64, bounds = nothing, window = nothing;
                        softcap::Float64 = 0.0, sink::Float64 = -Inf)
    scores = scale .* (transpose(K) * Q)
    slope = ones(Float64, size(scores))
    if softcap > 0
        t = tanh.(scores ./ softcap)
        scores = softcap .* t
        slope = 1 .- t .^ 2
    end
    S = size(scores, 2)
    if causal
        for i in 1:S, j in (i + 1):size(scores, 1)
            scores[j, i] = -Inf
        end
    end
    if bounds !== nothing
        doc = p -> searchsortedlast(bounds, p - 1)  # the document of 1-based position p
        for i in 1:S, j in 1:size(scores, 1)
            doc(j) == doc(i) || (scores[j, i] = -Inf)
        end
    end
    if window !== nothing
        left, right = window
        for i in 1:S, j in 1:size(scores, 1)
            ((left < 0 || j >= i - left) && (right < 0 || j <= i + right)) || (scores[j, i] = -Inf)
        end
    end
    m = max.(maximum(scores; dims = 1), sink)  # without a sink (-Inf), the row's largest score
    p = exp.(scores .- m)
    denominator = sum(p; dims = 1) .+ exp.(sink .- m)
    return p ./ denominator, vec(m .+ log.(denominator)), slope
end

_heads(q, k) = (size(q, 2), size(q, 2) ÷ size(k, 2))

# Batch column b's boundaries, or nothing.
_bounds(cu_seqlens, b) = cu_seqlens === nothing ? nothing :
                         cu_seqlens isa AbstractVector ? cu_seqlens : cu_seqlens[:, b]

# Head h's sink logit; -Inf (e^-Inf = 0: no term) without sinks.
_sink(sinks, h) = sinks === nothing ? -Inf : Float64(sinks[h])

function reference_forward(q, k, v; causal::Bool, scale::Float64, cu_seqlens = nothing, window = nothing,
                           softcap::Real = 0, sinks = nothing)
    D, Hq, S, B = size(q)
    _, group = _heads(q, k)
    out = zeros(Float64, D, Hq, S, B)
    lse = zeros(Float64, S, Hq, B)
    for b in 1:B, h in 1:Hq
        g = (h - 1) ÷ group + 1
        P, l, _ = _probabilities(Float64.(q[:, h, :, b]), Float64.(k[:, g, :, b]), causal, scale,
                                 _bounds(cu_seqlens, b), window; softcap = Float64(softcap), sink = _sink(sinks, h))
        out[:, h, :, b] = Float64.(v[:, g, :, b]) * P
        lse[:, h, b] = l
    end
    return out, lse
end

# Gradients for dout of out = V P with P = softmax(scale K'Q): dV = dO P', dP = V' dO,
# dS = P .* (dP .- delta) with delta = rowsum(dO .* O), dQ = scale K dS, dK = scale Q dS'. The
# key/value heads sum the gradients of every query head that reads them. A softcap multiplies dS
# by its derivative 1 - tanh(s / softcap)^2. A sink's probability in row i is e^(z - lse_i), and
# its gradient is -sum over rows (and batch) of e^(z - lse_i) * delta_i; with sinks the result is
# (dq, dk, dv, dsinks).
function reference_backward(q, k, v, dout; causal::Bool, scale::Float64, cu_seqlens = nothing, window = nothing,
                            softcap::Real = 0, sinks = nothing)
    D, Hq, S, B = size(q)
    _, group = _heads(q, k)
    dq = zeros(Float64, size(q))
    dk = zeros(Float64, size(k))
    dv = zeros(Float64, size(v))
    dsinks = zeros(Float64, Hq)
    for b in 1:B, h in 1:Hq
        g = (h - 1) ÷ group + 1
        Q, K, V = Float64.(q[:, h, :, b]), Float64.(k[:, g, :, b]), Float64.(v[:, g, :, b])
        dO = Float64.(dout[:, h, :, b])
        z = _sink(sinks, h)
        P, l, slope = _probabilities(Q, K, causal, scale, _bounds(cu_seqlens, b), window;
                                     softcap = Float64(softcap), sink = z)
        O = V * P
        dv[:, g, :, b] .+= dO * transpose(P)
        dP = transpose(V) * dO
        delta = sum(dO .* O; dims = 1)
        dS = P .* (dP .- delta) .* slope
        dq[:, h, :, b] .+= scale .* (K * dS)
        dk[:, g, :, b] .+= scale .* (Q * transpose(dS))
        sinks === nothing || (dsinks[h] -= sum(exp.(z .- l) .* vec(delta)))
    end
    return sinks === nothing ? (dq, dk, dv) : (dq, dk, dv, dsinks)
end

# ||got - want|| / ||want||; any NaN in got gives NaN (which fails every `<` check). Matching
# -Inf entries (lse of a row without keys) count as equal.
function relative_error(got, want)
    g, w = Float64.(vec(got)), Float64.(vec(want))
    any(isnan, g) && return NaN
    both_inf = (g .== w) .& isinf.(w)
    g, w = g[.!both_inf], w[.!both_inf]
    den = sqrt(sum(abs2, w))
    num = sqrt(sum(abs2, g .- w))
    return den > 0 ? num / den : num
end
