#include "core/thread_pool.h"

#include <time.h>

namespace stria {

static int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int HardwareThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(static_cast<size_t>(num_threads_ - 1));
  try {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  } catch (...) {
    // The system refused a thread (std::system_error): the workers already started must be
    // joined before workers_ goes, or their std::thread destructors would terminate the process.
    StopWorkers();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  StopWorkers();
}

void ThreadPool::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunShare(int index) {
  int64_t t0 = ThreadCpuNs();
  for (;;) {
    if (Cancelled()) break;
    int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
    if (item >= job_count_) break;
    (*job_)(item, index);
  }
  cpu_ns_.fetch_add(ThreadCpuNs() - t0, std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunShare(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t, int)>& fn) {
  if (count <= 0) return;
  if (num_threads_ == 1 || count == 1) {
    int64_t t0 = ThreadCpuNs();
    for (int64_t i = 0; i < count && !Cancelled(); ++i) fn(i, 0);
    cpu_ns_.fetch_add(ThreadCpuNs() - t0, std::memory_order_relaxed);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_count_ = count;
    next_.store(0, std::memory_order_relaxed);
    active_ = num_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  RunShare(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
}

}  // namespace stria
