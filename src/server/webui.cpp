#include "server/webui.h"

namespace mla::server {

const WebAsset* webui_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (const WebAsset& a : webui_assets())
    if (a.path == path) return &a;
  return nullptr;
}

}  // namespace mla::server
