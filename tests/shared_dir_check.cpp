// The fixtures live in ../shared beside the checkout (DESIGN.md, "Fixtures"). Without them every
// test that reads one would fail on its own with a file or JSON error; this global environment
// stops the run first with one message naming the folder.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace {

class SharedDirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::filesystem::path fixtures = std::filesystem::path(mla::test::shared_dir()) / "fixtures";
    ASSERT_TRUE(std::filesystem::is_directory(fixtures))
        << "the test fixtures are missing: expected the folder " << fixtures.string()
        << " (../shared/fixtures beside the checkout, see DESIGN.md)";
  }
};

[[maybe_unused]] const ::testing::Environment* const shared_dir_environment =
    ::testing::AddGlobalTestEnvironment(new SharedDirEnvironment);

}  // namespace
