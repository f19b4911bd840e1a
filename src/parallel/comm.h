// The processes of an expert-parallel job (`mpirun -np N mla ...`) and the few collective
// operations the engine needs from them. This is the one unit that knows there are other
// processes: comm.cpp is the only file that includes mpi.h, and it is built against MPI only
// when CMake found MPI (option MLA_MPI). Without MPI, or when `mla` was not started by an MPI
// launcher, the world is one rank and every operation is local.
//
// Every rank runs the same program on the same inputs, so every rank calls the same
// collectives in the same order; a rank that fails calls abort(), which ends every rank of the
// job (MPI_Abort). MPI's default error handler, MPI_ERRORS_ARE_FATAL, is kept: a failed MPI
// call, or a peer that died (mpirun kills the job when a rank exits non-zero or by a signal),
// ends the job instead of leaving the others waiting in a collective.
//
// A rank that neither dies nor answers (stopped, deadlocked, swapping) is caught by a timeout:
// once the ranks are in step (every rank loaded its model, Model::load), each collective waits
// at most timeout() seconds for the others and then throws CommError. The collectives are
// started non-blocking and polled, so the same wait also ends early at interrupt() (a signal).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mla::parallel {

// A collective that did not complete: another rank did not take part within the timeout, or
// the wait was interrupted. The job cannot run another collective in step; end it.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // all[r * bytes, (r + 1) * bytes) receives rank r's `mine` (bytes the same on every rank).
  virtual void allgather(const void* mine, size_t bytes, void* all) = 0;
  // buf of `bytes` on every rank receives root's.
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // The same for a rank with nothing else to do until root speaks (a follower waiting for the
  // next pass, engine/lockstep.h): it sleeps between polls instead of holding a core.
  virtual void broadcast_idle(void* buf, size_t bytes, int root) { broadcast(buf, bytes, root); }
  virtual void barrier() = 0;
  // Ends every rank of the job with exit status `code`.
  [[noreturn]] virtual void abort(int code) = 0;

  // The seconds a collective waits for the other ranks before it throws CommError; 0: for ever
  // (the default, and the right thing while ranks load at their own disk's pace).
  void set_timeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }
  // Makes the collective waiting now, and every later one until resume(), throw CommError.
  // Thread-safe (a signal-handling thread calls it).
  void interrupt() { interrupted_ = true; }
  void resume() { interrupted_ = false; }

 protected:
  double timeout_ = 0;
  std::atomic<bool> interrupted_{false};
};

// The timeout a job's collectives run under once its ranks are in step: MLA_RANK_TIMEOUT
// seconds (default 300; 0: none). Throws std::invalid_argument for a value that is not a
// non-negative number.
double rank_timeout_from_env();

// Whether this build has the MPI layer.
bool mpi_built();
// Whether the environment says an MPI launcher started this process with more than one rank
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE above 1).
bool launched_by_mpi();

// The process's world: set up by init_world (main), one local rank until then.
Comm& world();
// Joins the MPI job when launched_by_mpi() (MPI_Init); throws std::runtime_error when launched
// under mpirun by a build without MPI. Call once, first thing in main.
void init_world(int* argc, char*** argv);
// Leaves the MPI job (MPI_Finalize) after a normal end; nothing without MPI.
void finalize_world();

// Sums `n` floats across the ranks, in place: every rank's buffer is gathered to every rank
// and added in rank order 0, 1, ..., N-1 (a fixed order, so the sum does not depend on timing
// or on MPI's choice of reduction algorithm, and every rank holds bitwise the same result).
// scratch: N * n floats, grown as needed.
void sum_in_rank_order(Comm& comm, float* buf, int64_t n, std::vector<float>& scratch);

// Fails on every rank unless every rank passed the same `digest`: what the check is named
// ("checkpoint", "build") and each rank's text go into the message of the std::runtime_error
// thrown on every rank.
void require_same_on_all_ranks(Comm& comm, const std::string& what, const std::string& digest);

}  // namespace mla::parallel
