#include "cli/load_model.h"

#include <cstdlib>
#include <string_view>

#include "parallel/comm.h"

namespace mla::cli {

std::unique_ptr<Model> load_model(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                  const LoadQuantization& quantize, bool with_mtp) {
  LoadOptions opt{ctx, show_progress, quantize, with_mtp, &parallel::world()};
  auto model = Model::load(dir, opt);
  const char* debug = std::getenv("MLA_DEBUG");
  if (debug && std::string_view(debug) != "0") {
    static PassLog log;
    model->set_observer(&log);
  }
  return model;
}

}  // namespace mla::cli
