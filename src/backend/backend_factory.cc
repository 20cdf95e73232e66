// Backend selection: the CPU backend is built in; GPU backends are modules loaded on first use.
#include <system_error>

#include "backend/backend.h"
#include "backend/module_abi.h"
#include "core/module.h"
#include "core/raw_enum.h"
#include "cpu/attention_kernels.h"

namespace stria {

Status LoadCudaModule(const BackendModuleV1** out) {
  void* sym = nullptr;
  STRIA_RETURN_IF_ERROR(LoadModuleSymbol(
      "cuda", "stria_cuda_module_v1",
      "CUDA contexts need it installed beside libstria.so, and the CUDA runtime; build stria with CUDA enabled.",
      &sym));
  const auto* module = static_cast<const BackendModuleV1*>(sym);
  if (module->abi_version != kBackendModuleAbiVersion)
    return Error(STRIA_ERROR_UNSUPPORTED, "the CUDA module speaks module ABI %d, this libstria %d", module->abi_version,
                 kBackendModuleAbiVersion);
  *out = module;
  return Status::Ok();
}

Status CreateBackend(DLDevice device, int num_threads, std::unique_ptr<Backend>* out) {
  char name[32];
  switch (RawEnum(device.device_type)) {  // any int may come through the C ABI
    case kDLCPU: {
      if (device.device_id != 0)
        return Error(STRIA_ERROR_INVALID_ARGUMENT, "CPU device id must be 0, got %d", device.device_id);
      char why[160];
      const cpu::ForcedIsa isa = cpu::CheckForcedIsa(why, sizeof why);
      if (isa != cpu::ForcedIsa::kOk)
        return Error(isa == cpu::ForcedIsa::kUnknown ? STRIA_ERROR_INVALID_ARGUMENT : STRIA_ERROR_UNSUPPORTED, "%s",
                     why);
      try {
        *out = CreateCpuBackend(num_threads);
      } catch (const std::system_error& e) {
        return Error(STRIA_ERROR_OUT_OF_MEMORY, "could not start %d CPU backend threads: %s (config->num_threads)",
                     num_threads, e.what());
      }
      return Status::Ok();
    }
    case kDLCUDA: {
      if (device.device_id < 0)
        return Error(STRIA_ERROR_INVALID_ARGUMENT, "CUDA device ordinal %d is negative", device.device_id);
      const BackendModuleV1* module = nullptr;
      STRIA_RETURN_IF_ERROR(LoadCudaModule(&module));
      Backend* backend = nullptr;
      STRIA_RETURN_IF_ERROR(module->create(device, num_threads, &backend));
      out->reset(backend);
      return Status::Ok();
    }
    default:
      return Error(STRIA_ERROR_UNSUPPORTED, "device %s is not supported (supported: cpu:0, cuda:<ordinal>)",
                   DeviceName(device, name, sizeof name));
  }
}

}  // namespace stria
