// Runtime-loaded modules (DESIGN.md, pluggable parts): the CUDA backend and the UCX and NCCL
// transports live in libstria-<name>.so.<major> beside libstria.so, so the core loads and runs on
// machines that have none of their system libraries.
//
// A module exports one C symbol, stria_<name>_module_v<N>, pointing at a table whose first field
// is its ABI version; the core refuses a table of another version.
#pragma once

#include "core/status.h"

namespace stria {

// Loads (once; later calls reuse the handle) the module `name` and resolves `symbol` in it.
// A missing file or system library is STRIA_ERROR_UNSUPPORTED naming what is missing and how to
// get it (`hint`).
Status LoadModuleSymbol(const char* name, const char* symbol, const char* hint, void** out);

}  // namespace stria
