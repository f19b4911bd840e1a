// The model a command runs: loaded with the process's MPI world (one rank outside mpirun, its
// block of the routed experts under it) and, while MLA_DEBUG is set to anything but 0, the pass
// log (model/forward_observer.h) on standard error.
#pragma once
#include <memory>
#include <string>

#include "model/model.h"

namespace mla::cli {

std::unique_ptr<Model> load_model(const std::string& dir, const cpu::Context& ctx, bool show_progress = false,
                                  const LoadQuantization& quantize = {}, bool with_mtp = false);

}  // namespace mla::cli
