// The chat page's files compiled into the program (webui.h, cmake/embed_webui.cmake): each file
// of src/server/webui/ is there byte for byte, "/" is the HTML page, and nothing the page loads
// points at another site (it must work offline, with no request leaving the server's origin).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "server/serve_process.h"
#include "server/webui.h"

namespace mla::server {
namespace {

namespace fs = std::filesystem;

TEST(WebUi, EveryFileIsEmbeddedAsItIs) {
  const fs::path dir = fs::path(MLA_SOURCE_DIR) / "src/server/webui";
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.insert("/" + e.path().filename().string());
  ASSERT_FALSE(files.empty());
  std::set<std::string> embedded;
  for (const WebAsset& a : webui_assets()) {
    embedded.insert(std::string(a.path));
    EXPECT_EQ(a.body, test::read_all((dir / std::string(a.path.substr(1))).string())) << a.path;
    EXPECT_FALSE(a.content_type.empty()) << a.path;
  }
  EXPECT_EQ(embedded, files);
  for (const char* name : {"/index.html", "/style.css", "/app.js", "/api.js", "/markdown.js"})
    EXPECT_TRUE(files.count(name)) << name;
}

TEST(WebUi, RootServesTheHtmlPage) {
  const WebAsset* root = webui_asset("/");
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root, webui_asset("/index.html"));
  EXPECT_EQ(root->content_type.substr(0, 9), "text/html");
  EXPECT_NE(root->body.find("<!doctype html>"), std::string_view::npos);
  EXPECT_NE(root->body.find("/app.js"), std::string_view::npos);
  EXPECT_EQ(webui_asset("/app.js")->content_type.substr(0, 15), "text/javascript");
  EXPECT_EQ(webui_asset("/style.css")->content_type.substr(0, 8), "text/css");
  EXPECT_EQ(webui_asset("/missing.js"), nullptr);
  EXPECT_EQ(webui_asset(""), nullptr);
}

TEST(WebUi, NoAssetReferencesAnotherSite) {
  for (const WebAsset& a : webui_assets()) {
    EXPECT_EQ(a.body.find("http://"), std::string_view::npos) << a.path;
    EXPECT_EQ(a.body.find("https://"), std::string_view::npos) << a.path;
    EXPECT_EQ(a.body.find("src=\"//"), std::string_view::npos) << a.path;  // protocol-relative
    EXPECT_EQ(a.body.find("href=\"//"), std::string_view::npos) << a.path;
  }
}

// GET of path on 127.0.0.1:port, the whole response (head and body).
std::string get(int port, const std::string& path, const std::string& method = "GET") {
  test::RawConnection c(port);
  c.send(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  return c.read_all();
}

// `mla serve` behind an API key serves the page without it (the page asks for the key when
// /v1/* answers 401), each file with its type and no-cache; --no-webui leaves / unrouted.
TEST(WebUi, ServedOutsideTheApiKey) {
  test::TempDir dir("webui-serve");
  test::make_served_model(dir.path);
  test::ServeProcess serve((dir.path / "serve.log").string(),
                           {"-m", dir.path.string(), "--threads", "1", "--kv-cache-gb", "0.001", "--api-key", "sk-page"});
  ASSERT_NE(serve.port, 0) << serve.log_text();
  EXPECT_NE(serve.log_text().find("chat page: " + serve.url() + "/"), std::string::npos) << serve.log_text();
  const std::string page = get(serve.port, "/");
  EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u) << page;
  EXPECT_NE(page.find("Content-Type: text/html"), std::string::npos) << page;
  EXPECT_NE(page.find("Cache-Control: no-cache"), std::string::npos) << page;
  EXPECT_TRUE(page.ends_with(std::string(webui_asset("/")->body))) << page;
  const std::string js = get(serve.port, "/app.js");
  EXPECT_EQ(js.rfind("HTTP/1.1 200", 0), 0u) << js;
  EXPECT_NE(js.find("Content-Type: text/javascript"), std::string::npos) << js;
  EXPECT_EQ(get(serve.port, "/v1/models").rfind("HTTP/1.1 401", 0), 0u);
  EXPECT_EQ(get(serve.port, "/nothing.js").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post = get(serve.port, "/", "POST");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;

  test::TempDir off_dir("webui-off");
  test::make_served_model(off_dir.path);
  test::ServeProcess off((off_dir.path / "serve.log").string(),
                         {"-m", off_dir.path.string(), "--threads", "1", "--kv-cache-gb", "0.001", "--no-webui"});
  ASSERT_NE(off.port, 0) << off.log_text();
  EXPECT_EQ(off.log_text().find("chat page"), std::string::npos) << off.log_text();
  // "/" still answers 200 (HEAD / is how clients see that a server is up), without the page.
  const std::string root = get(off.port, "/");
  EXPECT_EQ(root.rfind("HTTP/1.1 200", 0), 0u) << root;
  EXPECT_EQ(root.find("text/html"), std::string::npos) << root;
  EXPECT_EQ(get(off.port, "/app.js").rfind("HTTP/1.1 404", 0), 0u);
}

}  // namespace
}  // namespace mla::server
