// Small helpers shared by the unit tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

// Substring check that prints the whole text on failure.
#define MLA_EXPECT_CONTAINS(text, sub)                                \
  EXPECT_NE(std::string_view(text).find(sub), std::string_view::npos) \
      << "expected to find \"" << (sub) << "\" in \"" << (text) << "\""
