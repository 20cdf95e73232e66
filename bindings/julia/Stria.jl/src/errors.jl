# Errors: every failed libstria call becomes a StriaError carrying the library's own message.

"""
    StriaError <: Exception

A libstria call failed. Fields:
- `status`: the C status code (compare with `LibStria.STRIA_ERROR_INVALID_ARGUMENT` etc.);
- `name`: its English name (`stria_status_string`);
- `func`: the C function that failed, e.g. `:stria_attention_forward`;
- `message`: the library's explanation (`stria_get_last_error()`), which names the argument
  at fault in the C API's terms (shapes in C order `[B, L, H, D]`, see `?Stria`).
"""
struct StriaError <: Exception
    status::LibStria.stria_status_t
    name::String
    func::Symbol
    message::String
end

function Base.showerror(io::IO, e::StriaError)
    print(io, "StriaError: ", e.func, " failed: ", e.name, " (status ", Int(e.status), "): ", e.message)
end

"""
    Stria._call(f, func::Symbol)

Runs `f()`, one libstria call returning a status, and throws a `StriaError` if it failed.

The collector is off from before the call until the message has been read, for two reasons:
- a ring collective blocks inside its ccall until the other ranks (other Julia threads) join
  it. A collection started by one of them meanwhile would wait for this thread to reach a
  safepoint, which it cannot do before they arrive: a deadlock. With the collector disabled
  (`GC.enable(false)` waits for a running collection, then blocks new ones) no collection
  starts while any rank is inside a call.
- the message lives per OS thread until the next libstria call on that thread. With the
  collector off, no finalizer (a `Context`'s `stria_context_destroy`) runs here between the
  failed call and the read, and there is no yield point at which the task could move.
"""
function _call(f, func::Symbol)
    was_enabled = GC.enable(false)
    status = LibStria.STRIA_SUCCESS
    name = ""
    message = ""
    try
        status = f()
        if status != LibStria.STRIA_SUCCESS
            message = unsafe_string(LibStria.stria_get_last_error())
            name = unsafe_string(LibStria.stria_status_string(status))
        end
    finally
        GC.enable(was_enabled)
    end
    status == LibStria.STRIA_SUCCESS || throw(StriaError(status, name, func, message))
    return nothing
end
