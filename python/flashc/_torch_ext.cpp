// flashc's forward, backward and KV-cache attention as PyTorch operators flashc_ext::fwd, flashc_ext::bwd and
// flashc_ext::kvcache, on PyTorch's stable ABI: the C++ half of the eager hot paths of flashc.torch and of
// flashc.attention_with_kvcache on torch tensors (python/flashc/_torch_fast.py loads it).
//
//   flashc_ext::fwd(q, k, v, cu_seqlens_q?, cu_seqlens_k?, options, max_seqlen_q=0, max_seqlen_k=0,
//                   alibi_slopes?=None, attn_mask?=None) -> (out, lse)
//   flashc_ext::bwd(dout, q, k, v, out, lse, cu_seqlens_q?, cu_seqlens_k?, options, max_seqlen_q=0,
//                   max_seqlen_k=0, alibi_slopes?=None, attn_mask?=None) -> (dq, dk, dv)
//   flashc_ext::kvcache(q, k_cache!, v_cache!, k?, v?, cache_seqlens?, block_table?, out!?, options, num_splits,
//                       want_lse) -> (out?, lse?)
//
// The tensors mean what they mean for flashc::fwd / flashc::bwd (python/flashc/_ops.py) and for
// flashc.attention_with_kvcache (flashc_forward_kvcache: the caches are written in place when k and v are given,
// and so is out= when given, which is then not returned; lse only when wanted); `options` is the number
// flashc_torch_options gave for the rest of their arguments (scale, causal, window_left, window_right, top_left,
// backend, threads, deterministic, softcap), which flashc.torch and attention_with_kvcache check and pack once per
// distinct set: every argument of a schema costs the Python-to-operator call a conversion, and a string or an
// optional float costs more than an int. These kernels run the calls that need nothing but them, ALiBi and an
// attn_mask without its gradient (no seqused, dbias, dropout or num_splits for fwd/bwd), the calls of a plain model,
// of an ALiBi or padded one and of a serving loop. Why C++: in Python the argument checks and the ctypes marshalling
// around the C call cost ~22 us a call on the CPU (bench/torch_call_cost.py), and a decoding step through the
// registered operator torch.ops.flashc.fwd_kvcache_out ~300 us; here at::Tensor -> flashc_tensor is a handful of C
// calls (with the operator's dispatch and output allocation, ~3 us above the C call made through ctypes;
// attention_with_kvcache ~6 us above its operator).
//
// Why the stable ABI (torch/csrc/stable, TORCH_TARGET_VERSION 2.10): the library this builds uses only PyTorch's C
// shim, so one build loads into every torch >= 2.10 (and no Python ABI: it is loaded with torch.ops.load_library).
// The stable ABI cannot register autograd formulas, so the autograd.Function of flashc.torch stays in Python; nor
// can it move a tensor's version counter, so _torch_fast.py does that for the tensors flashc_ext::kvcache writes.
//
// Failures throw (RuntimeError in Python) with the C library's message; flashc/_torch_fast.py then runs the same
// call through the Python path, which raises the exception type and message flashc.torch always raised. So this
// file checks only what it must to hand libflashc a valid description, and throws on anything unusual.
//
// libflashc is not linked: flashc_torch_bind(path) opens the very library the Python package loaded with ctypes
// (FLASHC_LIBRARY or the package's own), so that both share its handles' state and its per-thread last error.

#define TORCH_TARGET_VERSION (((0ULL + 2) << 56) | ((0ULL + 10) << 48))

#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "flashc.h"

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

namespace {

// ---- libflashc, bound at run time -------------------------------------------------------------------------
struct Api {
  decltype(&flashc_create) create = nullptr;
  decltype(&flashc_destroy) destroy = nullptr;
  decltype(&flashc_set_threads) set_threads = nullptr;
  decltype(&flashc_set_stream) set_stream = nullptr;
  decltype(&flashc_handle_last_backend) last_backend = nullptr;
  decltype(&flashc_forward) forward = nullptr;
  decltype(&flashc_backward) backward = nullptr;
  decltype(&flashc_forward_kvcache) forward_kvcache = nullptr; // NULL in a libflashc older than the KV cache
  decltype(&flashc_last_error) last_error = nullptr;
};
Api api; // written once by flashc_torch_bind, before any operator runs

// The fields of flashc_params these kernels set end at softcap: describing only them (struct_size) lets this
// library drive a libflashc built from an older or newer flashc.h, which gives the later fields their defaults.
constexpr size_t PARAMS_SIZE = offsetof(flashc_params, alibi_slopes);
// A call with varlen offsets in device memory (flash_attn_varlen_func's form) describes the fields up to
// max_seqlen_k too: a libflashc older than them refuses the call, which then takes flashc.torch's Python path.
constexpr size_t PARAMS_SIZE_DEVICE_OFFSETS = offsetof(flashc_params, max_seqlen_k) + sizeof(int64_t);
// A call with ALiBi or an attn_mask describes the fields up to attn_mask_stride (dbias follows it), likewise.
constexpr size_t PARAMS_SIZE_MODIFIERS = offsetof(flashc_params, dbias);
// The same for flashc_kvcache, whose fields this file sets up to num_splits.
constexpr size_t KVCACHE_SIZE = offsetof(flashc_kvcache, num_splits) + sizeof(int);

[[noreturn]] void fail(const std::string &what) { throw std::runtime_error("flashc: " + what); }

// ---- options: checked and packed once per distinct set (flashc_torch_options), named by their index ----------
struct Options {
  flashc_params params; // scale ... softcap set; a varlen call fills in its cu_seqlens
  const char *backend;  // interned: one address per name, so that a handle's lookup compares addresses
  int64_t threads;      // -1: torch.get_num_threads() at each call
};
// A model uses a few sets; the bound keeps the table a fixed array that the operators read without a lock (an
// entry is written once, before its index is handed out, and never freed). Past it flashc.torch uses ctypes.
constexpr int64_t MAX_OPTIONS = 4096;
std::atomic<const Options *> options_table[MAX_OPTIONS];
std::mutex options_mutex; // serialises flashc_torch_options
int64_t options_count = 0;

const Options &options_of(int64_t id) {
  const Options *o = id >= 0 && id < MAX_OPTIONS ? options_table[id].load(std::memory_order_acquire) : nullptr;
  if (!o) fail("options " + std::to_string(id) + " were not made by flashc_torch_options");
  return *o;
}

// ---- CUDA, through what torch has loaded -------------------------------------------------------------------
// The current stream comes from the AOTInductor shim of libtorch_cuda (the stable ABI of torch 2.10 has no
// native stream handle); whether it is capturing a CUDA graph, from the driver. Both are looked up once, so that
// this library needs neither at link time and loads into a CPU-only torch as well.
using CurrentStreamFn = AOTITorchError (*)(int32_t, void **);
using IsCapturingFn = int (*)(void *, int *); // cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*)

void *symbol(const char *library, const char *name) {
  void *lib = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
  return lib ? dlsym(lib, name) : nullptr;
}

void *current_stream(int32_t device) {
  static const auto fn =
      reinterpret_cast<CurrentStreamFn>(symbol("libtorch_cuda.so", "aoti_torch_get_current_cuda_stream"));
  void *stream = nullptr;
  if (!fn || fn(device, &stream) != AOTI_TORCH_SUCCESS) fail("cannot read torch's current CUDA stream");
  return stream;
}

// The driver's calls need a current context, which a thread that has made no CUDA runtime call yet lacks: torch's
// autograd threads select their device without making its context current, so the first backward on such a thread
// would read "invalid context" (compute-sanitizer reports it). That thread gets the device's primary context, the
// one torch and libflashc's runtime calls use, as the runtime would make it current on its first call.
bool context_current(int32_t device) {
  using GetCurrentFn = int (*)(void **);         // cuCtxGetCurrent(CUcontext*)
  using SetCurrentFn = int (*)(void *);          // cuCtxSetCurrent(CUcontext)
  using DeviceGetFn = int (*)(int *, int);       // cuDeviceGet(CUdevice*, int ordinal)
  using PrimaryRetainFn = int (*)(void **, int); // cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)
  static const auto get = reinterpret_cast<GetCurrentFn>(symbol("libcuda.so.1", "cuCtxGetCurrent"));
  static const auto set = reinterpret_cast<SetCurrentFn>(symbol("libcuda.so.1", "cuCtxSetCurrent"));
  static const auto device_get = reinterpret_cast<DeviceGetFn>(symbol("libcuda.so.1", "cuDeviceGet"));
  static const auto retain = reinterpret_cast<PrimaryRetainFn>(symbol("libcuda.so.1", "cuDevicePrimaryCtxRetain"));
  void *ctx = nullptr;
  if (!get || !set || !device_get || !retain || get(&ctx) != 0) return false;
  if (ctx) return true;
  int dev = 0;
  // The retained reference is kept: the primary context lives as long as the process's runtime holds it anyway.
  return device_get(&dev, device) == 0 && retain(&ctx, dev) == 0 && set(ctx) == 0;
}

bool capturing(void *stream, int32_t device) {
  static const auto fn = reinterpret_cast<IsCapturingFn>(symbol("libcuda.so.1", "cuStreamIsCapturing"));
  int status = 0;
  if (!fn || !context_current(device) || fn(stream, &status) != 0) return true; // cannot tell: the Python path decides
  return status != 0;
}

// ---- handles: one per thread, backend, device and stream (as flashc/_ops.py keeps them) --------------------
struct Handle {
  const char *backend; // interned (Options::backend)
  int32_t device;      // -1: the CPU
  void *stream;
  flashc_handle h;
  int threads; // the count last set on h; -1 before any
};

struct Handles {
  std::vector<Handle> list;
  ~Handles() {
    for (Handle &x : list) api.destroy(x.h);
  }
};
thread_local Handles handles;
// Where this thread's Python side reads the backend its last call ran (flashc_torch_set_slot): a name in
// libflashc's backend table, whose address names the backend. Read as memory, it costs the hot path no call.
thread_local const char **last_backend_slot = nullptr;
constexpr size_t MAX_HANDLES = 16; // per thread: streams come and go; each handle holds a workspace

Handle &handle(const char *backend, int32_t device, void *stream) {
  for (Handle &x : handles.list)
    if (x.backend == backend && x.device == device && x.stream == stream) return x;
  // A new handle allocates its device workspace on its first call, which a CUDA graph capture forbids; the
  // Python path raises the error that says what to do.
  if (device >= 0 && capturing(stream, device)) fail("first call on a capturing stream");
  flashc_handle h = nullptr;
  if (api.create(&h, backend) != FLASHC_OK) fail(api.last_error());
  if (device >= 0 && api.set_stream(h, stream) != FLASHC_OK) {
    api.destroy(h);
    fail(api.last_error());
  }
  if (handles.list.size() >= MAX_HANDLES) {
    api.destroy(handles.list.front().h);
    handles.list.erase(handles.list.begin());
  }
  handles.list.push_back(Handle{backend, device, stream, h, -1});
  return handles.list.back();
}

// ---- tensors -----------------------------------------------------------------------------------------------
struct Place {
  bool cuda;
  int32_t device; // -1 on the CPU
};

Place place_of(const Tensor &x) {
  if (x.is_cpu()) return {false, -1};
  if (x.is_cuda()) return {true, x.get_device_index()};
  fail("tensors on a device other than cpu and cuda");
}

flashc_dtype dtype_of(const Tensor &x) {
  switch (x.scalar_type()) {
  case ScalarType::Float: return FLASHC_F32;
  case ScalarType::Half: return FLASHC_F16;
  case ScalarType::BFloat16: return FLASHC_BF16;
  case ScalarType::Double: return FLASHC_F64;
  default: fail("a dtype flashc does not take");
  }
}

// x, or a copy with a unit head_dim stride (the one layout rule of the C API that a view can break).
Tensor readable(const Tensor &x, int64_t ndim) {
  if (x.dim() != ndim) fail("a tensor of the wrong rank");
  return x.stride(ndim - 1) == 1 ? x : torch::stable::contiguous(x);
}

// x as flashc_tensor, checked to live where q does. Packed [total, heads, dim] tensors are one batch entry.
flashc_tensor describe(const Tensor &x, const Place &where) {
  const Place p = place_of(x);
  if (p.cuda != where.cuda || p.device != where.device) fail("tensors on different devices");
  flashc_tensor t;
  t.data = x.data_ptr();
  t.dtype = dtype_of(x);
  const auto size = x.sizes(), stride = x.strides(); // one shim call each, not one per dimension
  if (size.size() == 3) {
    t.size[0] = 1;
    t.stride[0] = 0;
    for (int d = 0; d < 3; d++) {
      t.size[d + 1] = size[d];
      t.stride[d + 1] = stride[d];
    }
  } else {
    for (int d = 0; d < 4; d++) {
      t.size[d] = size[d];
      t.stride[d] = stride[d];
    }
  }
  return t;
}

// A [b, s, h, d] tensor that the call uses where it is, never copied: a KV cache (written in place by an append)
// or out=. A layout the C API cannot take is refused, and so is an empty tensor, whose pointer and strides the
// Python path describes in its own way (NULL, contiguous).
flashc_tensor in_place(const Tensor &x, const Place &where) {
  if (x.dim() != 4 || x.numel() == 0) fail("an empty tensor, or one of the wrong rank, to use in place");
  if (x.sizes()[3] > 1 && x.stride(3) != 1) fail("a tensor whose head_dim stride is not 1, to use in place");
  return describe(x, where);
}

// cache_seqlens [batch] or block_table [batch, max_blocks]: int32 where q is, rows of unit stride. The C API
// reads them through a bare pointer, so their sizes are checked here (the library cannot see them).
const int32_t *int32_table(const Tensor &x, int64_t ndim, int64_t batch, const Place &where) {
  const Place p = place_of(x);
  if (p.cuda != where.cuda || p.device != where.device) fail("tensors on different devices");
  if (x.scalar_type() != ScalarType::Int || x.dim() != ndim || x.numel() == 0) fail("a table that is not int32");
  const auto size = x.sizes();
  if (size[0] != batch || (size[ndim - 1] > 1 && x.stride(ndim - 1) != 1)) fail("a table of the wrong shape");
  return static_cast<const int32_t *>(x.data_ptr());
}

// Sizes of at most 4 dimensions, without a heap allocation.
struct Sizes {
  int64_t n;
  int64_t v[4];
};

// A new contiguous tensor of these sizes on `where` (aoti_torch_empty_strided: no dispatcher lookup).
Tensor empty(const Sizes &sizes, int32_t dtype, const Place &where) {
  int64_t strides[4];
  int64_t s = 1;
  for (int64_t d = sizes.n; d-- > 0;) {
    strides[d] = s;
    s *= sizes.v[d];
  }
  AtenTensorHandle out = nullptr;
  const int32_t type = where.cuda ? aoti_torch_device_type_cuda() : aoti_torch_device_type_cpu();
  if (aoti_torch_empty_strided(sizes.n, sizes.v, strides, dtype, type, where.cuda ? where.device : 0, &out) !=
      AOTI_TORCH_SUCCESS)
    fail("an output could not be allocated");
  return Tensor(out);
}

int32_t torch_dtype(const Tensor &x) {
  int32_t code = 0;
  if (aoti_torch_get_dtype(x.get(), &code) != AOTI_TORCH_SUCCESS) fail("cannot read a dtype");
  return code;
}

Sizes lse_sizes(const Tensor &q, bool packed) {
  const auto size = q.sizes();
  if (packed) return {2, {size[1], size[0]}};
  return {3, {size[0], size[2], size[1]}};
}

Sizes sizes_of(const Tensor &x) {
  const auto size = x.sizes();
  Sizes s{static_cast<int64_t>(size.size()), {}};
  for (int64_t d = 0; d < s.n; d++) s.v[d] = size[d];
  return s;
}

// The parameters of one call: the options' with cu_q/cu_k (int32 offsets, kept alive by the caller): on the host,
// or beside CUDA tensors on their device with the longest sequences max_q/max_k, 0 where not known: then the packed
// rows of q / k bound them, as flashc.torch's Python path does (flashc_params.cu_seqlens_device: nothing is read on
// the host, so the call waits for nothing and can be captured in a CUDA graph).
flashc_params params_of(const Options &o, const Place &where, const std::optional<Tensor> &cu_q,
                        const std::optional<Tensor> &cu_k, int64_t max_q, int64_t max_k, const Tensor &q,
                        const Tensor &k) {
  flashc_params p = o.params;
  if (cu_q.has_value() != cu_k.has_value()) fail("varlen needs both cu_seqlens");
  if (cu_q) {
    const bool device = where.cuda && !cu_q->is_cpu();
    for (const Tensor *cu : {&*cu_q, &*cu_k}) {
      const Place at = place_of(*cu);
      const bool placed = device ? at.cuda && at.device == where.device : cu->is_cpu();
      if (!placed || cu->scalar_type() != ScalarType::Int || cu->dim() != 1 || cu->stride(0) != 1)
        fail("cu_seqlens that are not int32 vectors on the host or on the tensors' device");
    }
    if (cu_q->numel() != cu_k->numel() || cu_q->numel() < 2) fail("cu_seqlens of different lengths");
    p.cu_seqlens_q = static_cast<const int32_t *>(cu_q->data_ptr());
    p.cu_seqlens_k = static_cast<const int32_t *>(cu_k->data_ptr());
    p.num_seqs = cu_q->numel() - 1;
    if (device) {
      p.struct_size = PARAMS_SIZE_DEVICE_OFFSETS;
      p.cu_seqlens_device = 1;
      p.max_seqlen_q = max_q > 0 ? max_q : q.sizes()[0];
      p.max_seqlen_k = max_k > 0 ? max_k : k.sizes()[0];
    }
  }
  return p;
}

// ALiBi slopes and attn_mask into p, as the Python path describes them (flashc/_ops.py's _extras, _api.py's
// check_alibi_shape and attn_mask_view). q: [b, s_q, h_q, d] (packed: [total_q, h_q, d]); k: [b, s_k, h_k, d];
// alibi: fp32 [h_q] (alibi_stride_batch 0) or [b, h_q] (b = num_seqs when packed; stride h_q); mask: bool (read as
// uint8) or of q's dtype, its shape right-aligned against [b, h_q, s_q, s_k], each dimension 1 or the full size, the
// stride of a dimension of size 1 given as 0. What the Python path would convert (slopes of another dtype, device or
// layout; a mask of another dtype or device) is refused here, so that it runs there: the copies are its, and so are
// its errors. The C API reads both through bare pointers, so their shapes are checked here: it cannot see them.
void set_modifiers(flashc_params &p, const std::optional<Tensor> &alibi, const std::optional<Tensor> &mask,
                   const Tensor &q, const Tensor &k, bool packed, const Place &where) {
  if (!alibi && !mask) return;
  if (p.struct_size < PARAMS_SIZE_MODIFIERS) p.struct_size = PARAMS_SIZE_MODIFIERS;
  const auto qsize = q.sizes();
  if (alibi) {
    const Place at = place_of(*alibi);
    if (alibi->scalar_type() != ScalarType::Float || at.cuda != where.cuda || at.device != where.device ||
        !alibi->is_contiguous())
      fail("alibi_slopes that are not contiguous float32 on q's device");
    const int64_t heads = qsize[packed ? 1 : 2], batch = packed ? p.num_seqs : qsize[0];
    const auto size = alibi->sizes();
    if (size.size() == 1 && size[0] == heads)
      p.alibi_stride_batch = 0;
    else if (size.size() == 2 && size[0] == batch && size[1] == heads)
      p.alibi_stride_batch = heads;
    else
      fail("alibi_slopes of the wrong shape");
    p.alibi_slopes = static_cast<const float *>(alibi->data_ptr());
  }
  if (mask) {
    if (packed) fail("an attn_mask with packed tensors");
    const Place at = place_of(*mask);
    if (at.cuda != where.cuda || at.device != where.device) fail("an attn_mask that is not on q's device");
    const bool is_bool = mask->scalar_type() == ScalarType::Bool;
    if (!is_bool && mask->scalar_type() != q.scalar_type()) fail("an attn_mask neither bool nor of q's dtype");
    const int64_t full[4] = {qsize[0], qsize[2], qsize[1], k.sizes()[1]};
    const auto size = mask->sizes(), stride = mask->strides();
    const int64_t n = static_cast<int64_t>(size.size());
    if (n < 2 || n > 4) fail("an attn_mask of the wrong rank");
    for (int64_t d = 0; d < 4; d++) {
      const int64_t m = d - (4 - n); // the mask's dimension, < 0 where a 1 is prepended
      const int64_t s = m >= 0 ? size[m] : 1;
      if (s != 1 && s != full[d]) fail("an attn_mask that does not broadcast to [batch, heads_q, seqlen_q, seqlen_k]");
      p.attn_mask_stride[d] = s > 1 ? stride[m] : 0;
    }
    p.attn_mask = mask->numel() ? mask->data_ptr() : nullptr; // an empty mask: NULL, as the Python path passes it
    p.attn_mask_is_bool = is_bool;
  }
}

// Runs fn(handle) on the handle for (backend, q's device, the current stream), with the thread count set.
template <class Fn> void run(const Place &where, const Options &o, Fn fn) {
  if (!api.forward) fail("the extension is not bound to libflashc (flashc_torch_bind)");
  void *stream = where.cuda ? current_stream(where.device) : nullptr;
  Handle &h = handle(o.backend, where.device, stream);
  const int n = o.threads >= 0 ? static_cast<int>(o.threads) : static_cast<int>(torch::stable::get_num_threads());
  if (n != h.threads) {
    if (api.set_threads(h.h, n) != FLASHC_OK) fail(api.last_error());
    h.threads = n;
  }
  flashc_status s;
  if (where.cuda && torch::stable::accelerator::getCurrentDeviceIndex() != where.device) {
    torch::stable::accelerator::DeviceGuard guard(where.device); // libflashc works on the current device
    s = fn(h.h);
  } else {
    s = fn(h.h);
  }
  if (s != FLASHC_OK) fail(api.last_error());
  if (last_backend_slot) *last_backend_slot = api.last_backend(h.h);
}

// ---- the operators -----------------------------------------------------------------------------------------
std::tuple<Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, std::optional<Tensor> cu_q, std::optional<Tensor> cu_k,
                               int64_t options, int64_t max_q, int64_t max_k, std::optional<Tensor> alibi,
                               std::optional<Tensor> mask) {
  // q: [b, s_q, h_q, d] (packed: [total_q, h_q, d]); k: [b, s_k, h_k, d]; v: [b, s_k, h_k, d_v];
  // alibi: [h_q] or [b, h_q]; mask: broadcastable to [b, h_q, s_q, s_k]
  const bool packed = cu_q.has_value();
  const int64_t nd = packed ? 3 : 4;
  q = readable(q, nd);
  k = readable(k, nd);
  v = readable(v, nd);
  const Options &o = options_of(options);
  const Place where = place_of(q);
  flashc_params p = params_of(o, where, cu_q, cu_k, max_q, max_k, q, k);
  set_modifiers(p, alibi, mask, q, k, packed, where);
  Sizes osize = sizes_of(q);
  osize.v[nd - 1] = v.sizes()[nd - 1]; // o takes V's head dim
  Tensor out = empty(osize, torch_dtype(q), where);
  Tensor lse = empty(lse_sizes(q, packed), aoti_torch_dtype_float32(), where);
  flashc_tensor tq = describe(q, where), tk = describe(k, where), tv = describe(v, where), to = describe(out, where);
  float *plse = static_cast<float *>(lse.data_ptr());
  run(where, o, [&](flashc_handle h) { return api.forward(h, &p, &tq, &tk, &tv, &to, plse); });
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                                       std::optional<Tensor> cu_q, std::optional<Tensor> cu_k, int64_t options,
                                       int64_t max_q, int64_t max_k, std::optional<Tensor> alibi,
                                       std::optional<Tensor> mask) {
  const bool packed = cu_q.has_value();
  const int64_t nd = packed ? 3 : 4;
  q = readable(q, nd);
  k = readable(k, nd);
  v = readable(v, nd);
  out = readable(out, nd);
  dout = readable(dout, nd);
  const Options &o = options_of(options);
  const Place where = place_of(q);
  const Sizes want = lse_sizes(q, packed);
  const Place lse_at = place_of(lse);
  if (lse.scalar_type() != ScalarType::Float || lse.dim() != want.n || lse_at.cuda != where.cuda ||
      lse_at.device != where.device)
    fail("an lse that is not the forward's");
  const auto lse_size = lse.sizes();
  for (int64_t d = 0; d < want.n; d++)
    if (lse_size[d] != want.v[d]) fail("an lse that is not the forward's");
  if (!lse.is_contiguous()) lse = torch::stable::contiguous(lse);
  flashc_params p = params_of(o, where, cu_q, cu_k, max_q, max_k, q, k);
  set_modifiers(p, alibi, mask, q, k, packed, where);
  const int32_t dtype = torch_dtype(q); // libflashc checks that k, v, out and dout share it
  Tensor dq = empty(sizes_of(q), dtype, where), dk = empty(sizes_of(k), dtype, where),
         dv = empty(sizes_of(v), dtype, where);
  flashc_tensor tq = describe(q, where), tk = describe(k, where), tv = describe(v, where), to = describe(out, where);
  flashc_tensor tdo = describe(dout, where), tdq = describe(dq, where), tdk = describe(dk, where),
                tdv = describe(dv, where);
  const float *plse = static_cast<const float *>(lse.data_ptr());
  run(where, o, [&](flashc_handle h) { return api.backward(h, &p, &tq, &tk, &tv, &to, plse, &tdo, &tdq, &tdk, &tdv); });
  return {dq, dk, dv};
}

// flashc_forward_kvcache: the cache tensors are written in place when k and v are given. Returns (out, or None
// when out= was given and written; lse, or None when not wanted).
std::tuple<std::optional<Tensor>, std::optional<Tensor>>
kvcache(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k_new, std::optional<Tensor> v_new,
        std::optional<Tensor> cache_seqlens, std::optional<Tensor> block_table, std::optional<Tensor> out,
        int64_t options, int64_t num_splits, bool want_lse) {
  // q, out: [b, s_q, h_q, d]; k_cache, v_cache: [b, capacity, h_k, d] or [num_blocks, page_size, h_k, d];
  // k_new, v_new: [b, s_new, h_k, d]; cache_seqlens: [b]; block_table: [b, max_blocks]
  if (!api.forward_kvcache) fail("this libflashc has no flashc_forward_kvcache");
  q = readable(q, 4);
  if (q.numel() == 0) fail("an empty q");
  const Options &o = options_of(options);
  const Place where = place_of(q);
  const Sizes qsize = sizes_of(q);
  flashc_kvcache c = flashc_kvcache_default();
  c.struct_size = KVCACHE_SIZE;
  c.k_cache = in_place(k_cache, where);
  c.v_cache = in_place(v_cache, where);
  flashc_tensor tk, tv;
  if (k_new.has_value() != v_new.has_value()) fail("k and v given apart");
  if (k_new) {
    *k_new = readable(*k_new, 4);
    *v_new = readable(*v_new, 4);
    if (k_new->numel() == 0 || v_new->numel() == 0) fail("an empty k or v");
    tk = describe(*k_new, where);
    tv = describe(*v_new, where);
    c.k_new = &tk;
    c.v_new = &tv;
  }
  if (cache_seqlens) c.cache_seqlens = int32_table(*cache_seqlens, 1, qsize.v[0], where);
  if (block_table) {
    c.block_table = int32_table(*block_table, 2, qsize.v[0], where);
    c.max_blocks_per_seq = block_table->sizes()[1];
    c.block_table_stride = block_table->stride(0);
  }
  if (num_splits < 0 || num_splits > INT32_MAX) fail("num_splits out of range");
  c.num_splits = static_cast<int>(num_splits);
  const int32_t dtype = torch_dtype(q);
  std::optional<Tensor> fresh;
  if (out) {
    if (out->dim() != 4) fail("an out= that is not q's shape"); // before sizes_of, which holds 4 sizes
    const Sizes osize = sizes_of(*out);
    if (torch_dtype(*out) != dtype || std::memcmp(osize.v, qsize.v, sizeof qsize.v) != 0)
      fail("an out= that is not q's shape and dtype");
  } else {
    fresh = empty(qsize, dtype, where);
  }
  flashc_tensor tq = describe(q, where), to = in_place(out ? *out : *fresh, where);
  std::optional<Tensor> lse;
  if (want_lse) lse = empty(lse_sizes(q, false), aoti_torch_dtype_float32(), where);
  float *plse = lse ? static_cast<float *>(lse->data_ptr()) : nullptr;
  const flashc_params p = o.params;
  run(where, o, [&](flashc_handle h) { return api.forward_kvcache(h, &tq, &c, &to, plse, &p); });
  return {fresh, lse};
}

} // namespace

// ---- registration ------------------------------------------------------------------------------------------
STABLE_TORCH_LIBRARY(flashc_ext, m) {
  // alibi_slopes and attn_mask come last, with defaults: a caller of the schemas without them keeps working.
  m.def("fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int options, "
        "int max_seqlen_q=0, int max_seqlen_k=0, Tensor? alibi_slopes=None, Tensor? attn_mask=None) "
        "-> (Tensor, Tensor)");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? cu_seqlens_q, "
        "Tensor? cu_seqlens_k, int options, int max_seqlen_q=0, int max_seqlen_k=0, Tensor? alibi_slopes=None, "
        "Tensor? attn_mask=None) -> (Tensor, Tensor, Tensor)");
  m.def("kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? cache_seqlens, "
        "Tensor? block_table, Tensor(c!)? out, int options, int num_splits, bool want_lse) -> (Tensor?, Tensor?)");
}

STABLE_TORCH_LIBRARY_IMPL(flashc_ext, CPU, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
  m.impl("kvcache", TORCH_BOX(&kvcache));
}

STABLE_TORCH_LIBRARY_IMPL(flashc_ext, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
  m.impl("kvcache", TORCH_BOX(&kvcache));
}

// ---- plain C entry points, called once through ctypes ------------------------------------------------------
extern "C" {

// Binds the operators to the libflashc at `path` (the one flashc._lib loaded). 0 on success; else -1 with
// dlerror()'s words in *why.
__attribute__((visibility("default"))) int flashc_torch_bind(const char *path, const char **why) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why = dlerror();
    return -1;
  }
  Api a;
  const char *missing = nullptr;
  auto get = [&](auto &fn, const char *name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && !missing) missing = name;
  };
  get(a.create, "flashc_create");
  get(a.destroy, "flashc_destroy");
  get(a.set_threads, "flashc_set_threads");
  get(a.set_stream, "flashc_set_stream");
  get(a.last_backend, "flashc_handle_last_backend");
  get(a.forward, "flashc_forward");
  get(a.backward, "flashc_backward");
  get(a.last_error, "flashc_last_error");
  if (missing) {
    *why = missing;
    return -1;
  }
  a.forward_kvcache = reinterpret_cast<decltype(a.forward_kvcache)>(dlsym(lib, "flashc_forward_kvcache"));
  api = a;
  return 0;
}

// The number the operators take for these options (the arguments of flashc::fwd from scale to softcap, checked by
// flashc.torch; scale 0: 1/sqrt(head_dim); threads -1: torch's count at each call), the same number for the same
// options; -1 when MAX_OPTIONS sets are taken.
__attribute__((visibility("default"))) int64_t flashc_torch_options(double scale, int causal, int64_t window_left,
                                                                    int64_t window_right, int top_left,
                                                                    const char *backend, int64_t threads,
                                                                    int deterministic, double softcap) {
  flashc_params p = flashc_params_default();
  p.struct_size = PARAMS_SIZE;
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.align = top_left ? FLASHC_ALIGN_TOP_LEFT : FLASHC_ALIGN_BOTTOM_RIGHT;
  p.window_left = window_left;
  p.window_right = window_right;
  p.deterministic = deterministic;
  p.softcap = static_cast<float>(softcap);
  std::lock_guard<std::mutex> lock(options_mutex);
  const char *name = nullptr;
  for (int64_t i = 0; i < options_count; i++) {
    const Options &o = *options_table[i].load(std::memory_order_relaxed);
    if (std::strcmp(o.backend, backend) != 0) continue;
    name = o.backend;
    const flashc_params &q = o.params;
    if (o.threads == threads && q.scale == p.scale && q.causal == p.causal && q.align == p.align &&
        q.window_left == p.window_left && q.window_right == p.window_right && q.deterministic == p.deterministic &&
        q.softcap == p.softcap)
      return i;
  }
  if (options_count == MAX_OPTIONS) return -1;
  if (!name) name = (new std::string(backend))->c_str(); // interned for the process's life, as the entry
  options_table[options_count].store(new Options{p, name, threads}, std::memory_order_release);
  return options_count++;
}

// The CPU thread count set on this thread's host handle for `backend` (the stream-less one), -1 if it has none:
// what the Python path's handle cache shows, for tests.
__attribute__((visibility("default"))) int flashc_torch_host_threads(const char *backend) {
  for (const Handle &x : handles.list)
    if (x.device < 0 && std::strcmp(x.backend, backend) == 0) return x.threads;
  return -1;
}

// Sets this thread's slot for the name of the backend each successful operator call runs (NULL: none).
__attribute__((visibility("default"))) void flashc_torch_set_slot(const char **slot) { last_backend_slot = slot; }
}
