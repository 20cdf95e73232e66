// Stackful fibers on one OS thread, for the CUDA emulator: every emulated CUDA thread of a block is
// a fiber, and a thread that reaches a barrier or warp collective switches to the next one.
//
// On x86-64 the switch is a few instructions of our own: swapcontext makes a sigprocmask system
// call per switch (over ten times slower), and the emulator switches once per lane per warp
// collective.
// Elsewhere, or with STRIA_EMU_UCONTEXT defined, ucontext is used.
//
// The sanitizers are told about every switch (ASan: start/finish_switch_fiber, so that stack
// poisoning and exceptions thrown on a fiber stack are understood; TSan: a TSan fiber per stack,
// switched with synchronisation, so the hand-over between fibers is not a race).
#pragma once

#include <cstddef>
#include <vector>

#if !defined(__x86_64__) && !defined(STRIA_EMU_UCONTEXT)
#define STRIA_EMU_UCONTEXT 1
#endif
#if defined(STRIA_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define STRIA_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STRIA_EMU_TSAN 1
#endif
#endif

// For fiber entry functions and the final switch: under TSan, without its function entry/exit
// hooks. A fiber's entry never returns, and TSan fibers are reused from block to block, so its
// frame would stay on the fiber's shadow call stack at every exit until that overflowed.
#if defined(STRIA_EMU_TSAN) && defined(__clang__) && __has_attribute(disable_sanitizer_instrumentation)
#define STRIA_EMU_FIBER_ENTRY __attribute__((disable_sanitizer_instrumentation))
#elif defined(STRIA_EMU_TSAN)
#define STRIA_EMU_FIBER_ENTRY __attribute__((no_sanitize_thread))
#else
#define STRIA_EMU_FIBER_ENTRY
#endif

namespace stria {
namespace cuda {
namespace emu {
namespace fiber {

struct Stack {
  void* lo = nullptr;  // lowest usable address
  size_t size = 0;
  void* tsan_fiber = nullptr;  // TSan: the fiber that runs on this stack (kept with it)
};

// A suspended execution context: a fiber, or the OS thread's own stack (a Context that was
// passed to InitMain).
struct Context {
#if defined(STRIA_EMU_UCONTEXT)
  ucontext_t uc;
  void (*entry)(void*) = nullptr;
  void* arg = nullptr;
#else
  void* sp = nullptr;
#endif
  Stack stack;                      // ASan: the stack this context runs on
  void* asan_fake_stack = nullptr;  // ASan: its fake stack while suspended
  void* tsan_fiber = nullptr;       // TSan: its fiber
};

// `main` becomes the context of the calling OS thread.
void InitMain(Context* main);
// Makes `c` run entry(arg) on `stack` when it is first switched to. `entry` must be
// STRIA_EMU_FIBER_ENTRY, call Entered() first and never return (it ends with SwitchAndExit).
// A context may be prepared again once its entry has exited.
void Prepare(Context* c, Stack stack, void (*entry)(void*), void* arg);
void Entered();
// Suspends `from` (the running context) and resumes `to`.
void Switch(Context* from, Context* to);
// Like Switch, but `from` is finished and will not be resumed (until prepared again).
[[noreturn]] STRIA_EMU_FIBER_ENTRY void SwitchAndExit(Context* from, Context* to);

// Fiber stacks of this OS thread, kept between launches: stack i is the same memory every time.
// Each has a guard page below it, so an overflow faults instead of corrupting a neighbour, and,
// under TSan, a TSan fiber (creating one costs more than running a block in it).
Stack PooledStack(size_t i);

}  // namespace fiber
}  // namespace emu
}  // namespace cuda
}  // namespace stria
