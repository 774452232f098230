// The attention-backend interface (SYSTEM.md sections 4-6) and the backend registry.
// One backend instance serves all layers: init_forward_metadata() plans once per batch, then
// each layer calls forward_decode() or forward_extend().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mla/batch.h"
#include "mla/forward_method.h"
#include "mla/kv_pool.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/status.h"
#include "mla/tensor.h"

namespace mla {

struct BackendOptions {
  ModelDims model;
  Device device = Device::cpu();
  std::string op_set;  // "" = the device's default op set
  bool disable_chunked_prefix_cache = false;
  bool piecewise_cuda_graph = false;         // piecewise-graph mode (absorbed for all extends)
  int64_t chunked_prefix_capacity = 131072;  // tokens per chunk across the batch (at most)
  // Bytes of up-projected prefix rows (k [N, H, 192], v [N, H, 128] bf16, plus the up-projection
  // scratch) one MHA pass may hold: the effective chunk capacity is the largest N that fits, so
  // the "<backend>.mha_chunk_kv" buffer cannot grow past it with the prefix (a paged_mla one-shot
  // pass is chunked instead beyond it). The buffer also holds 4 bytes per prefix token (the
  // slot list); the chunks merge into the layer's output in place, with no per-new-token
  // partials. The new tokens' up-projected rows are in "<backend>.mha_new_kv", outside it.
  std::size_t mha_chunk_kv_budget_bytes = std::size_t{512} << 20;
  int64_t mha_prefix_threshold = 8192;  // paged_mla: sum(prefix) at which MHA is used
  // 0 = from the environment (MLA_PAGED_WORKSPACE_BYTES / MLA_CHUNKED_WORKSPACE_BYTES) or default.
  std::size_t paged_workspace_bytes = 0;
  std::size_t chunked_workspace_bytes = 0;
  int max_batch = 256;  // eager capacity; graph capacity comes from init_cuda_graph_state
  int max_q_len = 8;    // longest decode/verify q_len planned for
  // Batch invariance (docs/reliability.md): a request's outputs are bitwise the same whatever
  // other requests share its batch and whatever the batch size. Every batch then takes the
  // absorbed form (as in piecewise-graph mode: no batch-wide MHA / chunk choice), and the cuda
  // absorbed planner cuts each request's keys at fixed boundaries (AttnCapacity::batch_invariant).
  // The cpu ops are batch invariant either way. Cost: extends with long prefixes lose the MHA
  // form; cuda decode of a few long requests spreads over fewer CTAs.
  bool batch_invariant = false;
};

// Inputs of one layer's attention call. Only the fields of the chosen form need to be set.
struct AttentionInputs {
  int layer = 0;
  TensorView c_kv;  // bf16 [T, 512] new tokens' latent rows (row stride may be larger)
  TensorView k_pe;  // bf16 [T, 64]  new tokens' rotated k_pe
  bool save_kv_cache = true;
  // absorbed form
  TensorView q_absorbed;  // bf16 [T, H, 576] = [q_nope @ W_UK | q_pe]
  // MHA form. The backend up-projects (kv_b_proj) every latent row its passes read: the prefix
  // (chunk by chunk, or with the one-shot gather) and the new tokens, whose rows it reads back
  // from the cache at the planned out_cache_loc after writing them (with save_kv_cache off, the
  // caller must have written them). A caller that already has the new tokens' k and v may pass
  // both; they are used instead (except on the one-shot path, which gathers every row itself).
  TensorView q;          // bf16 [T, H, 192] = [q_nope | q_pe]
  TensorView k;          // optional: bf16 [T, H, 192] the new tokens' keys, up-projected
  TensorView v;          // optional: bf16 [T, H, 128] the new tokens' values
  TensorView kv_b_proj;  // bf16 [H * 256, 512]
};

struct AttentionOutputs {
  TensorView o_latent;  // bf16 [T, H, 512] absorbed form
  TensorView o;         // bf16 [T, H, 128] MHA form
  TensorView lse;       // f32 [T, H]; optional (empty = not wanted)
};

// Planning work, counted so tests can prove a skip.
struct PlanningStats {
  uint64_t init_forward_metadata_calls = 0;
  uint64_t absorbed_plans = 0;
  uint64_t mha_plans = 0;
  uint64_t mha_chunk_plans = 0;  // chunked-prefix planner runs
  uint64_t fallbacks = 0;        // batches that took the parent's absorbed path
  uint64_t graph_replays = 0;
  uint64_t plan_ns_total = 0;
  uint64_t graph_captures = 0;
  uint64_t mha_chunk_metadata_calls = 0;    // init_mha_chunk_metadata calls received
  uint64_t mha_chunk_metadata_skipped = 0;  // of those, returned without work (no fallback)
  uint64_t chunks_planned = 0;              // prefix chunks planned in total
  uint64_t plan_ns_last = 0;
};

// A backend's own account of the plan its last init_forward_metadata() (and
// init_mha_chunk_metadata()) built: what `mla plan` prints. Nothing is recomputed for it.
struct PlanDescription {
  std::string backend;  // "chunked_mla"
  ForwardMode mode = ForwardMode::kDecode;
  ForwardMethod method = ForwardMethod::kAbsorbed;
  bool fell_back = false;
  int64_t num_tokens = 0;  // new tokens planned (graph batches: padded)
  // The chunked-prefix plan the backend built and uses (empty unless method is kMhaChunked).
  struct Chunk {
    int64_t start = 0;          // first prefix token of the chunk
    std::vector<int32_t> lens;  // prefix tokens of each request in the chunk
    int64_t num_tokens = 0;     // sum of lens
    bool has_zero_kv = false;   // some request has no prefix tokens in the chunk
  };
  int64_t chunk_capacity = 0;  // prefix tokens per chunk across the batch the backend planned with
  int64_t chunk_len = 0;       // L, prefix tokens per request per chunk
  std::vector<Chunk> chunks;
  // Further facts in order, as name and value ("absorbed plan bytes", "1536").
  std::vector<std::pair<std::string, std::string>> details;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string_view name() const = 0;
  virtual const BackendOptions& options() const = 0;

  // ---- per batch ----
  virtual Status init_forward_metadata(const ForwardBatch& batch) = 0;
  // Prepares the chunked-prefix MHA path. `disable_ragged` is the parent's extra flag
  // (accepted and ignored by backends that do not use it).
  virtual Status init_mha_chunk_metadata(const ForwardBatch& batch,
                                         bool disable_ragged = false) = 0;
  // The method layers use for the batch last planned.
  virtual ForwardMethod forward_method() const = 0;
  // The method for a batch, without planning (pure).
  virtual ForwardMethod choose_forward_method(const ForwardBatch& batch) const = 0;

  // ---- per layer ----
  virtual Status forward_decode(const AttentionInputs& in, const AttentionOutputs& out,
                                const ExecContext& ctx) = 0;
  virtual Status forward_extend(const AttentionInputs& in, const AttentionOutputs& out,
                                const ExecContext& ctx) = 0;

  // ---- CUDA graphs (also exercised on the cpu: same static buffers, no allocation) ----
  // Allocates every buffer a captured graph will point at.
  virtual Status init_cuda_graph_state(int max_bs, int64_t max_num_tokens) = 0;
  // Plans a padded batch of graph size into the static buffers.
  virtual Status init_forward_metadata_capture_cuda_graph(const ForwardBatch& padded_batch) = 0;
  // Refreshes the static buffers in place for a new batch padded to padded_bs (no allocation,
  // no address change). Padded requests use seq_len = fill value, request row 0, dummy page.
  virtual Status init_forward_metadata_replay_cuda_graph(const ForwardBatch& batch,
                                                         int padded_bs) = 0;
  virtual int32_t cuda_graph_seq_len_fill_value() const { return 1; }

  virtual const PlanningStats& planning_stats() const = 0;

  // The stream plan uploads are ordered on (cuda: a cudaStream_t; nullptr, the default, is the
  // legacy default stream). Set it to the stream the layers run on, e.g. a non-blocking compute
  // stream, before planning: uploads go through pinned staging memory and are enqueued on it.
  // It also becomes the stream of the backend's kv pool (LatentKvPool::set_stream), so the
  // pool's req_to_token uploads and copy-on-write copies are ordered before the kernels that
  // read them: the backends of one pool run on one stream.
  virtual void set_stream(void* stream) { (void)stream; }

  // ---- additions for layers and tools ----
  // Writes the new tokens' latent rows of `layer` at the last planned batch's out_cache_loc
  // (what forward_* does when save_kv_cache is set). c_kv bf16 [T, 512], k_pe bf16 [T, 64].
  virtual Status save_kv_cache(int layer, const TensorView& c_kv, const TensorView& k_pe,
                               const ExecContext& ctx) = 0;
  // Device copy of the last planned batch's out_cache_loc, i32 [T] (graph: padded T): the slots
  // the layer calls write.
  virtual TensorView out_cache_loc() const = 0;
  // Whether the last planned batch took the fallback (chunked_mla / ondemand_mla only).
  virtual bool fell_back() const { return false; }
  // The plan of the last planned batch, as the backend built it (an empty description with
  // only the backend's name before the first plan).
  virtual PlanDescription describe_plan() const = 0;
  // Median wall time of the last (up to 256) init_forward_metadata / replay calls, ns; 0 if none.
  virtual double median_plan_ns() const = 0;
  virtual LatentKvPool* pool() const = 0;
};

// Plans one batch the way a model runner does: init_forward_metadata, then
// init_mha_chunk_metadata when the chosen method is chunked MHA.
Status plan_batch(AttentionBackend& backend, const ForwardBatch& batch);

// What a backend is built against.
struct BackendContext {
  LatentKvPool* pool = nullptr;  // outlives the backend
  BackendOptions options;
};

// The forward method the registered family `name` (paged_mla, chunked_mla, ondemand_mla) gives
// `batch` under `options`: the rule its backend's choose_forward_method applies, for adapters
// that plan over an engine's own pools instead of a C++ backend (mla.Backend in Python). Reads
// the batch's mode, extend_prefix_lens and seq_lens_sum only. kInvalidArgument naming the
// family when it is none of the three.
StatusOr<ForwardMethod> family_forward_method(std::string_view name, const BackendOptions& options,
                                              const ForwardBatch& batch);

// Everything a backend can know when it is built, checked before it is, by the one function the
// C++ backends (at construction) and the Python adapters (torch.ops.mla.check_backend_config,
// over an engine's own pools) both call: the model shape (ModelDims::validate: head count and
// MLA dims), the kv pool's page size and cache dtype (check_page_size, check_cache_dtype), the
// op set of options.device (options.op_set, or the device's default) and whether it has code for
// that device (check_op_set_device: a GPU of another compute capability is refused), and that
// the set's absorbed op serves (heads, page size, dtype), so nothing is refused later at the
// first decode. `who` prefixes each message, which names the field, its value and what is
// served. Returns the op set.
StatusOr<const OpSet*> check_backend_config(const BackendOptions& options, int page_size,
                                            DType cache_dtype, std::string_view who);

using BackendFactory =
    std::function<StatusOr<std::unique_ptr<AttentionBackend>>(const BackendContext&)>;

class BackendRegistry {
 public:
  static BackendRegistry& global();  // paged_mla, chunked_mla, ondemand_mla
  void add(std::string name, std::string description, BackendFactory factory);
  std::vector<std::string> names() const;
  std::string description(std::string_view name) const;
  StatusOr<std::unique_ptr<AttentionBackend>> create(std::string_view name,
                                                     const BackendContext& ctx) const;

 private:
  struct Entry {
    std::string name, description;
    BackendFactory factory;
  };
  std::vector<Entry> entries_;
};

}  // namespace mla
