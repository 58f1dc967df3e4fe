// A stand-in for ATen/Parallel.h with the two functions the kernels' compute headers call, so
// kernel_check.cpp builds them without torch (for aarch64 too, where no torch is at hand). Same
// split as ATen's OpenMP backend: a range shorter than the grain, or a call inside a parallel
// region, runs on the calling thread; otherwise min(threads, ceil(n / grain)) threads take one
// contiguous chunk each.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace at {

inline int get_num_threads() { return omp_get_max_threads(); }

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain_size, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin, grain = std::max<int64_t>(1, grain_size);
  if (n < grain || omp_in_parallel() || get_num_threads() == 1) {
    f(begin, end);
    return;
  }
  const int64_t tasks = std::min<int64_t>(get_num_threads(), (n + grain - 1) / grain);
  const int64_t chunk = (n + tasks - 1) / tasks;
#pragma omp parallel num_threads(static_cast<int>(tasks))
  {
    const int64_t b = begin + omp_get_thread_num() * chunk;
    if (b < end) f(b, std::min(end, b + chunk));
  }
}

}  // namespace at
