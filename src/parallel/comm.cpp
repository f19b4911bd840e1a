#include "parallel/comm.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef MLA_HAVE_MPI
// The C API only: without these, mpi.h included from C++ pulls in the deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace mla::parallel {

namespace {

class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allgather(const void* mine, size_t bytes, void* all) override {
    if (bytes) std::memmove(all, mine, bytes);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

#ifdef MLA_HAVE_MPI
// MPI counts are int: a larger buffer goes in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t(1) << 30;

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(const void* mine, size_t bytes, void* all) override {
    if (bytes <= kPiece) {
      MPI_Request r;
      MPI_Iallgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &r);
      wait(r, "allgather", bytes, false);
      return;
    }
    // Larger than one piece: each rank's block gathered as a broadcast from its owner.
    auto* out = static_cast<uint8_t*>(all);
    std::memmove(out + size_t(rank_) * bytes, mine, bytes);
    for (int r = 0; r < size_; ++r) broadcast(out + size_t(r) * bytes, bytes, r);
  }
  void broadcast(void* buf, size_t bytes, int root) override { bcast(buf, bytes, root, false); }
  void broadcast_idle(void* buf, size_t bytes, int root) override { bcast(buf, bytes, root, true); }
  void barrier() override {
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    wait(r, "barrier", 0, false);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  void bcast(void* buf, size_t bytes, int root, bool idle) {
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t at = 0; at < bytes; at += kPiece) {
      MPI_Request r;
      MPI_Ibcast(p + at, int(std::min(kPiece, bytes - at)), MPI_BYTE, root, MPI_COMM_WORLD, &r);
      wait(r, "broadcast", bytes, idle);
    }
  }
  // Polls a started collective to its end, or throws CommError at the timeout or an interrupt
  // (the request is left behind: the job is ending). The polls yield the core between them
  // (ranks may share cores: a spinning rank would slow the one it waits for), and when idle,
  // after a millisecond, sleep 200 us between polls.
  void wait(MPI_Request& r, const char* what, size_t bytes, bool idle) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (interrupted_) throw CommError("rank " + std::to_string(rank_) + ": the " + what + " was interrupted");
      if (polls >= 64) sched_yield();
      if ((polls & 255) != 0) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (timeout_ > 0 && waited > timeout_)
        throw CommError("rank " + std::to_string(rank_) + " waited more than " + seconds(timeout_) + " s in a " + what +
                        " of " + std::to_string(bytes) + " bytes for the other ranks (MLA_RANK_TIMEOUT): one of " +
                        "them hangs or has died");
      if (idle && waited > 1e-3) {
        const timespec nap{0, 200 * 1000};
        nanosleep(&nap, nullptr);
      }
    }
  }
  static std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  int rank_ = 0, size_ = 1;
};
#endif

LocalComm local_world;
Comm* current = &local_world;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

}  // namespace

bool mpi_built() {
#ifdef MLA_HAVE_MPI
  return true;
#else
  return false;
#endif
}

double rank_timeout_from_env() {
  const char* v = std::getenv("MLA_RANK_TIMEOUT");
  if (!v || !*v) return 300;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end || !(s >= 0)) throw std::invalid_argument(std::string("MLA_RANK_TIMEOUT must be seconds >= 0, not '") + v + "'");
  return s;
}

bool launched_by_mpi() {
  return std::max({env_int("OMPI_COMM_WORLD_SIZE"), env_int("PMI_SIZE"), env_int("PMIX_SIZE")}) > 1;
}

Comm& world() { return *current; }

void init_world(int* argc, char*** argv) {
  if (!launched_by_mpi()) return;
#ifdef MLA_HAVE_MPI
  int provided = 0;
  // One thread calls MPI at a time: the one running forward passes (the caller's, or the
  // engine's own thread), never the OpenMP workers.
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED)
    throw std::runtime_error("the MPI library does not allow calls from a thread other than main (MPI_THREAD_SERIALIZED)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  static MpiComm mpi;
  current = &mpi;
#else
  (void)argc;
  (void)argv;
  throw std::runtime_error(
      "started by an MPI launcher with more than one rank, but this build of mla has no MPI "
      "(install libopenmpi-dev and configure again with -DMLA_MPI=ON)");
#endif
}

void finalize_world() {
#ifdef MLA_HAVE_MPI
  if (current != &local_world) {
    MPI_Finalize();
    current = &local_world;
  }
#endif
}

void sum_in_rank_order(Comm& comm, float* buf, int64_t n, std::vector<float>& scratch) {
  const int N = comm.size();
  if (N == 1 || n == 0) return;
  scratch.resize(size_t(N) * size_t(n));
  comm.allgather(buf, size_t(n) * sizeof(float), scratch.data());
  const float* all = scratch.data();
  // Each element's sum runs over the ranks in order whichever thread adds it.
#pragma omp parallel for schedule(static) if (n * N >= (int64_t(1) << 18))
  for (int64_t i = 0; i < n; ++i) {
    float s = all[i];
    for (int r = 1; r < N; ++r) s += all[size_t(r) * size_t(n) + size_t(i)];
    buf[i] = s;
  }
}

void require_same_on_all_ranks(Comm& comm, const std::string& what, const std::string& digest) {
  const int N = comm.size();
  if (N == 1) return;
  constexpr size_t kLen = 128;
  std::string mine = digest.substr(0, kLen);
  mine.resize(kLen, '\0');
  std::string all(kLen * size_t(N), '\0');
  comm.allgather(mine.data(), kLen, all.data());
  auto text = [&](int r) { return std::string(all.c_str() + size_t(r) * kLen); };
  std::string differ;
  for (int r = 1; r < N; ++r)
    if (all.compare(size_t(r) * kLen, kLen, all, 0, kLen) != 0)
      differ += "; rank " + std::to_string(r) + " has " + text(r);
  if (!differ.empty())
    throw std::runtime_error("the ranks of this job run on different " + what + "s: rank 0 has " + text(0) + differ +
                             " (start every rank on the same " + what + ")");
}

}  // namespace mla::parallel
