#include "serve/cache_view.h"

#include <algorithm>

#include "core/struct_size.h"
#include "ring/arguments.h"
#include "serve/cache_layout.h"

namespace stria {

bool CacheView::Find(int64_t b, int64_t s, char** k_row, char** v_row, int64_t* run, Status* why) const {
  const int64_t ke = k.elem_bytes(), ve = v.elem_bytes();
  if (!paged) {
    *k_row = static_cast<char*>(k.data) + (b * k.strides[0] + s * k.strides[1]) * ke;
    *v_row = static_cast<char*>(v.data) + (b * v.strides[0] + s * v.strides[1]) * ve;
    *run = capacity - s;
    return true;
  }
  const int64_t i = s / block_size;
  const int64_t block = table[b * table_b + i * table_i];
  if (block < 0 || block >= num_blocks) {
    *why = Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "cache->block_table[%lld][%lld] is %lld, which is not a block of the pool (0..%lld): slot %lld of "
                 "sequence %lld needs it",
                 static_cast<long long>(b), static_cast<long long>(i), static_cast<long long>(block),
                 static_cast<long long>(num_blocks - 1), static_cast<long long>(s), static_cast<long long>(b));
    return false;
  }
  const int64_t row = s % block_size;
  *k_row = static_cast<char*>(k.data) + (block * k.strides[0] + row * k.strides[1]) * ke;
  *v_row = static_cast<char*>(v.data) + (block * v.strides[0] + row * v.strides[1]) * ve;
  *run = block_size - row;
  return true;
}

Status CacheView::AddSegments(int64_t b, int64_t len, std::vector<CacheSegment>* out, int64_t first) const {
  CacheRun runs[2];
  const int nr = CacheRuns(layout, world_size, rank, capacity, len, runs, first);
  Status why;
  for (int i = 0; i < nr; ++i)
    for (int64_t j = 0; j < runs[i].count;) {
      CacheSegment seg;
      seg.b = b;
      char *kr = nullptr, *vr = nullptr;
      int64_t run = 0;
      if (!Find(b, runs[i].slot0 + j, &kr, &vr, &run, &why)) return why;
      seg.k = kr;
      seg.v = vr;
      seg.k_row = k.strides[1] * k.elem_bytes();
      seg.v_row = v.strides[1] * v.elem_bytes();
      seg.k_head = k.strides[2] * k.elem_bytes();
      seg.v_head = v.strides[2] * v.elem_bytes();
      seg.count = std::min(run, runs[i].count - j);
      seg.pos0 = runs[i].pos0 + j * runs[i].pos_stride;
      seg.pos_stride = runs[i].pos_stride;
      out->push_back(seg);
      j += seg.count;
    }
  return Status::Ok();
}

Status CacheView::AddAppend(int64_t b, int64_t pos, const char* k_src, const char* v_src, int64_t k_src_head,
                            int64_t v_src_head, std::vector<CacheAppend>* out) const {
  int owner = 0;
  int64_t slot = 0, run = 0;
  if (!CacheSlot(layout, world_size, capacity, pos, &owner, &slot) || owner != rank) return Status::Ok();
  CacheAppend a;
  Status why;
  if (!Find(b, slot, &a.k_dst, &a.v_dst, &run, &why)) return why;
  a.k_src = k_src;
  a.v_src = v_src;
  a.k_src_head = k_src_head;
  a.v_src_head = v_src_head;
  a.k_dst_head = k.strides[2] * k.elem_bytes();
  a.v_dst_head = v.strides[2] * v.elem_bytes();
  out->push_back(a);
  return Status::Ok();
}

uint64_t CacheView::Hash(uint64_t h) const {
  h = HashMix(HashMix(h, static_cast<uint64_t>(capacity)), paged ? 1 : 0);
  for (int64_t l : lens) h = HashMix(h, static_cast<uint64_t>(l));
  return h;
}

namespace {

Status CheckCacheTensor(Context& ctx, DLTensor* t, const char* name, bool written, TensorView* out) {
  STRIA_RETURN_IF_ERROR(AttentionTensor(t, name, 4, ctx.device(), false, out));
  if (written) STRIA_RETURN_IF_ERROR(CheckWritable(*out, name, Role::kOutput));
  return ctx.backend().CheckMemory(out->data, name);
}

}  // namespace

Status ValidateCache(Context& ctx, const stria_kv_cache_t* cache, stria_layout_t layout, int64_t B, int64_t D,
                     DType dtype, int64_t added, void* stream, CacheView* cv) {
  const int n = ctx.world_size();
  cv->layout = layout;
  cv->world_size = n;
  cv->rank = ctx.rank();
  if (cache == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache is NULL (use stria_kv_cache_init)");
  STRIA_RETURN_IF_ERROR(
      CheckStructSize(cache, cache->struct_size, sizeof(stria_kv_cache_t), "cache", "stria_kv_cache_init"));
  STRIA_RETURN_IF_ERROR(CheckCacheTensor(ctx, cache->k, "cache->k", added > 0, &cv->k));
  STRIA_RETURN_IF_ERROR(CheckCacheTensor(ctx, cache->v, "cache->v", added > 0, &cv->v));
  STRIA_RETURN_IF_ERROR(ExpectDType(cv->k, "cache->k", dtype));
  STRIA_RETURN_IF_ERROR(ExpectDType(cv->v, "cache->v", dtype));
  cv->heads = cv->k.shape[2];
  cv->paged = cache->block_table != nullptr;
  if (cv->paged) {
    STRIA_RETURN_IF_ERROR(ExpectShape(cv->k, "cache->k", {cv->k.shape[0], cv->k.shape[1], cv->heads, D},
                                      "a paged cache's pool [num_blocks, block_size, Hkv, D] with q's D"));
    STRIA_RETURN_IF_ERROR(
        ExpectShape(cv->v, "cache->v", {cv->k.shape[0], cv->k.shape[1], cv->heads, D}, "like cache->k"));
    // In the context's memory, or in host memory, where the host reads it without a copy (serving
    // engines keep their tables there too).
    TensorView table;
    const DLDeviceType table_type = cache->block_table != nullptr ? cache->block_table->device.device_type : kDLCPU;
    const bool host_table = table_type == kDLCPU || table_type == kDLCUDAHost;
    STRIA_RETURN_IF_ERROR(ViewOf(cache->block_table, "cache->block_table",
                                 host_table ? cache->block_table->device : ctx.device(), &table,
                                 "the context's device or the host"));
    if (!(table.dl_dtype.code == kDLInt && table.dl_dtype.bits == 32 && table.dl_dtype.lanes == 1) || table.ndim != 2 ||
        table.shape[0] != B)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "cache->block_table must be an int32 tensor [B, max_blocks] with q's B = %lld (got %d dims, shape "
                   "%s)",
                   static_cast<long long>(B), table.ndim, ShapeString(table).c_str());
    if (cv->k.shape[1] < 1 || table.shape[1] < 1)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "a paged cache needs block_size >= 1 and max_blocks >= 1 (got %lld, %lld)",
                   static_cast<long long>(cv->k.shape[1]), static_cast<long long>(table.shape[1]));
    // The host looks every entry a call uses up (and checks it): a device table (a GPU context's)
    // comes to the host first, its span read once after the work queued on the call's stream, for
    // which the host waits; a table in host memory is read where it is.
    if (table.strides[0] < 0 || table.strides[1] < 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->block_table has negative strides (%lld, %lld)",
                   static_cast<long long>(table.strides[0]), static_cast<long long>(table.strides[1]));
    const int64_t span = (table.shape[0] - 1) * table.strides[0] + (table.shape[1] - 1) * table.strides[1] + 1;
    const void* host = nullptr;
    STRIA_RETURN_IF_ERROR(ctx.backend().ReadBytesOnHost(table.data, static_cast<size_t>(span) * sizeof(int32_t), stream,
                                                        "cache->block_table", &cv->table_staged, &host));
    cv->table = static_cast<const int32_t*>(host);
    cv->table_b = table.strides[0];
    cv->table_i = table.strides[1];
    cv->block_size = cv->k.shape[1];
    cv->num_blocks = cv->k.shape[0];
    cv->capacity = table.shape[1] * cv->block_size;
  } else {
    STRIA_RETURN_IF_ERROR(ExpectShape(cv->k, "cache->k", {B, cv->k.shape[1], cv->heads, D},
                                      "a contiguous cache [B, capacity, Hkv, D] with q's B and D"));
    STRIA_RETURN_IF_ERROR(ExpectShape(cv->v, "cache->v", {B, cv->k.shape[1], cv->heads, D}, "like cache->k"));
    cv->capacity = cv->k.shape[1];
  }
  if (cv->capacity < 1) return Error(STRIA_ERROR_INVALID_ARGUMENT, "the cache holds no slot on this rank (capacity 0)");
  if (layout == STRIA_LAYOUT_ZIGZAG && cv->capacity % 2 != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "a zigzag cache needs an even per-rank capacity (two halves); this rank's is %lld",
                 static_cast<long long>(cv->capacity));
  if (cache->lens == nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->lens is NULL: the cached length of each sequence is needed");
  std::vector<int64_t> staged;
  const int64_t* lens = nullptr;
  STRIA_RETURN_IF_ERROR(
      ctx.backend().ReadOnHost(cache->lens, static_cast<size_t>(B), stream, "cache->lens", &staged, &lens));
  cv->lens.assign(lens, lens + B);
  for (int64_t b = 0; b < B; ++b)
    if (lens[b] < 0 || lens[b] > n * cv->capacity - added)
      return Error(
          STRIA_ERROR_INVALID_ARGUMENT,
          "cache->lens[%lld] is %lld, but the cache holds %lld positions (%d ranks of %lld slots)%s",
          static_cast<long long>(b), static_cast<long long>(lens[b]), static_cast<long long>(n * cv->capacity), n,
          static_cast<long long>(cv->capacity),
          added ? Format(", %lld of them for this call's new tokens", static_cast<long long>(added)).c_str() : "");
  return Status::Ok();
}

}  // namespace stria
