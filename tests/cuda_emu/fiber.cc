#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define STRIA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRIA_EMU_ASAN 1
#endif
#endif

#if defined(STRIA_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(STRIA_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#if !defined(STRIA_EMU_UCONTEXT)
// stria_emu_switch(&from_sp, to_sp): pushes the callee-saved registers and the SSE/x87 control
// words of the running context, stores its stack pointer in *from_sp, then pops those of the
// context whose stack pointer is to_sp and returns into it.
// stria_emu_fiber_start: where a prepared stack first "returns" to; calls r13(r12). It is the
// outermost frame of a fiber (undefined return address for unwinders and debuggers).
extern "C" void stria_emu_switch(void** from_sp, void* to_sp);
extern "C" void stria_emu_fiber_start();
asm(R"(
  .pushsection .text
  .p2align 4
  .globl stria_emu_switch
  .hidden stria_emu_switch
  .type stria_emu_switch, @function
stria_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size stria_emu_switch, .-stria_emu_switch

  .p2align 4
  .globl stria_emu_fiber_start
  .hidden stria_emu_fiber_start
  .type stria_emu_fiber_start, @function
stria_emu_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size stria_emu_fiber_start, .-stria_emu_fiber_start
  .popsection
)");
#endif

namespace stria {
namespace cuda {
namespace emu {
namespace fiber {
namespace {

#if defined(STRIA_EMU_ASAN)
// ASan's stack frames are larger, and its fake stacks live elsewhere anyway.
constexpr size_t kStackBytes = size_t{1} << 20;
#else
constexpr size_t kStackBytes = size_t{256} << 10;
#endif

// The switch in progress: set by the switching context, read by the resumed one.
thread_local Context* tls_from = nullptr;
thread_local Context* tls_to = nullptr;

void StartSwitch(Context* from, Context* to, bool exiting) {
  tls_from = from;
  tls_to = to;
#if defined(STRIA_EMU_ASAN)
  // A null fake-stack slot tells ASan that `from` is gone, so it frees that fake stack.
  __sanitizer_start_switch_fiber(exiting ? nullptr : &from->asan_fake_stack, to->stack.lo, to->stack.size);
#else
  (void)exiting;
#endif
}

// Called right before RawSwitch, in the same function: once TSan runs `to`, the function exits
// it records belong to `to`, so no instrumented function may return in between.
#if defined(STRIA_EMU_TSAN)
#define STRIA_EMU_TSAN_SWITCH(to) __tsan_switch_to_fiber((to)->tsan_fiber, 0)  // 0: hand-over is synchronised
#else
#define STRIA_EMU_TSAN_SWITCH(to) (void)0
#endif

void FinishSwitch() {
#if defined(STRIA_EMU_ASAN)
  const void* lo = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(tls_to->asan_fake_stack, &lo, &size);
  // This is how the OS thread's own stack bounds become known (for switching back to it).
  tls_from->stack.lo = const_cast<void*>(lo);
  tls_from->stack.size = size;
#endif
}

STRIA_EMU_FIBER_ENTRY void RawSwitch(Context* from, Context* to) {
#if defined(STRIA_EMU_UCONTEXT)
  swapcontext(&from->uc, &to->uc);
#else
  stria_emu_switch(&from->sp, to->sp);
#endif
}

#if defined(STRIA_EMU_UCONTEXT)
// makecontext passes int arguments only: the Context pointer travels in two halves.
STRIA_EMU_FIBER_ENTRY void UcontextStart(unsigned hi, unsigned lo) {
  Context* c = reinterpret_cast<Context*>((static_cast<uintptr_t>(hi) << 32) | lo);
  c->entry(c->arg);
  std::abort();
}
#endif

class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (const Mapping& m : maps_) {
#if defined(STRIA_EMU_TSAN)
      __tsan_destroy_fiber(m.stack.tsan_fiber);
#endif
      munmap(m.base, m.bytes);
    }
  }
  Stack Get(size_t i) {
    while (maps_.size() <= i) {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      const size_t bytes = kStackBytes + page;
      void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      if (mprotect(base, page, PROT_NONE) != 0) {
        munmap(base, bytes);
        throw std::bad_alloc();
      }
      Stack stack{static_cast<char*>(base) + page, kStackBytes, nullptr};
#if defined(STRIA_EMU_TSAN)
      stack.tsan_fiber = __tsan_create_fiber(0);
#endif
      maps_.push_back({base, bytes, stack});
    }
    return maps_[i].stack;
  }

 private:
  struct Mapping {
    void* base;
    size_t bytes;
    Stack stack;
  };
  std::vector<Mapping> maps_;
};

}  // namespace

void InitMain(Context* main) {
  *main = Context{};
#if defined(STRIA_EMU_TSAN)
  main->tsan_fiber = __tsan_get_current_fiber();
#endif
}

void Prepare(Context* c, Stack stack, void (*entry)(void*), void* arg) {
  c->stack = stack;
  c->asan_fake_stack = nullptr;
  c->tsan_fiber = stack.tsan_fiber;
#if defined(STRIA_EMU_UCONTEXT)
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack.lo;
  c->uc.uc_stack.ss_size = stack.size;
  c->uc.uc_link = nullptr;
  c->entry = entry;
  c->arg = arg;
  const uintptr_t p = reinterpret_cast<uintptr_t>(c);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(&UcontextStart), 2, static_cast<unsigned>(p >> 32),
              static_cast<unsigned>(p & 0xffffffffu));
#else
  // The frame stria_emu_switch pops: control words, r15, r14, r13 = entry, r12 = arg, rbx,
  // rbp = 0 (ends frame-pointer chains), return address = stria_emu_fiber_start. After the
  // return, rsp is 16-byte aligned, as the call in stria_emu_fiber_start needs.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack.lo) + stack.size) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top);
  uint32_t control[2];
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  uint64_t packed = control[0] | (static_cast<uint64_t>(control[1] & 0xffffu) << 32);
  *--sp = reinterpret_cast<void*>(&stria_emu_fiber_start);
  *--sp = nullptr;                          // rbp
  *--sp = nullptr;                          // rbx
  *--sp = arg;                              // r12
  *--sp = reinterpret_cast<void*>(entry);   // r13
  *--sp = nullptr;                          // r14
  *--sp = nullptr;                          // r15
  *--sp = reinterpret_cast<void*>(packed);  // mxcsr, x87 control word
  c->sp = sp;
#endif
}

void Entered() {
  FinishSwitch();
}

void Switch(Context* from, Context* to) {
  StartSwitch(from, to, false);
  STRIA_EMU_TSAN_SWITCH(to);
  RawSwitch(from, to);
  FinishSwitch();
}

void SwitchAndExit(Context* from, Context* to) {
  StartSwitch(from, to, true);
  STRIA_EMU_TSAN_SWITCH(to);
  RawSwitch(from, to);
  std::abort();  // nobody resumes a finished context
}

Stack PooledStack(size_t i) {
  thread_local StackPool pool;
  return pool.Get(i);
}

}  // namespace fiber
}  // namespace emu
}  // namespace cuda
}  // namespace stria
