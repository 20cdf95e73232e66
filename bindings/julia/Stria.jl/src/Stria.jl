"""
    Stria

Exact ring attention (striped, zigzag or contiguous token layouts) over a sequence sharded
across ranks, from Julia: a thin idiomatic layer over `Stria.LibStria`, the raw ccall
wrappers generated from the C header.

Arrays are Julia arrays, column-major: a Julia array of size `(D, H, L, B)` is the C-order
tensor `[B, L, H, D]` of the C API (the same memory, the dimensions read in reverse), so

| C API (row-major)        | Julia (column-major)    |
|:------------------------ |:----------------------- |
| q  `[B, L, Hq, D]`        | `q  :: (D, Hq, L, B)`   |
| k, v `[B, L, Hkv, D]`     | `k, v :: (D, Hkv, L, B)`|
| out, dq like q; dk, dv like k | the same            |
| lse `[B, Hq, L]` Float32  | `lse :: (L, Hq, B)`     |

and the sequence dimension of q, k, v is Julia dimension 3 (dimension 1 of lse). Ranks,
positions and the C API's `seq_dim` are 0-based, as in C; Julia dimensions (`dims`) are
1-based, as in Julia.

Packed documents of uneven lengths run best on a `Plan`, which places the tokens so that every
rank does about the same work at every ring step (`attention_forward!(...; plan)`).

The library is found by its SONAME (`libstria.so.0`) on the dynamic linker's path, or taken
from `ENV["STRIA_LIB"]` (a full path) when the package is loaded.
"""
module Stria

using Libdl

include("LibStria.jl")  # module LibStria: generated, one wrapper per C function

include("errors.jl")
include("bfloat16.jl")
include("tensors.jl")
include("context.jl")
include("plan.jl")
include("attention.jl")
include("serving.jl")
include("layout.jl")

export StriaError, Context, local_group, run_ranks, abort!, set_call_tag!, set_deterministic!, set_grid!, grid, step_times,
       traffic, UniqueId, grid_positions, grid_shard!, grid_unshard!,
       unique_id, attention_forward, attention_forward!, attention_backward, attention_backward!, attention_decode!, attention_prefill!,
       positions, shard, shard!, unshard, unshard!, analyze_balance, analyze_balance_steps,
       library_version, Plan, local_len, plan_info

function __init__()
    path = get(ENV, "STRIA_LIB", "")
    isempty(path) || load_library(path)
    return nothing
end

"""
    Stria.load_library(path)

Loads libstria from `path` so that every `LibStria` ccall uses that file. Called at load time
with `ENV["STRIA_LIB"]` when it is set. The ccalls name the library by its SONAME, and the
dynamic linker resolves a SONAME to a library already loaded under it: this checks that the
file at `path` is the one they will reach.
"""
function load_library(path::AbstractString)
    isfile(path) || error("STRIA_LIB / load_library: no such file: $path")
    Libdl.dlopen(path, Libdl.RTLD_NOW)  # throws with the dynamic linker's message
    reached = Libdl.dlpath(LibStria.libstria)
    if realpath(reached) != realpath(path)
        error("loaded $path, but $(LibStria.libstria) resolves to $reached: is $path a libstria " *
              "with SONAME $(LibStria.libstria)?")
    end
    return reached
end

"""
    library_version() -> VersionNumber

The version of the libstria that is loaded (`stria_get_version()`), which may differ from the
header this binding was generated from (`LibStria.STRIA_VERSION`).
"""
function library_version()
    v = Int(LibStria.stria_get_version())
    return VersionNumber(v ÷ 10000, (v ÷ 100) % 100, v % 100)
end

const _library_checked = Ref(false)

# The binding's structs are those of its header's major version: a library of another major
# version has another ABI. Checked once, before the first context.
function _check_library()
    _library_checked[] && return nothing
    v = library_version()
    if v.major != LibStria.STRIA_VERSION_MAJOR
        error("libstria $v is loaded, but Stria.jl was generated for major version " *
              "$(LibStria.STRIA_VERSION_MAJOR): point STRIA_LIB at a matching library")
    end
    _library_checked[] = true
    return nothing
end

end # module Stria
