# A storage type for bfloat16 tensors, so that Stria.jl needs no package beyond the standard
# library. It converts to and from Float32 and does no arithmetic of its own: compute in
# Float32/Float64 and convert. (Data from BFloat16s.jl or Core.BFloat16 can be passed as is,
# see dltype below, or reinterpreted: `reinterpret(Stria.BFloat16, a)`.)

"""
    BFloat16

The upper half of a Float32 (8 exponent bits, 7 mantissa bits): DLPack's bfloat16.
`BFloat16(x)` rounds to nearest even; `Float32(b)` and `Float64(b)` are exact.
"""
primitive type BFloat16 <: AbstractFloat 16 end

function BFloat16(x::Float32)
    isnan(x) && return reinterpret(BFloat16, 0x7fc0)  # a quiet NaN (rounding could make it Inf)
    bits = reinterpret(UInt32, x)
    bits += 0x00007fff + ((bits >> 16) & 0x00000001)  # round to nearest, ties to even
    return reinterpret(BFloat16, (bits >> 16) % UInt16)
end
BFloat16(x::Float64) = BFloat16(Float32(x))
BFloat16(x::Float16) = BFloat16(Float32(x))
BFloat16(x::Integer) = BFloat16(Float32(x))

Base.Float32(x::BFloat16) = reinterpret(Float32, UInt32(reinterpret(UInt16, x)) << 16)
Base.Float64(x::BFloat16) = Float64(Float32(x))

Base.isnan(x::BFloat16) = isnan(Float32(x))
Base.isfinite(x::BFloat16) = isfinite(Float32(x))
Base.promote_rule(::Type{Float32}, ::Type{BFloat16}) = Float32
Base.promote_rule(::Type{Float64}, ::Type{BFloat16}) = Float64
Base.show(io::IO, x::BFloat16) = print(io, "BFloat16(", Float32(x), ")")
