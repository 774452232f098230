// libFuzzer entry point of one fuzz target executable (the only target linked into it): a
// broken invariant prints its description and aborts, so libFuzzer saves the input.
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  for (const auto& t : mla::fuzz::targets()) {
    const std::string failure = t.fn(data, size);
    if (!failure.empty()) {
      std::fprintf(stderr, "fuzz target %s: invariant broken: %s\n", t.name, failure.c_str());
      std::abort();
    }
  }
  return 0;
}
