"""mla: MLA (DeepSeek multi-head latent attention) ops and backends for PyTorch serving engines.

Entry points (LSE base in brackets):
  mla.get_mla_metadata, mla.flash_mla_with_kvcache      FlashMLA-shaped   [natural log; +inf
                                                        for rows without keys, as FlashMLA]
  mla.BatchMLAPagedAttentionWrapper, mla.MLAPlanMetadata FlashInfer-shaped [base 2 by default]
  mla.merge_state                                       FlashInfer-shaped [base 2, as FlashInfer]
  mla.merge_state_natural                               the same merge    [natural log]
  mla.ops: AbsorbedPlan, MhaPlan, kv_write, up_project, merge_state_   [natural log]
  torch.ops.mla.*: the custom ops themselves (schemas, fake impls, CPU and CUDA kernels)
  mla.Backend: SGLang's AttentionBackend methods over the ops (paged_mla, chunked_mla,
    ondemand_mla); mla.integrations.sglang: the SGLang plugin
  mla.support: what mla serves, from the C++ library: the MLA dims, PAGE_SIZES, the construction
    check, and unsupported_reason(device) (mla's CUDA kernels run on compute capability 9.0 only)
"""
from . import _native
from ._ops import ops as _torch_ops  # noqa: F401  (loads the library, registers fakes)
from . import ops, support
from .backend import Backend
from .flashinfer import BatchMLAPagedAttentionWrapper, MLAPlanMetadata
from .flashmla import FlashMLASchedMeta, flash_mla_with_kvcache, get_mla_metadata
from .ops import merge_state, merge_state_natural
from .support import PAGE_SIZES, UnsupportedDevice, unsupported_reason

has_cuda_ops = _native.has_cuda_ops

__all__ = [
    "Backend",
    "BatchMLAPagedAttentionWrapper",
    "FlashMLASchedMeta",
    "MLAPlanMetadata",
    "PAGE_SIZES",
    "UnsupportedDevice",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
    "has_cuda_ops",
    "merge_state",
    "merge_state_natural",
    "ops",
    "support",
    "unsupported_reason",
]
__version__ = "0.1.0"
