// Replays every input in tests/fuzz/corpus/<target>/ (the seed corpus and every crash input the
// fuzzers found) through the fuzz targets' checks (tests/fuzz/*_target.cc), so the invariants
// the fuzzers check are regression tests of the normal suite (ci and asan-ubsan presets).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"

namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzCorpus, EveryTargetHasASeedCorpus) {
  ASSERT_EQ(mla::fuzz::targets().size(), 6u);
  for (const auto& t : mla::fuzz::targets()) {
    const fs::path dir = fs::path(MLA_FUZZ_CORPUS_DIR) / t.name;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    EXPECT_GE(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3) << dir;
  }
}

TEST(FuzzCorpus, EveryCorpusInputKeepsTheInvariants) {
  for (const auto& t : mla::fuzz::targets()) {
    int inputs = 0;
    for (const auto& entry : fs::directory_iterator(fs::path(MLA_FUZZ_CORPUS_DIR) / t.name)) {
      if (!entry.is_regular_file()) continue;
      const std::vector<uint8_t> bytes = read_file(entry.path());
      EXPECT_EQ(t.fn(bytes.data(), bytes.size()), "") << t.name << ": " << entry.path();
      ++inputs;
    }
    EXPECT_GT(inputs, 0) << t.name;
  }
}

// The empty input and short runs of every byte value are valid inputs for every target.
TEST(FuzzCorpus, DegenerateInputsKeepTheInvariants) {
  for (const auto& t : mla::fuzz::targets()) {
    EXPECT_EQ(t.fn(nullptr, 0), "") << t.name;
    for (int v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      const std::vector<uint8_t> bytes(64, static_cast<uint8_t>(v));
      EXPECT_EQ(t.fn(bytes.data(), bytes.size()), "") << t.name << " byte " << v;
    }
  }
}

}  // namespace
