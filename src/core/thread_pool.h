// A fork-join pool for the CPU backend. ParallelFor hands out items dynamically (an atomic
// counter), so uneven items — causal tiles near the diagonal — balance themselves. The calling
// thread takes part, so a pool of n threads starts n - 1 workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stria {

class ThreadPool {
 public:
  // Throws std::system_error when the system cannot start the threads (none is left running).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }
  // Once *flag is true, ParallelFor stops handing out items (those running finish) and returns:
  // how an aborted call stops computing. The flag outlives the pool; null (the default): never.
  void set_cancel_flag(const std::atomic<bool>* flag) { cancel_ = flag; }
  // Calls fn(item, thread_index) for every item in [0, count); thread_index < size().
  // fn must not throw. Returns when all items are done.
  void ParallelFor(int64_t count, const std::function<void(int64_t, int)>& fn);
  // Thread CPU time all participants spent inside ParallelFor since construction, in seconds.
  double cpu_seconds() const { return static_cast<double>(cpu_ns_.load()) * 1e-9; }

 private:
  void StopWorkers();
  bool Cancelled() const { return cancel_ != nullptr && cancel_->load(std::memory_order_relaxed); }
  void WorkerLoop(int index);
  void RunShare(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;
  int active_ = 0;  // workers still inside the current job
  bool stop_ = false;
  const std::function<void(int64_t, int)>* job_ = nullptr;
  int64_t job_count_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> cpu_ns_{0};
  const std::atomic<bool>* cancel_ = nullptr;
};

int HardwareThreads();

}  // namespace stria
