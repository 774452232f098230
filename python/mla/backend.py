"""mla.Backend: the attention-backend interface of SGLang (method names and call forms) over the
mla ops, reading the engine's own pools in place (given to the constructor, as SGLang 0.5.23 keeps
them on the backend). Engine-neutral: it imports no engine; mla.integrations.sglang subclasses it
together with SGLang's own AttentionBackend.

Design (docs/design-decisions.md): the C++ backends own their latent pool (cache and
req_to_token), while an engine owns its pools as torch tensors. This class is a translator: per
batch it hands the engine's host lengths to the C++ engine planner (torch.ops.mla.engine_plan over
mla::EnginePlanner), which checks them, resolves the per-mode lengths, decides the forward method
and the fallback by the C++ backends' own functions and plans the absorbed op into the plan holder
its policy picks (the CUDA-graph holder, the eager one, or a grown one it asks for). The layer
calls run the same kernels on the engine's tensors: the token-level req_to_token table and one
[slots, 1, 576] latent buffer per layer.

Families, as in the C++ library (src/planning/forward_method.cc decides, not this file):
  paged_mla     absorbed attention for decode, verify and draft-extend; for extends, ragged MHA
                when no request has a cached prefix, absorbed when the prefixes are short
                (sum below mha_prefix_threshold), chunked-prefix MHA otherwise. The eager plan
                holder is allocated at construction for the capacity.
  chunked_mla   like paged_mla, but extends with a prefix always take chunked-prefix MHA (the
                engine gathers and up-projects the prefix chunks; init_mha_chunk_metadata plans
                one non-causal MHA pass per chunk), unless the fallback rule holds (fell_back).
  ondemand_mla  extends as chunked_mla, with every buffer allocated on first use and grown on
                demand.
The plan holders' op scratch is a window of the family's workspace, as in C++ (mla._workspace:
paged_mla's one per device shared by every paged_mla backend, chunked_mla's zeroed shared one,
ondemand_mla's own, grown on demand); memory_ledger() lists every buffer a backend holds.
All LSEs are natural log.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, List, Optional

import torch

from . import _workspace
from . import ops as _ops
from . import support as _support

FAMILIES = ("paged_mla", "chunked_mla", "ondemand_mla")
# SGLang batch modes no family serves (sparse-prefill, prebuilt and diffusion-LLM batches).
_UNSERVED_MODES = (("prebuilt", "is_prebuilt"), ("split_prefill", "is_split_prefill"),
                   ("dllm_extend", "is_dllm_extend"))
_MODES = (("idle", "is_idle"), ("target_verify", "is_target_verify"),
          ("draft_extend", "is_draft_extend_v2"), ("draft_extend", "is_draft_extend"),
          ("mixed", "is_mixed"), ("decode", "is_decode"), ("extend", "is_extend"))
# Keyword arguments of SGLang's forward calls that select features mla does not implement: the
# call is refused rather than computed without them.
_UNSUPPORTED_KWARGS = ("attn_sink", "topk_indices", "cos_sin_cache", "sinks")
# The MLA dims, from the C++ library (mla.support): 576, 512, 64, 192, 128.
LATENT_DIM, KV_LORA_RANK, ROPE_DIM = (_support.LATENT_DIM, _support.KV_LORA_RANK,
                                      _support.QK_ROPE_DIM)
QK_HEAD_DIM, V_HEAD_DIM = _support.QK_HEAD_DIM, _support.V_HEAD_DIM


# engine_plan's answer: where the plan went (PlanTarget) and the method (EngineMethod); the
# holder kinds of engine_set_holder.
_NONE, _EAGER, _GRAPH, _GROW, _MHA, _GROW_MHA = 0, 1, 2, 3, 4, 5
_METHODS = ("absorbed", "mha", "mha_chunked")
_EAGER_HOLDER, _GRAPH_HOLDER, _MHA_HOLDER, _CHUNK_HOLDER = 0, 1, 2, 3

_BY_NAME = {"DECODE": "decode", "EXTEND": "extend", "MIXED": "mixed", "IDLE": "idle",
            "TARGET_VERIFY": "target_verify", "DRAFT_EXTEND_V2": "draft_extend"}


def _mode_name(forward_mode, family: str = "mla") -> str:
    """SGLang ForwardMode (or our strings) -> one of decode/extend/mixed/target_verify/
    draft_extend/idle; ValueError naming the mode for one no family serves."""
    known = _BY_NAME.get(getattr(forward_mode, "name", None))
    if known is not None:  # SGLang's ForwardMode members, by name (the per-batch fast path)
        return known
    if isinstance(forward_mode, str):
        if forward_mode in {m for m, _ in _MODES}:
            return forward_mode
    else:
        for name, pred in _UNSERVED_MODES:
            f = getattr(forward_mode, pred, None)
            if f is not None and f():
                raise ValueError(
                    f"forward_batch.forward_mode = {forward_mode!r}: {family} does not serve "
                    f"{name} batches (it serves decode, extend, mixed, target_verify, "
                    "draft_extend and idle)")
        for name, pred in _MODES:
            f = getattr(forward_mode, pred, None)
            if f is not None and f():
                return name
    raise ValueError(f"forward_batch.forward_mode = {forward_mode!r}: not one of decode, "
                     f"extend, mixed, target_verify, draft_extend, idle ({family})")


def _cpu_i32(x, name: str = "lengths") -> torch.Tensor:
    return _ops._host_i32(x, name)


def _host_field(forward_batch, name: str):
    """forward_batch.<name>_cpu when SGLang keeps a host mirror (no device sync), else <name>:
    an int32 or int64 host tensor as it is (the plan op reads both; SGLang's mirrors are int64),
    anything else converted to int32."""
    host = getattr(forward_batch, name + "_cpu", None)
    return _ops._host_lengths(host if host is not None else getattr(forward_batch, name),
                              f"forward_batch.{name}")


def _holding(lock):
    """The workspace's lock while an op runs; none while torch.compile traces the call (Dynamo
    would break the graph at a lock; a compiled model is driven by one engine thread)."""
    return contextlib.nullcontext() if torch.compiler.is_compiling() else lock


class _AbsorbedIO:
    """The per-layer tensors of an absorbed forward, reused by every layer and step: q rows
    [tokens, H, 576] (the split call's q and q_rope are copied in), o [tokens, H, 512] and lse
    [tokens, H] float32, for up to `tokens` tokens."""

    def __init__(self, tokens: int, num_heads: int, dtype, device):
        self.tokens, self.dtype, self.device = int(tokens), dtype, device
        self.q = torch.empty(self.tokens, num_heads, LATENT_DIM, dtype=dtype, device=device)
        self.o = torch.empty(self.tokens, num_heads, KV_LORA_RANK, dtype=dtype, device=device)
        self.lse = torch.empty(self.tokens, num_heads, dtype=torch.float32, device=device)

    def fits(self, tokens: int, dtype, device) -> bool:
        return tokens <= self.tokens and dtype == self.dtype and device == self.device


class Backend:
    def __init__(self, name: str, *, num_heads: int, page_size: int, device, sm_scale: float,
                 kv_cache_dtype=torch.bfloat16, k_scale: float = 1.0, max_batch: int = 256,
                 max_q_len: int = 8, max_extend_tokens: int = 8192,
                 mha_prefix_threshold: int = 8192, disable_chunked_prefix_cache: bool = False,
                 token_to_kv_pool=None, req_to_token_pool=None):
        if name not in FAMILIES:
            raise ValueError(f"name = {name!r}: one of {', '.join(FAMILIES)}")
        # Everything knowable now is checked now, by the C++ backends' own rules, so a backend
        # that would refuse its first decode is never built: the GPU (UnsupportedDevice), then
        # head count, page size and cache dtype (ValueError naming the field), then the pool.
        _support.check_device(device, name)
        _support.check_backend_config(name, _ops._device(device), num_heads, page_size,
                                      kv_cache_dtype)
        self.name = name
        self.num_heads = int(num_heads)
        self.page_size = int(page_size)
        self.device = _ops._device(device)
        self.sm_scale = float(sm_scale)
        self.kv_cache_dtype = kv_cache_dtype
        self.k_scale = float(k_scale)
        self.max_batch = int(max_batch)
        self.max_q_len = int(max_q_len)
        self.max_extend_tokens = int(max_extend_tokens)
        self.mha_prefix_threshold = int(mha_prefix_threshold)
        self.disable_chunked_prefix_cache = bool(disable_chunked_prefix_cache)
        # The engine's pools, read in place: token_to_kv_pool.get_key_buffer(layer_id) gives a
        # layer's [slots, 1, 576] latent buffer; req_to_token_pool.req_to_token the table.
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_token_pool = req_to_token_pool
        if token_to_kv_pool is not None:
            self._check_pool(token_to_kv_pool)
        self.forward_method = "absorbed"
        self.fell_back = False  # chunked_mla / ondemand_mla: the batch took the fallback
        # The C++ engine planner of this family (mla::EnginePlanner): the per-batch decisions.
        first = _ops.ops.engine_new(name, self.num_heads, self.page_size, self.max_batch,
                                    self.max_q_len, self.max_extend_tokens,
                                    self.mha_prefix_threshold,
                                    self.disable_chunked_prefix_cache, False, False)
        self._engine = int(first[0])
        weakref.finalize(self, _ops.ops.engine_free, self._engine)
        # The workspace the holders' ops run in, and the one a chunked_mla batch that falls back
        # runs in (paged_mla's, held iff a fallback is possible): C++'s policy and sizes.
        self._workspace, self._fallback_ws = _workspace.family_workspaces(name, self._engine,
                                                                          self.device)
        self._graph_ws_base: Optional[torch.Tensor] = None  # the buffer the graph window is of
        self._ws_lock = self._workspace.lock  # of the workspace the batch's ops run in
        self._eager: Optional[_ops.AbsorbedPlan] = None
        self._mha: Optional[_ops.MhaPlan] = None
        self._chunk_plans: List[_ops.MhaPlan] = []  # the batch's: the first holders below
        self._chunk_holders: List[_ops.MhaPlan] = []  # one per prefix chunk index, reused
        self._graph_plan: Optional[_ops.AbsorbedPlan] = None
        self._plan: Optional[_ops.AbsorbedPlan] = None
        self._tokens = 0
        self._mode = "decode"
        # Host scratch of the int32 write locations of the kv_write path: reused, grown on
        # demand.
        self._scratch: Dict[tuple, torch.Tensor] = {}
        self._loc_i32: Optional[tuple] = None  # (out_cache_loc given, its int32 copy) this step
        # The absorbed forward's q / o / lse: one set for eager batches (allocated at the first
        # absorbed forward, grown when a batch needs more), one for batches planned into the
        # CUDA-graph plan (sized by init_cuda_graph_state, so a captured graph's addresses never
        # move). A decode layer's output is a view of this set's o: valid until the next
        # absorbed forward call of this backend (the model projects it through W_UV first).
        self._io: Optional[_AbsorbedIO] = None
        self._graph_io: Optional[_AbsorbedIO] = None
        self.stats = {"init_forward_metadata_calls": 0, "absorbed_plans": 0, "mha_plans": 0,
                      "mha_chunk_plans": 0, "graph_plans": 0}
        if first[1]:  # paged_mla, chunked_mla: the eager holder at construction
            self._set_holder(_EAGER_HOLDER, first[1:4])

    # ---- planning helpers ----
    def _set_holder(self, kind: int, cap, index: int = 0):
        """A plan holder of the capacity the engine planner asked for, registered with it: the
        eager or CUDA-graph absorbed holder (cap: max_batch, max_q_tokens, max_q_len), the MHA
        holder or prefix chunk `index`'s (cap: max_batch, max_q_tokens, max_q_len,
        max_kv_tokens)."""
        if kind in (_MHA_HOLDER, _CHUNK_HOLDER):
            p = _ops.MhaPlan(self.device, self.num_heads, causal=kind == _MHA_HOLDER,
                             max_batch=int(cap[0]), max_q_tokens=int(cap[1]),
                             max_q_len=int(cap[2]), max_kv_tokens=int(cap[3]),
                             own_workspace=False)
            self._attach(p, kind)
            _ops.ops.engine_set_holder(self._engine, kind, p._staging.handle, p._staging.plan,
                                       None, p.max_batch, p.max_q_tokens, p.max_q_len,
                                       p.max_kv_tokens, index)
            if kind == _MHA_HOLDER:
                self._mha = p
            else:
                self._chunk_holders[index:index + 1] = [p]
            return p
        p = _ops.AbsorbedPlan(self.device, self.num_heads, self.page_size, max_batch=int(cap[0]),
                              max_q_tokens=int(cap[1]), max_q_len=int(cap[2]),
                              own_workspace=False)
        self._attach(p, kind)
        _ops.ops.engine_set_holder(self._engine, kind, p._staging.handle, p.plan_tensor,
                                   p._extents, p.max_batch, p.max_q_tokens, p.max_q_len, 0)
        if kind == _GRAPH_HOLDER:
            self._graph_plan = p
        else:
            self._eager = p
        return p

    def _attach(self, p, kind: int) -> None:
        """Gives holder p its op scratch: the window of the family's workspace it needs (the
        sharing is safe: see mla._workspace). The eager holder of a backend that can fall back
        also gets its window of paged_mla's workspace, used by the batches that do. The CUDA-graph
        holder's window is taken once, here at init_cuda_graph_state (as BackendBase carves the
        graph's op scratch then), and never moved: a captured graph reads it. A shared workspace
        never moves; when ondemand_mla's grows, the other holders take their windows again, and
        the graph holder keeps the buffer it was carved from (C++ refuses a replay after such a
        growth; here every decode batch that fits is planned into the graph holder, captured or
        not, so the buffer is kept instead)."""
        ws = self._workspace
        grown = ws.grow_count
        p.workspace = ws.window(p.workspace_bytes)
        if kind == _GRAPH_HOLDER:
            self._graph_ws_base = ws.buffer
        p._windows = (p.workspace, self._fallback_ws.window(p.workspace_bytes)
                      if kind == _EAGER_HOLDER and self._fallback_ws is not None else None)
        if ws.grow_count != grown:  # on-demand growth: the other windows are of the old buffer
            for q in (self._eager, self._mha, *self._chunk_holders):
                if q is not None and q is not p:
                    q.workspace = ws.window(q.workspace_bytes)
                    q._windows = (q.workspace, q._windows[1])

    def _scratch_of(self, name: str, n: int, dtype, device=None) -> torch.Tensor:
        """A reused 1-D buffer of n elements (a view of one grown on demand, never shrunk)."""
        key = (name, dtype, device)
        t = self._scratch.get(key)
        if t is None or t.numel() < n:
            t = self._scratch[key] = torch.empty(max(n, 2 * (t.numel() if t is not None else 0),
                                                     self.max_batch),
                                                 dtype=dtype, device=device)
        return t[:n]

    def _absorbed_io(self, tokens: int, dtype, device) -> _AbsorbedIO:
        """The q / o / lse set of the batch last planned: the graph plan's, or the eager one
        (first allocated for the capacity, max_batch tokens, except ondemand_mla, which
        allocates what the batch needs; doubled when a batch needs more)."""
        if self._plan is self._graph_plan and self._graph_plan is not None:
            io = self._graph_io
            if io is None or not io.fits(tokens, dtype, device):
                io = self._graph_io = _AbsorbedIO(
                    max(tokens, self._graph_plan.max_q_tokens), self.num_heads, dtype, device)
            return io
        io = self._io
        if io is None or not io.fits(tokens, dtype, device):
            grown = 2 * io.tokens if io is not None and io.dtype == dtype else 0
            base = 0 if self.name == "ondemand_mla" else self.max_batch
            io = self._io = _AbsorbedIO(max(tokens, grown, base), self.num_heads, dtype, device)
        return io

    def _draft_tokens(self, forward_batch, mode: str) -> int:
        """The draft tokens each request of a target_verify batch scores (SGLang's
        spec_info.draft_token_num); 0 for the other modes."""
        if mode != "target_verify":
            return 0
        spec = getattr(forward_batch, "spec_info", None)
        n = getattr(spec, "draft_token_num", None)
        if n is None or int(n) < 1:
            raise ValueError(f"forward_batch.spec_info.draft_token_num = {n!r}: a "
                             "target_verify batch needs the number of draft tokens (>= 1)")
        return int(n)

    def _kv_extra(self, forward_batch, mode: str) -> int:
        """Keys every request sees past its seq_len (an engine's draft step); 0 here."""
        return 0

    def _engine_plan(self, forward_batch, mode: str):
        """One call of the engine planner over the batch's host lengths (SGLang's host mirrors,
        int32 or int64, read in place by the op)."""
        seq = _host_field(forward_batch, "seq_lens")
        rows = seq if mode == "idle" else _host_field(forward_batch, "req_pool_indices")
        ext = prefix = None
        if mode in ("extend", "mixed", "draft_extend"):
            ext = _cpu_i32(forward_batch.extend_seq_lens_cpu, "forward_batch.extend_seq_lens_cpu")
            prefix = _cpu_i32(forward_batch.extend_prefix_lens_cpu,
                              "forward_batch.extend_prefix_lens_cpu")
        return _ops.ops.engine_plan(self._engine, mode, rows, seq, ext, prefix,
                                    self._draft_tokens(forward_batch, mode),
                                    self._kv_extra(forward_batch, mode))

    def planned_lengths(self) -> Dict[str, torch.Tensor]:
        """The lengths of the batch last planned, as the C++ planner resolved them per mode
        (new int32 cpu tensors): q_lens, kv_lens, prefix_lens, qo_indptr, kv_indptr."""
        names = ("q_lens", "kv_lens", "prefix_lens", "qo_indptr", "kv_indptr")
        return dict(zip(names, _ops.ops.engine_lengths(self._engine)))

    # ---- SGLang AttentionBackend interface ----
    def init_forward_metadata(self, forward_batch) -> None:
        """Plans the batch on the host (SGLang's host mirrors seq_lens_cpu,
        req_pool_indices_cpu, extend_*_lens_cpu; no device sync when they are set). Decode and
        target-verify batches that fit the CUDA-graph capacity are planned into the graph plan,
        so a captured graph reads the plan re-planned before each replay."""
        self.stats["init_forward_metadata_calls"] += 1
        mode = _mode_name(forward_batch.forward_mode, self.name)
        self._mode = mode
        r = self._engine_plan(forward_batch, mode)
        if r[0] in (_GROW, _GROW_MHA):  # a holder is missing or too small: the planner's size
            self._set_holder(_EAGER_HOLDER if r[0] == _GROW else _MHA_HOLDER, r[7:11])
            r = self._engine_plan(forward_batch, mode)
        target = r[0]
        self.forward_method = _METHODS[r[1]]
        self.fell_back = bool(r[2])
        self._tokens = r[4]
        self._loc_i32 = None
        if self._chunk_plans:
            self._chunk_plans = []
        if target == _EAGER or target == _GRAPH:
            p = self._graph_plan if target == _GRAPH else self._eager
            if target == _GRAPH:
                self.stats["graph_plans"] += 1
            elif p._windows[1] is not None:  # chunked_mla: a batch that fell back runs in
                p.workspace = p._windows[1 if self.fell_back else 0]  # paged_mla's workspace
            self._ws_lock = (self._fallback_ws.lock if self.fell_back and p._windows[1] is not None
                             else self._workspace.lock)
            p.planned = True
            self._plan = p
            self.stats["absorbed_plans"] += 1
        elif target == _MHA:
            self._mha.planned = True
            self.stats["mha_plans"] += 1

    def init_mha_chunk_metadata(self, forward_batch, disable_flashinfer_ragged: bool = False):
        """One non-causal MHA plan per prefix chunk. The engine decides the chunks (it gathers
        the prefix by them): SGLang's forward_batch.prefix_chunk_seq_lens_cpu [chunks, bs] (host,
        no sync) or, without it, prefix_chunk_cu_seq_lens [chunks, bs + 1] (cumulative keys per
        request); mla's chunk planner gives the same chunks (tests/python/test_engine_plan.py)."""
        self._chunk_plans = []
        if self.forward_method != "mha_chunked":
            return
        lens = getattr(forward_batch, "prefix_chunk_seq_lens_cpu", None)
        if lens is not None:
            lens = torch.as_tensor(lens).to(torch.int32)
            cu = torch.zeros(lens.shape[0], lens.shape[1] + 1, dtype=torch.int32)
            torch.cumsum(lens, 1, out=cu[:, 1:])
        else:
            cu = getattr(forward_batch, "prefix_chunk_cu_seq_lens", None)
            if cu is None:
                raise ValueError("forward_batch.prefix_chunk_cu_seq_lens is None: "
                                 "init_mha_chunk_metadata needs the prefix chunks")
            cu = torch.as_tensor(cu).to("cpu", torch.int32).contiguous()
        # The chunks must cover every request's prefix exactly (checked by the planner, which
        # then plans one non-causal MHA pass per chunk into its reused holder, asking for a new
        # or bigger holder first where one is missing or too small).
        r = _ops.ops.engine_plan_chunks(self._engine, cu)
        while r[0] == 1:
            self._set_holder(_CHUNK_HOLDER, r[2:6], index=r[1])
            r = _ops.ops.engine_plan_chunks(self._engine, cu)
        self._chunk_plans = self._chunk_holders[:r[1]]
        for p in self._chunk_plans:
            p.planned = True
        self.stats["mha_chunk_plans"] += r[1]

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """The plan a captured decode / target-verify graph reads (fixed addresses), of the
        capacity the C++ graph state has (torch.ops.mla.engine_graph_capacity)."""
        self._set_holder(_GRAPH_HOLDER,
                         _ops.ops.engine_graph_capacity(int(max_bs), int(max_num_tokens)))
        # The q / o / lse a captured graph points at, allocated now (bf16, the served q dtype)
        # so that capture never allocates them and they never move.
        self._graph_io = _AbsorbedIO(int(max_num_tokens), self.num_heads, torch.bfloat16,
                                     self.device)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # ---- per layer ----
    def _check_layer(self, layer, head_dim: int, v_head_dim: int) -> None:
        heads = getattr(layer, "tp_q_head_num", self.num_heads)
        if heads != self.num_heads:
            raise ValueError(f"layer.tp_q_head_num = {heads}: {self.name} was planned for "
                             f"{self.num_heads} heads per rank")
        for field, got, want in (("head_dim", getattr(layer, "head_dim", head_dim), head_dim),
                                 ("v_head_dim", getattr(layer, "v_head_dim", v_head_dim),
                                  v_head_dim)):
            if got != want:
                raise ValueError(f"layer.{field} = {got}: {self.name} serves DeepSeek MLA "
                                 f"({field} {want} for this call form)")

    def _check_buffer(self, buf, layer_id) -> None:
        """ValueError naming the pool's buffer when its layout, dtype or device is not the
        latent cache this backend was built for."""
        if buf.dim() != 3 or buf.shape[1] != 1 or buf.shape[2] != LATENT_DIM:
            raise ValueError(f"token_to_kv_pool.get_key_buffer({layer_id}): shape "
                             f"{tuple(buf.shape)}, expected [slots, 1, {LATENT_DIM}] (an MLA "
                             f"latent pool: kv_lora_rank {KV_LORA_RANK} + qk_rope_head_dim "
                             f"{ROPE_DIM})")
        if buf.dtype != self.kv_cache_dtype:
            raise ValueError(f"token_to_kv_pool.get_key_buffer({layer_id}): dtype "
                             f"{buf.dtype}, but {self.name} was built for kv_cache_dtype "
                             f"{self.kv_cache_dtype}")
        if buf.device != self.device:
            raise ValueError(f"token_to_kv_pool.get_key_buffer({layer_id}): device "
                             f"{buf.device}, backend device {self.device}")

    def _check_pool(self, pool) -> None:
        """The engine's pool, checked when the backend is built: its page size (when it has
        one) and its first layer's buffer (layout [slots, 1, 576], dtype, device)."""
        pool_page = getattr(pool, "page_size", None)
        if pool_page is not None and int(pool_page) != self.page_size:
            raise ValueError(f"token_to_kv_pool.page_size = {pool_page}, but {self.name} is "
                             f"built for page_size {self.page_size}")
        first = int(getattr(pool, "start_layer", 0) or 0)
        self._check_buffer(pool.get_key_buffer(first), first)
        # An fp8 cache is read with k_scale (value = stored * k_scale) exactly where it was
        # written with it. A pool's own write door (SGLang's set_mla_kv_buffer, which _save
        # uses) stores a plain cast, no scale: its rows must be read with k_scale 1.
        if (self.kv_cache_dtype == torch.float8_e4m3fn and self.k_scale != 1.0
                and hasattr(pool, "set_mla_kv_buffer")):
            raise ValueError(
                f"k_scale = {self.k_scale}: token_to_kv_pool writes new rows through its own "
                "set_mla_kv_buffer, which stores a plain cast to float8_e4m3fn (no scale), so "
                "they must be read with k_scale=1.0 (a pool without set_mla_kv_buffer is "
                "written by mla's kv_write, which applies k_scale)")

    def _latent_cache(self, layer) -> torch.Tensor:
        pool = self.token_to_kv_pool
        if pool is None:
            raise ValueError(f"{self.name}: token_to_kv_pool is None (the engine's KV pool)")
        buf = pool.get_key_buffer(layer.layer_id)
        self._check_buffer(buf, layer.layer_id)
        return buf.view(buf.shape[0], LATENT_DIM)

    def _write_loc(self, forward_batch):
        """Where the new tokens' latent rows go (the engine adapter passes its own loc type)."""
        return forward_batch.out_cache_loc

    def _save(self, layer, forward_batch, k, k_rope):
        """Writes the new tokens' latent rows through the pool's own write door
        (set_mla_kv_buffer) when it has one, else with mla's kv_write op. k is c_kv
        [T, 1, 512] with k_rope [T, 1, 64], or the whole row [T, 1, 576] with k_rope None."""
        if k_rope is None:
            if k.shape[-1] != LATENT_DIM:
                raise ValueError(f"k: last dimension {k.shape[-1]}, expected {LATENT_DIM} when "
                                 f"k_rope is not given (or {KV_LORA_RANK} with k_rope)")
            k_rope = k[..., KV_LORA_RANK:]
            k = k[..., :KV_LORA_RANK]
        pool = self.token_to_kv_pool
        if hasattr(pool, "set_mla_kv_buffer"):
            pool.set_mla_kv_buffer(layer, self._write_loc(forward_batch),
                                   k.reshape(-1, 1, KV_LORA_RANK),
                                   k_rope.reshape(-1, 1, ROPE_DIM))
            return
        _ops.kv_write(k.reshape(k.shape[0], -1), k_rope.reshape(k_rope.shape[0], -1),
                      self._out_cache_loc_i32(forward_batch.out_cache_loc),
                      self._latent_cache(layer), self.k_scale)

    def _out_cache_loc_i32(self, loc: torch.Tensor) -> torch.Tensor:
        """The batch's write locations as int32 (what kv_write reads): SGLang's int64
        out_cache_loc is copied into a reused buffer once per batch, not once per layer."""
        if loc.dtype == torch.int32:
            return loc
        cached = self._loc_i32
        if cached is not None and cached[0] is loc:
            return cached[1]
        out = self._scratch_of("out_cache_loc", loc.numel(), torch.int32, loc.device)
        out.copy_(loc.reshape(-1))
        self._loc_i32 = (loc, out)
        return out

    def _refuse_kwargs(self, kwargs) -> None:
        for name in _UNSUPPORTED_KWARGS:
            if kwargs.get(name) is not None:
                raise ValueError(f"{name}: {self.name} does not implement it (pass None or use "
                                 "another attention backend)")

    def _absorbed_forward(self, q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope,
                          kwargs):
        self._refuse_kwargs(kwargs)
        if self._plan is None:
            raise RuntimeError(f"{self.name}: init_forward_metadata was not called")
        self._check_layer(layer, LATENT_DIM, KV_LORA_RANK)
        T, H = self._tokens, self.num_heads
        if save_kv_cache and k is not None:
            self._save(layer, forward_batch, k, k_rope)
        # Every tensor below is a view of the reused set (no allocation per layer): the split
        # call's q and q_rope are joined into its q rows, the kernel writes its o and lse.
        io = self._absorbed_io(T, q.dtype, q.device)
        if q_rope is not None:
            q = torch.cat([q.reshape(T, H, KV_LORA_RANK), q_rope.reshape(T, H, ROPE_DIM)], dim=-1,
                          out=io.q[:T])
        else:
            q = q.reshape(T, H, LATENT_DIM)
        o, lse = io.o[:T], io.lse[:T]
        cache, table = self._latent_cache(layer), self.req_to_token_pool.req_to_token
        with _holding(self._ws_lock):  # the workspace: one user at a time (mla._workspace)
            self._plan.run(q, cache, table, o, lse, getattr(layer, "scaling", self.sm_scale),
                           self.k_scale)
        return o.view(T, H * KV_LORA_RANK)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None,
                       k_rope=None, **kwargs):
        return self._absorbed_forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope,
                                      kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None,
                       k_rope=None, **kwargs):
        if self.forward_method == "absorbed":
            return self._absorbed_forward(q, k, layer, forward_batch, save_kv_cache, q_rope,
                                          k_rope, kwargs)
        self._refuse_kwargs(kwargs)
        if q_rope is not None or q.shape[-1] == LATENT_DIM:
            raise ValueError(f"q: the absorbed (latent) form, but {self.name} planned this batch "
                             f"as {self.forward_method} (q [T, H, {QK_HEAD_DIM}], k, v "
                             "up-projected)")
        self._check_layer(layer, QK_HEAD_DIM, V_HEAD_DIM)
        # MHA forms: q [T, H, 192], k [N, H, 192], v [N, H, 128] (already up-projected).
        T, H = self._tokens, self.num_heads
        q = q.reshape(T, H, QK_HEAD_DIM)
        k = k.reshape(k.shape[0], H, QK_HEAD_DIM)
        v = v.reshape(v.shape[0], H, V_HEAD_DIM)
        o = torch.empty(T, H, V_HEAD_DIM, dtype=q.dtype, device=q.device)
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        scale = getattr(layer, "scaling", self.sm_scale)
        if getattr(forward_batch, "attn_attend_prefix_cache", False):
            idx = forward_batch.prefix_chunk_idx
            if not 0 <= idx < len(self._chunk_plans):
                raise ValueError(f"forward_batch.prefix_chunk_idx = {idx}: "
                                 f"{len(self._chunk_plans)} prefix chunks were planned "
                                 "(init_mha_chunk_metadata)")
            plan = self._chunk_plans[idx]
        else:
            plan = self._mha
        with _holding(self._workspace.lock):  # MHA batches never fall back: the family's
            plan.run(q, k, v, o, lse, scale)
        if getattr(forward_batch, "mha_return_lse", False):
            return o, lse
        return o.view(T, H * V_HEAD_DIM)

    # ---- resources ----
    def memory_ledger(self) -> List[Dict[str, Any]]:
        """Every device and pinned host buffer this backend holds, a row each: name, owner,
        device, bytes, zeroed, named as the C++ ledger names its backends' equivalents. The
        family workspace its ops run in ("paged_mla.workspace" / "chunked_mla.workspace", owner
        "shared:<the backend that made it>", listed by every backend that shares it;
        "ondemand_mla.workspace") and chunked_mla's fallback's "paged_mla.workspace"; per plan
        holder its device plan ("<name>.absorbed_plan", "graph.absorbed_plan", "mha_plan",
        "mha_chunk_plan[i]") and the two pinned buffers of its staging ring
        ("<name>.upload_staging[j]", "graph.", "mha.", "mha_chunk[i]." ones; device
        "cpu (pinned)", none on the cpu device); the absorbed q / o / lse sets ("absorbed_q",
        "absorbed_o", "lse" and their "graph." ones); the int32 write locations
        ("out_cache_loc"); and, when ondemand_mla's workspace grew after init_cuda_graph_state,
        the buffer the graph holder's window is of ("graph.workspace")."""
        rows: List[Dict[str, Any]] = []

        def add(name, t):
            if t is not None and t.numel():
                rows.append({"name": f"{self.name}.{name}", "owner": self.name,
                             "device": str(t.device), "bytes": t.numel() * t.element_size(),
                             "zeroed": False})

        for ws in (self._workspace, self._fallback_ws):
            if ws is not None and ws.buffer is not None:
                rows.append({"name": ws.name, "owner": ws.owner, "device": str(ws.device),
                             "bytes": ws.nbytes, "zeroed": ws.zeroed})
        if self._graph_ws_base is not None and self._graph_ws_base is not self._workspace.buffer:
            add("graph.workspace", self._graph_ws_base)
        holders = [("absorbed_plan", "", self._eager),
                   ("graph.absorbed_plan", "graph.", self._graph_plan),
                   ("mha_plan", "mha.", self._mha)]
        holders += [(f"mha_chunk_plan[{i}]", f"mha_chunk[{i}].", p)
                    for i, p in enumerate(self._chunk_holders)]
        for plan_name, ring, p in holders:
            if p is None:
                continue
            add(plan_name, p._staging.plan)
            for j, nbytes in enumerate(p._staging.host_bytes()):
                if nbytes:
                    rows.append({"name": f"{self.name}.{ring}upload_staging[{j}]",
                                 "owner": self.name, "device": "cpu (pinned)", "bytes": nbytes,
                                 "zeroed": False})
        for prefix, io in (("", self._io), ("graph.", self._graph_io)):
            if io is not None:
                add(f"{prefix}absorbed_q", io.q)
                add(f"{prefix}absorbed_o", io.o)
                add(f"{prefix}lse", io.lse)
        for (name, dtype, device), t in self._scratch.items():
            add(name, t)
        return rows
