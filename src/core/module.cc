#include "core/module.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

namespace stria {
namespace {

// The directory libstria.so was loaded from, so modules installed beside it are found first.
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) return std::string();
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

}  // namespace

Status LoadModuleSymbol(const char* name, const char* symbol, const char* hint, void** out) {
  static std::mutex mu;
  static std::map<std::string, void*>* handles = new std::map<std::string, void*>();  // never freed: modules stay
  std::lock_guard<std::mutex> lock(mu);
  const std::string file = Format("libstria-%s.so.%d", name, STRIA_VERSION_MAJOR);
  void*& handle = (*handles)[file];
  std::string errors;
  if (handle == nullptr) {
    for (const std::string& candidate : {OwnDirectory() + file, file}) {
      if (candidate.empty()) continue;
      dlerror();
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const char* e = dlerror();
      errors += Format("%s%s", errors.empty() ? "" : "; ", e ? e : candidate.c_str());
    }
  }
  if (handle == nullptr)
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s module %s could not be loaded (%s). %s", name, file.c_str(),
                 errors.c_str(), hint);
  dlerror();
  void* sym = dlsym(handle, symbol);
  if (sym == nullptr)
    return Error(STRIA_ERROR_UNSUPPORTED, "%s does not export %s: it was built for another version of stria",
                 file.c_str(), symbol);
  *out = sym;
  return Status::Ok();
}

}  // namespace stria
