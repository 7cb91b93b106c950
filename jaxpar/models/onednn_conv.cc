// oneDNN's convolution as three XLA FFI handlers for JAX's CPU backend: the forward pass,
// the input gradient and the kernel gradient of a 2-D convolution of an NHWC input with
// an HWIO kernel (no dilation, no groups), float32 or bfloat16. jaxpar/models/onednn.py
// compiles this file against the running jaxlib's FFI headers and the oneDNN wheel's
// library, registers the handlers and wraps them as `conv_onednn` (with its VJP).
//
// Nothing here computes a convolution: each handler describes the convolution to oneDNN,
// lets it pick its memory layouts (format_tag::any: the kernel's always, the activations'
// for the gradients; the forward pass reads and writes NHWC itself, measured faster here
// than reordering into blocked layouts and back), reorders JAX's row-major arrays into
// those layouts and the result back, and runs oneDNN's primitive. Primitives and reorders
// are made once per geometry (the map below): JAX calls a handler once per convolution per
// step with the same shapes.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;
using tag = dnnl::memory::format_tag;

namespace {

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

enum Pass { kForward = 0, kInputGrad = 1, kKernelGrad = 2 };

// A convolution's geometry, from the arrays JAX passes: x (N, H, W, C), w (KH, KW, C, D),
// y (N, OH, OW, D); strides (2) and padding (top, bottom, left, right).
struct Geometry {
  memory::dims x, w, y, strides, pad_l, pad_r;
  memory::data_type type;
  bool operator<(const Geometry& o) const {
    return std::tie(x, w, y, strides, pad_l, pad_r, type) <
           std::tie(o.x, o.w, o.y, o.strides, o.pad_l, o.pad_r, o.type);
  }
};

// oneDNN's logical dims are (N, C, H, W) and (O, I, KH, KW) whatever the physical layout.
memory::desc XDesc(const Geometry& g, tag t) {
  return memory::desc({g.x[0], g.x[3], g.x[1], g.x[2]}, g.type, t);
}
memory::desc WDesc(const Geometry& g, tag t) {
  return memory::desc({g.w[3], g.w[2], g.w[0], g.w[1]}, g.type, t);
}
memory::desc YDesc(const Geometry& g, tag t) {
  return memory::desc({g.y[0], g.y[3], g.y[1], g.y[2]}, g.type, t);
}

// One pass of one geometry: the primitive, and the layouts it reads and writes; reorders
// between JAX's layouts (nhwc, hwio) and those where they differ.
struct Plan {
  dnnl::primitive primitive;
  memory::desc a, b, out;        // the primitive's two inputs and its output, its layouts
  memory::desc a_user, b_user, out_user;
  int a_arg, b_arg, out_arg;
  memory::desc scratchpad;
  // Reorders where a layout differs from JAX's (made once: a reorder's primitive descriptor
  // costs tens of microseconds, a small convolution's whole time).
  std::optional<dnnl::reorder> to_a, to_b, from_out;
};

std::optional<dnnl::reorder> Reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// Every primitive takes its scratchpad from the caller (`Run`: per thread), so that devices
// calling at once never share one.
dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

dnnl::convolution_forward::primitive_desc ForwardDesc(const Geometry& g) {
  return dnnl::convolution_forward::primitive_desc(
      Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
      XDesc(g, tag::nhwc), WDesc(g, tag::any), YDesc(g, tag::nhwc), g.strides, g.pad_l,
      g.pad_r, UserScratchpad());
}

// A gradient's descriptor (backward data or weights: the same arguments, x, w, y in that
// order), its layouts left to oneDNN.
template <class Desc>
Desc BackwardDesc(const Geometry& g, const dnnl::convolution_forward::primitive_desc& fwd) {
  return Desc(Engine(), dnnl::algorithm::convolution_direct, XDesc(g, tag::any),
              WDesc(g, tag::any), YDesc(g, tag::any), g.strides, g.pad_l, g.pad_r, fwd,
              UserScratchpad());
}

// The plan of a primitive of descriptor `pd` that reads arguments a and b and writes `out`,
// each given as (oneDNN's argument, JAX's layout of it): the primitive's own layouts are
// asked of the descriptor by argument.
template <class Primitive, class Desc>
Plan Finish(const Desc& pd, std::pair<int, memory::desc> a, std::pair<int, memory::desc> b,
            std::pair<int, memory::desc> out) {
  Plan p;
  p.primitive = Primitive(pd);
  std::tie(p.a_arg, p.a_user) = a;
  std::tie(p.b_arg, p.b_user) = b;
  std::tie(p.out_arg, p.out_user) = out;
  p.a = pd.query_md(dnnl::query::exec_arg_md, p.a_arg);
  p.b = pd.query_md(dnnl::query::exec_arg_md, p.b_arg);
  p.out = pd.query_md(dnnl::query::exec_arg_md, p.out_arg);
  p.scratchpad = pd.scratchpad_desc();
  p.to_a = Reorder(p.a_user, p.a);
  p.to_b = Reorder(p.b_user, p.b);
  p.from_out = Reorder(p.out, p.out_user);
  return p;
}

Plan MakePlan(Pass pass, const Geometry& g) {
  auto fwd = ForwardDesc(g);
  const memory::desc x = XDesc(g, tag::nhwc), w = WDesc(g, tag::hwio), y = YDesc(g, tag::nhwc);
  if (pass == kForward) {
    return Finish<dnnl::convolution_forward>(fwd, {DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w},
                                             {DNNL_ARG_DST, y});
  }
  if (pass == kInputGrad) {
    return Finish<dnnl::convolution_backward_data>(
        BackwardDesc<dnnl::convolution_backward_data::primitive_desc>(g, fwd),
        {DNNL_ARG_DIFF_DST, y}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, x});
  }
  return Finish<dnnl::convolution_backward_weights>(
      BackwardDesc<dnnl::convolution_backward_weights::primitive_desc>(g, fwd),
      {DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, y}, {DNNL_ARG_DIFF_WEIGHTS, w});
}

// A plan is made for the OpenMP team that runs it (`threads`: oneDNN sizes a primitive's
// work split and scratchpad by the calling thread's omp_get_max_threads() when it is made).
const Plan& GetPlan(Pass pass, const Geometry& g, int threads) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, Geometry>, std::unique_ptr<Plan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = plans[{pass, threads, g}];
  if (!slot) slot = std::make_unique<Plan>(MakePlan(pass, g));
  return *slot;
}

// Per-thread working memory, grown to the largest need and kept: the reordered inputs and
// output, and the primitive's scratchpad (user-managed, so that devices calling at once each
// have their own). Allocated afresh each call, large buffers were mapped and faulted in
// again every step.
struct Buffers {
  std::vector<char> slot[4];
  void* Get(int i, size_t bytes) {
    if (slot[i].size() < bytes) slot[i].resize(bytes);
    return slot[i].data();
  }
};

// The memory the primitive reads or writes: the user's array itself where the layouts
// agree, else a buffer in the primitive's layout.
memory Staged(const memory::desc& want, const memory::desc& user, void* data, Buffers& buffers,
              int slot) {
  if (want == user) return memory(user, Engine(), data);
  return memory(want, Engine(), buffers.Get(slot, want.get_size()));
}

// OpenMP threads per call. Each thread that calls oneDNN leads its own OpenMP team of
// omp_get_max_threads() = T threads, and the devices of a mesh in one process (emulated
// CPU devices) run their steps at once, each on its own thread: 8 devices calling at once
// on 2 cores were 16 threads meeting at barriers. Each call carries `callers`, the process's
// CPU devices (jaxpar/models/onednn.py), and takes max(1, T / callers) threads
// (JaxparOnednnShareThreads(0): T always). Fixed per process, not by how many calls happen
// to run at the moment: oneDNN's sums depend on its team, and a step's results must not
// depend on timing. Calls are counted by the team they ran with (JaxparOnednnCalls).
constexpr int kMaxTeam = 256;
std::atomic<bool> sharing{true};
std::atomic<long long> calls_by_team[kMaxTeam + 1];

int AllThreads() {
  static const int all = omp_get_max_threads();  // read before any call sets its own
  return all;
}

// Calls at once. XLA runs a program's independent instructions at the same time on its
// threads (an Inception module's branches; a layer's input and kernel gradients), and each
// calling thread leads its own team: on one device, two calls of T threads each are 2T
// threads on T cores meeting at barriers. JaxparOnednnGate(1) lets at most T / team calls
// run at once (the others wait for one to end), never more threads than cores; which calls
// wait changes no call's team, so no result. Off by default: on 2 cores of an Intel Xeon
// (2026-12-04) it removed GoogLeNet 32² bfloat16's tail (the ungated step's mean over 2×
// its median) but made SqueezeNet 224² bfloat16's step 11 % and ResNet34 224²'s 4 % slower
// (docs/performance.md). JaxparOnednnMostInFlight: the most calls seen at once.
std::atomic<bool> gating{false};
std::mutex gate_mutex;
std::condition_variable gate_open;
int gate_busy = 0;
std::atomic<int> in_flight{0}, most_in_flight{0};

class Gate {
 public:
  Gate(int slots) : gated_(gating.load()) {
    if (gated_) {
      std::unique_lock<std::mutex> lock(gate_mutex);
      gate_open.wait(lock, [&] { return gate_busy < slots; });
      ++gate_busy;
    }
    const int now = in_flight.fetch_add(1) + 1;
    int seen = most_in_flight.load();
    while (now > seen && !most_in_flight.compare_exchange_weak(seen, now)) {}
  }
  ~Gate() {
    in_flight.fetch_sub(1);
    if (gated_) {
      {
        std::lock_guard<std::mutex> lock(gate_mutex);
        --gate_busy;
      }
      gate_open.notify_one();
    }
  }

 private:
  const bool gated_;
};

int Team(int64_t callers) {
  const int all = AllThreads();
  int threads = sharing ? std::max<int64_t>(1, all / std::max<int64_t>(1, callers)) : all;
  calls_by_team[std::min(threads, kMaxTeam)].fetch_add(1);
  return threads;
}

ffi::Error Run(Pass pass, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> out,
               ffi::Span<const int64_t> strides, ffi::Span<const int64_t> padding,
               int64_t callers) {
  Geometry g;
  auto dims = [](ffi::AnyBuffer::Dimensions d) { return memory::dims(d.begin(), d.end()); };
  switch (a.element_type()) {
    case ffi::DataType::F32: g.type = memory::data_type::f32; break;
    case ffi::DataType::BF16: g.type = memory::data_type::bf16; break;
    default: return ffi::Error::InvalidArgument("onednn_conv: float32 or bfloat16 only");
  }
  if (pass == kForward) {
    g.x = dims(a.dimensions()), g.w = dims(b.dimensions()), g.y = dims(out->dimensions());
  } else if (pass == kInputGrad) {
    g.y = dims(a.dimensions()), g.w = dims(b.dimensions()), g.x = dims(out->dimensions());
  } else {
    g.x = dims(a.dimensions()), g.y = dims(b.dimensions()), g.w = dims(out->dimensions());
  }
  g.strides = memory::dims(strides.begin(), strides.end());
  g.pad_l = {padding[0], padding[2]};
  g.pad_r = {padding[1], padding[3]};
  const int threads = Team(callers);
  omp_set_num_threads(threads);  // this (XLA's) thread's team, for this call
  Gate gate(std::max(1, AllThreads() / threads));
  try {
    const Plan& p = GetPlan(pass, g, threads);
    thread_local dnnl::stream stream(Engine());
    thread_local Buffers buffers;
    memory a_user(p.a_user, Engine(), a.untyped_data());
    memory b_user(p.b_user, Engine(), b.untyped_data());
    memory out_user(p.out_user, Engine(), out->untyped_data());
    memory ma = Staged(p.a, p.a_user, a.untyped_data(), buffers, 0);
    memory mb = Staged(p.b, p.b_user, b.untyped_data(), buffers, 1);
    memory mout = Staged(p.out, p.out_user, out->untyped_data(), buffers, 2);
    // Zeroed for every call: oneDNN 3.2's bfloat16 backward-weights kernel for some geometries
    // (a 3×3 stride-2 convolution of a 1×1 map: ResNet34's stage 4 at 16²) reads scratchpad it
    // did not write, so the kernel's gradient took in what the thread's previous call left
    // there: wrong values, which call came before set by timing (docs/performance.md).
    void* scratch_data = buffers.Get(3, p.scratchpad.get_size());
    std::memset(scratch_data, 0, p.scratchpad.get_size());
    memory scratch(p.scratchpad, Engine(), scratch_data);
    if (p.to_a) p.to_a->execute(stream, a_user, ma);
    if (p.to_b) p.to_b->execute(stream, b_user, mb);
    p.primitive.execute(stream, {{p.a_arg, ma}, {p.b_arg, mb}, {p.out_arg, mout},
                                 {DNNL_ARG_SCRATCHPAD, scratch}});
    if (p.from_out) p.from_out->execute(stream, mout, out_user);
    stream.wait();
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("onednn_conv: ") + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Span<const int64_t> strides, ffi::Span<const int64_t> padding,
                   int64_t callers) {
  return Run(kForward, x, w, y, strides, padding, callers);
}
ffi::Error InputGrad(ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                     ffi::Span<const int64_t> strides, ffi::Span<const int64_t> padding,
                     int64_t callers) {
  return Run(kInputGrad, dy, w, dx, strides, padding, callers);
}
ffi::Error KernelGrad(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw,
                      ffi::Span<const int64_t> strides, ffi::Span<const int64_t> padding,
                      int64_t callers) {
  return Run(kKernelGrad, x, dy, dw, strides, padding, callers);
}

}  // namespace

// Whether oneDNN has all three passes of a convolution of `type` (0: float32, 1: bfloat16)
// on this CPU: their primitive descriptors made for one small geometry (3×3, stride 1,
// padded). oneDNN's bfloat16 convolutions need an ISA with bfloat16 support (oneDNN 3.2:
// AVX-512 or AVX2-VNNI-2); on an AVX2-only CPU every bfloat16 descriptor fails, whatever
// the geometry. Where it fails, oneDNN's message is copied into `why` (`why_size` bytes).
extern "C" int JaxparOnednnSupports(int type, char* why, int why_size) {
  Geometry g;
  g.type = type == 1 ? memory::data_type::bf16 : memory::data_type::f32;
  g.x = {2, 8, 8, 4}, g.w = {3, 3, 4, 4}, g.y = {2, 8, 8, 4};
  g.strides = {1, 1}, g.pad_l = {1, 1}, g.pad_r = {1, 1};
  try {
    for (Pass pass : {kForward, kInputGrad, kKernelGrad}) MakePlan(pass, g);
  } catch (const dnnl::error& e) {
    if (why && why_size > 0) {
      std::strncpy(why, e.what(), why_size - 1);
      why[why_size - 1] = '\0';
    }
    return 0;
  }
  return 1;
}

// The ISA oneDNN's kernels use here (dnnl_cpu_isa_t, a bit mask: dnnl_types.h).
extern "C" int JaxparOnednnIsa() { return static_cast<int>(dnnl::get_effective_cpu_isa()); }

extern "C" void JaxparOnednnShareThreads(int on) { sharing = on != 0; }
extern "C" void JaxparOnednnGate(int on) { gating = on != 0; }
extern "C" int JaxparOnednnMostInFlight(int reset) {
  return reset ? most_in_flight.exchange(0) : most_in_flight.load();
}
extern "C" int JaxparOnednnThreads() { return AllThreads(); }
extern "C" long long JaxparOnednnCalls(int threads) {
  return threads >= 0 && threads <= kMaxTeam ? calls_by_team[threads].load() : 0;
}

#define JAXPAR_BIND                                                              \
  ffi::Ffi::Bind()                                                               \
      .Arg<ffi::AnyBuffer>()                                                     \
      .Arg<ffi::AnyBuffer>()                                                     \
      .Ret<ffi::AnyBuffer>()                                                     \
      .Attr<ffi::Span<const int64_t>>("strides")                                 \
      .Attr<ffi::Span<const int64_t>>("padding")                                 \
      .Attr<int64_t>("callers")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxparOnednnConvForward, Forward, JAXPAR_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxparOnednnConvInputGrad, InputGrad, JAXPAR_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxparOnednnConvKernelGrad, KernelGrad, JAXPAR_BIND);
