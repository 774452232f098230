// Which form a layer's attention takes for a batch (SYSTEM.md 6, last paragraph). A low public
// header: the planners choose it without knowing the backend interface.
#pragma once

#include <cstdint>
#include <string_view>

namespace mla {

enum class ForwardMethod : uint8_t {
  kAbsorbed,    // MQA over the paged latent cache
  kMhaOneShot,  // gather + up-project prefix and new tokens together, one causal pass
  kMhaChunked,  // causal among new tokens, then prefix chunks merged in
};
std::string_view forward_method_name(ForwardMethod m);

}  // namespace mla
