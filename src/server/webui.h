// The chat page `mla serve` serves at GET / (src/server/webui/: plain HTML, CSS and JavaScript,
// no request to any other origin). Its files are compiled into the program at build time by
// cmake/embed_webui.cmake, so the page works offline and always matches the server it came with.
#pragma once
#include <span>
#include <string_view>

namespace mla::server {

struct WebAsset {
  std::string_view path;          // "/index.html", "/app.js", ...
  std::string_view content_type;  // "text/html; charset=utf-8", ...
  std::string_view body;
};

// Every embedded file (generated code).
std::span<const WebAsset> webui_assets();

// The file served at this request path ("/" is index.html); nullptr when there is none.
const WebAsset* webui_asset(std::string_view path);

}  // namespace mla::server
