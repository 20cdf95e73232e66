# Julia arrays as DLTensors.
#
# Julia stores arrays column-major: element (i1, i2, ..., iN) of an array of size (n1, ..., nN)
# is at offset sum((ik - 1) * stride(a, k)). A row-major C tensor of shape [nN, ..., n1] with
# strides [stride(a, N), ..., stride(a, 1)] (in elements, as DLPack counts them) addresses the
# same memory the same way. So an array is passed with its dimensions and strides reversed and
# nothing is copied: the Julia array (D, H, L, B) is the C tensor [B, L, H, D]. The C API wants
# its last dimension contiguous, that is stride(a, 1) == 1; views (`view(qkv, :, 1:Hq, :, :)`)
# with any other strides work as they are.

"""
    Stria.dltype(T) -> LibStria.DLDataType

DLPack's type code, bits and lanes for the element type `T`. Attention takes Float32,
Float16 and BFloat16 (Stria.BFloat16, or Core.BFloat16 where Julia has it); shard/unshard
take any of these.
"""
dltype(::Type{Float16}) = LibStria.DLDataType(LibStria.kDLFloat, 16, 1)
dltype(::Type{Float32}) = LibStria.DLDataType(LibStria.kDLFloat, 32, 1)
dltype(::Type{Float64}) = LibStria.DLDataType(LibStria.kDLFloat, 64, 1)
dltype(::Type{BFloat16}) = LibStria.DLDataType(LibStria.kDLBfloat, 16, 1)
dltype(::Type{T}) where {T<:Union{Int8,Int16,Int32,Int64}} = LibStria.DLDataType(LibStria.kDLInt, 8 * sizeof(T), 1)
dltype(::Type{T}) where {T<:Union{UInt8,UInt16,UInt32,UInt64}} =
    LibStria.DLDataType(LibStria.kDLUInt, 8 * sizeof(T), 1)
dltype(::Type{ComplexF32}) = LibStria.DLDataType(LibStria.kDLComplex, 64, 1)
dltype(::Type{ComplexF64}) = LibStria.DLDataType(LibStria.kDLComplex, 128, 1)
@static if isdefined(Core, :BFloat16)
    dltype(::Type{Core.BFloat16}) = LibStria.DLDataType(LibStria.kDLBfloat, 16, 1)
end
dltype(::Type{T}) where {T} = throw(ArgumentError("no DLPack data type for Julia element type $T"))

"""
    Stria.TensorRef(a::StridedArray)

A `LibStria.DLTensor` describing the memory of `a` (dimensions and strides reversed, see
above), on the CPU. It keeps `a` and the shape and stride vectors the tensor points into: use
it under `GC.@preserve` while the C side may read the pointers. `ref` converts to
`Ptr{DLTensor}` in a ccall.
"""
mutable struct TensorRef
    ref::Base.RefValue{LibStria.DLTensor}
    shape::Vector{Int64}
    strides::Vector{Int64}
    array::Any
end

function TensorRef(a::StridedArray{T}) where {T}
    n = ndims(a)
    shape = Int64[size(a, n + 1 - i) for i in 1:n]
    strides = Int64[stride(a, n + 1 - i) for i in 1:n]
    tensor = LibStria.DLTensor(
        Ptr{Cvoid}(pointer(a)),
        LibStria.DLDevice(LibStria.kDLCPU, 0),
        n,
        dltype(T),
        pointer(shape),
        pointer(strides),
        0,  # byte_offset: pointer(a) already points at the first element of a view
    )
    return TensorRef(Ref(tensor), shape, strides, a)
end

TensorRef(a::AbstractArray) =
    throw(ArgumentError("$(typeof(a)) is not a strided array in host memory: copy it into an Array first"))
