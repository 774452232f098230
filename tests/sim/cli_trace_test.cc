// The JSONL trace parser of `mla run --trace` (lib/sim/sim_trace.h, docs/trace-format.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "sim/sim_trace.h"

namespace mla::sim {
namespace {

TEST(CliTrace, ParsesFieldsDefaultsCommentsAndSortsByArrival) {
  const std::string text =
      "# a comment\n"
      "{\"arrival_step\": 5, \"prompt_len\": 512, \"output_len\": 32, \"prefix_group\": 1, "
      "\"prefix_len\": 256}\n"
      "\n"
      "{\"prompt_len\": 7, \"output_len\": 3}\r\n"
      "{\"arrival_step\": 5, \"prompt_len\": 9, \"output_len\": 1}";
  auto t = parse_trace(text);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].arrival_step, 0);  // default
  EXPECT_EQ((*t)[0].prompt_len, 7);
  EXPECT_EQ((*t)[0].output_len, 3);
  EXPECT_EQ((*t)[0].prefix_group, 0);
  EXPECT_EQ((*t)[1].arrival_step, 5);
  EXPECT_EQ((*t)[1].prompt_len, 512);
  EXPECT_EQ((*t)[1].prefix_group, 1);
  EXPECT_EQ((*t)[1].prefix_len, 256);
  EXPECT_EQ((*t)[2].prompt_len, 9);  // stable: same step keeps line order
  for (std::size_t i = 0; i < t->size(); ++i) EXPECT_EQ((*t)[i].id, static_cast<int>(i));
}

TEST(CliTrace, RoundTripsThroughTraceLine) {
  RequestSpec r;
  r.arrival_step = 12;
  r.prompt_len = 300;
  r.output_len = 17;
  r.prefix_group = 4;
  r.prefix_len = 128;
  auto t = parse_trace(trace_line(r) + "\n" + trace_line(RequestSpec{}));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 2u);
  const RequestSpec& p = (*t)[1];
  EXPECT_EQ(p.arrival_step, 12);
  EXPECT_EQ(p.prompt_len, 300);
  EXPECT_EQ(p.output_len, 17);
  EXPECT_EQ(p.prefix_group, 4);
  EXPECT_EQ(p.prefix_len, 128);
}

struct BadLine {
  const char* text;
  const char* expect;  // substring of the error
};

TEST(CliTrace, ErrorsNameLineAndField) {
  const BadLine cases[] = {
      {"{\"prompt_len\": 5", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"output_len\": 5}", "\"prompt_len\" is missing"},
      {"{\"prompt_len\": 5}", "\"output_len\" is missing"},
      {"{\"prompt_len\": \"5\", \"output_len\": 1}", "\"prompt_len\" = \"5\" is not an integer"},
      {"{\"prompt_len\": 1.5, \"output_len\": 1}", "is not an integer"},
      {"{\"prompt_len\": 0, \"output_len\": 1}", "\"prompt_len\" = 0 is outside"},
      {"{\"prompt_len\": 5, \"output_len\": 0}", "\"output_len\" = 0 is outside"},
      {"{\"prompt_len\": 5, \"output_len\": 1, \"arrival_step\": -1}", "\"arrival_step\" = -1"},
      {"{\"prompt_len\": 5, \"output_len\": 1, \"prefix_group\": 1, \"prefix_len\": 5}",
       "\"prefix_len\" = 5 is outside 0..4"},
      {"{\"prompt_len\": 5, \"output_len\": 1, \"prefix_len\": 2}", "needs \"prefix_group\""},
      {"{\"prompt_len\": 5, \"output_len\": 1, \"promt_len\": 2}", "unknown field \"promt_len\""},
  };
  for (const BadLine& c : cases) {
    const std::string text = std::string("{\"prompt_len\": 1, \"output_len\": 1}\n") + c.text;
    auto t = parse_trace(text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("trace line 2"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status().message();
  }
}

TEST(CliTrace, LoadTraceReadsFilesAndNamesMissingOnes) {
  auto missing = load_trace("/nonexistent/dir/trace.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/trace.jsonl"), std::string::npos);

  const std::string path = ::testing::TempDir() + "cli_trace_test.jsonl";
  {
    std::ofstream out(path);
    out << "{\"prompt_len\": 40, \"output_len\": 2}\n{\"prompt_len\": 0, \"output_len\": 2}\n";
  }
  auto bad = load_trace(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  EXPECT_NE(bad.status().message().find("trace line 2"), std::string::npos);
  {
    std::ofstream out(path);
    out << "{\"prompt_len\": 40, \"output_len\": 2}\n";
  }
  auto good = load_trace(path);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(good->size(), 1u);
  std::remove(path.c_str());
}

TEST(CliTrace, EmptyTraceIsEmpty) {
  auto t = parse_trace("\n# nothing\n");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->empty());
}

}  // namespace
}  // namespace mla::sim
