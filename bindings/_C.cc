// pybind11 extension over the C-ABI (kernels/verify_attn.h).
//
// It links no torch C++ headers, so one wheel serves any torch version: the
// Python layer passes raw device pointers (tensor.data_ptr()), shapes, strides
// and the current CUDA stream as integers through `Params`.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "kernels/verify_attn.h"

namespace py = pybind11;

namespace {

// Raises the Python exception matching a non-OK status:
// TypeError (dtype), ValueError (bad argument), NotImplementedError
// (unsupported but valid), RuntimeError (no device, CUDA failure).
void raise_on_error(va_status s, const char* where) {
  if (s == VA_OK) return;
  std::string msg = std::string(where) + ": " + va_status_name(s) + ": " +
                    va_last_error_message();
  switch (s) {
    case VA_ERR_INVALID_DTYPE:
      throw py::type_error(msg);
    case VA_ERR_NULL_POINTER:
    case VA_ERR_INVALID_VALUE:
    case VA_ERR_INVALID_STRIDE:
    case VA_ERR_WORKSPACE:
    case VA_ERR_VERSION:
      throw py::value_error(msg);
    default:
      throw std::runtime_error(msg);
  }
}

[[noreturn]] void raise_not_implemented(const std::string& msg) {
  PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
  throw py::error_already_set();
}

void check(va_status s, const char* where) {
  if (s == VA_ERR_UNSUPPORTED) {
    raise_not_implemented(std::string(where) + ": " + va_status_name(s) + ": " +
                          va_last_error_message());
  }
  raise_on_error(s, where);
}

template <typename T>
uintptr_t ptr_get(T* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// A va_plan handle owned by Python (destroyed with the object).
class PlanHandle {
 public:
  PlanHandle(const va_params& p, const std::string& config, int grid_order, int early_release,
             int q_tma, int o_tma, int max_smem_bytes, int balance_splits, int pair_splits) {
    va_plan_options o;
    va_plan_options_init(&o);
    if (config.size() >= sizeof(o.config))
      throw py::value_error("options.config: a tag of at most " +
                            std::to_string(sizeof(o.config) - 1) + " characters (got '" + config +
                            "')");
    std::memcpy(o.config, config.c_str(), config.size() + 1);
    o.grid_order = grid_order;
    o.early_release = early_release;
    o.q_tma = q_tma;
    o.o_tma = o_tma;
    o.max_smem_bytes = max_smem_bytes;
    o.balance_splits = balance_splits;
    o.pair_splits = pair_splits;
    check(va_plan_create(&p, &o, &plan_), "va_plan_create");
  }
  ~PlanHandle() { va_plan_destroy(plan_); }
  PlanHandle(const PlanHandle&) = delete;
  PlanHandle& operator=(const PlanHandle&) = delete;

  // One launch: device pointers as ints (0 = NULL), the workspace, the stream.
  void run(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, uintptr_t lse, uintptr_t ws,
           size_t ws_bytes, uintptr_t stream, float k_scale, float v_scale) const {
    va_run_args r;
    va_run_args_init(&r);
    r.q = reinterpret_cast<const void*>(q);
    r.k = reinterpret_cast<const void*>(k);
    r.v = reinterpret_cast<const void*>(v);
    r.out = reinterpret_cast<void*>(out);
    r.lse = reinterpret_cast<float*>(lse);
    r.workspace = reinterpret_cast<void*>(ws);
    r.workspace_bytes = ws_bytes;
    r.stream = reinterpret_cast<void*>(stream);
    r.k_scale = k_scale;
    r.v_scale = v_scale;
    va_status s;
    {
      py::gil_scoped_release release;
      s = va_plan_run(plan_, &r);
    }
    check(s, "va_plan_run");
  }

  py::dict info() const {
    va_config_info info{};
    check(va_plan_info(plan_, &info), "va_plan_info");
    return info_dict(info);
  }

  static py::dict info_dict(const va_config_info& info) {
    py::dict d;
    d["name"] = std::string(info.name);
    d["tile_m"] = info.tile_m;
    d["tile_n"] = info.tile_n;
    d["num_warps"] = info.num_warps;
    d["num_stages"] = info.num_stages;
    d["num_splits"] = info.num_splits;
    d["smem_bytes"] = info.smem_bytes;
    d["sm_arch"] = info.sm_arch;
    d["workspace_bytes"] = info.workspace_bytes;
    d["k_tma"] = info.k_tma != 0;
    d["q_tma"] = info.q_tma != 0;
    d["o_tma"] = info.o_tma != 0;
    d["grid_rows_fastest"] = info.grid_rows_fastest != 0;
    d["split_units"] = info.split_units;
    d["pair_splits"] = info.pair_splits != 0;
    return d;
  }

 private:
  va_plan* plan_ = nullptr;
};

}  // namespace

// Every field of va_params, once: F(name) for a value, P(name, type) for a
// pointer (an int in Python, 0 = NULL). Both the attribute table of
// _C.Params and Params.set are made from it.
#define VA_PARAMS_FIELDS(F, P)                                                                   \
  F(struct_size) F(abi_version) F(dtype) F(kv_layout) F(mask_mode) F(batch_size) F(total_q)     \
  F(max_q_len) F(max_kv_len) F(num_qo_heads) F(num_kv_heads) F(head_dim_qk) F(head_dim_vo)      \
  F(v_is_k_prefix) F(sm_scale) F(kv_dtype) F(k_scale) F(v_scale)                               \
  P(q, const void*) F(q_stride_token) F(q_stride_head)                                          \
  P(k, const void*) F(k_stride_page) F(k_stride_token) F(k_stride_head)                         \
  P(v, const void*) F(v_stride_page) F(v_stride_token) F(v_stride_head)                         \
  P(out, void*) F(out_stride_token) F(out_stride_head)                                          \
  P(lse, float*) F(lse_stride_token) F(lse_stride_head)                                         \
  P(qo_indptr, const int32_t*) P(kv_indptr, const int32_t*)                                     \
  P(kv_indices, const int32_t*) P(kv_len, const int32_t*)                                       \
  F(page_size) F(num_pages) F(num_kv_rows) F(kv_slot_runs)                                      \
  P(tree_mask, const uint32_t*) F(mask_words) F(num_splits)                                     \
  P(workspace, void*) F(workspace_bytes) P(error_word, int32_t*) P(stream, void*)

// Params.set(**fields): every field of one call in one crossing of the
// binding (each attribute set is a pybind dispatch of its own: the 45 of a
// call were most of a new plan's host time).
using ParamSetter = void (*)(va_params&, py::handle);
#define VA_SET(name) \
  {#name, [](va_params& p, py::handle v) { p.name = v.cast<decltype(va_params::name)>(); }},
#define VA_SET_PTR(name, type) \
  {#name, [](va_params& p, py::handle v) { p.name = reinterpret_cast<type>(v.cast<uintptr_t>()); }},

const std::unordered_map<std::string, ParamSetter>& param_setters() {
  static const std::unordered_map<std::string, ParamSetter> setters = {VA_PARAMS_FIELDS(VA_SET, VA_SET_PTR)};
  return setters;
}

void set_params(va_params& p, const py::kwargs& fields) {
  const auto& setters = param_setters();
  for (const auto& item : fields) {
    const std::string name = py::str(item.first);
    const auto it = setters.find(name);
    if (it == setters.end()) throw py::attribute_error("Params has no field '" + name + "'");
    try {
      it->second(p, item.second);
    } catch (const py::cast_error&) {
      throw py::type_error("Params." + name + ": cannot take a " +
                           std::string(py::str(py::type::of(item.second).attr("__name__"))));
    }
  }
}

#define VA_FIELD(name) .def_readwrite(#name, &va_params::name)
#define VA_PTR_FIELD(name, type)                                              \
  .def_property(                                                             \
      #name, [](const va_params& p) { return ptr_get(p.name); },             \
      [](va_params& p, uintptr_t v) { p.name = reinterpret_cast<type>(v); })

PYBIND11_MODULE(_C, m) {
  m.doc() = "verify_attn C-ABI bindings (internal; use the verify_attn package).";

  m.attr("ABI_VERSION") = VA_ABI_VERSION;
  m.attr("DTYPE_FP16") = static_cast<int>(VA_DTYPE_FP16);
  m.attr("DTYPE_BF16") = static_cast<int>(VA_DTYPE_BF16);
  m.attr("KV_DTYPE_AS_Q") = static_cast<int>(VA_KV_DTYPE_AS_Q);
  m.attr("KV_DTYPE_FP8_E4M3") = static_cast<int>(VA_KV_DTYPE_FP8_E4M3);
  m.attr("MASK_TREE") = static_cast<int>(VA_MASK_TREE);
  m.attr("MASK_CAUSAL") = static_cast<int>(VA_MASK_CAUSAL);
  m.attr("KV_FLAT") = static_cast<int>(VA_KV_FLAT);
  m.attr("KV_PAGED") = static_cast<int>(VA_KV_PAGED);

  py::class_<va_params>(m, "Params",
                        "va_params of kernels/verify_attn.h; pointers are ints (0 = NULL).")
      .def(py::init([]() {
        va_params p;
        va_params_init(&p);
        return p;
      }))
      VA_PARAMS_FIELDS(VA_FIELD, VA_PTR_FIELD)
      .def("set", &set_params,
           "Set the named fields in one call (pointers as ints); AttributeError for a name that is "
           "not a field, TypeError for a value of the wrong type.");

  m.def(
      "attention",
      [](const va_params& p) {
        va_status s;
        {
          py::gil_scoped_release release;
          s = va_attention(&p);
        }
        check(s, "va_attention");
      },
      py::arg("params"), "Launch tree-verify attention (asynchronous, on params.stream).");

  m.def(
      "workspace_size",
      [](const va_params& p) {
        size_t bytes = 0;
        check(va_workspace_size(&p, &bytes), "va_workspace_size");
        return bytes;
      },
      py::arg("params"), "Workspace bytes va_attention needs for params.");

  m.def(
      "query_config",
      [](const va_params& p) {
        va_config_info info{};
        check(va_query_config(&p, &info), "va_query_config");
        return PlanHandle::info_dict(info);
      },
      py::arg("params"), "The kernel configuration va_attention would run.");

  m.attr("AUTO") = static_cast<int>(VA_AUTO);
  m.attr("ON") = static_cast<int>(VA_ON);
  m.attr("OFF") = static_cast<int>(VA_OFF);
  m.attr("GRID_AUTO") = static_cast<int>(VA_GRID_AUTO);
  m.attr("GRID_ROWS") = static_cast<int>(VA_GRID_ROWS);
  m.attr("GRID_REQUESTS") = static_cast<int>(VA_GRID_REQUESTS);

  py::class_<PlanHandle>(m, "Plan",
                         "va_plan of kernels/verify_attn.h: planned once per batch, run per layer.")
      .def(py::init<const va_params&, const std::string&, int, int, int, int, int, int, int>(),
           py::arg("params"), py::arg("config") = "", py::arg("grid_order") = 0,
           py::arg("early_release") = 0, py::arg("q_tma") = 0, py::arg("o_tma") = 0,
           py::arg("max_smem_bytes") = 0, py::arg("balance_splits") = 0, py::arg("pair_splits") = 0)
      .def("run", &PlanHandle::run, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("lse"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("stream"),
           py::arg("k_scale") = 0.0f, py::arg("v_scale") = 0.0f,
           "va_plan_run (asynchronous, on `stream`; k_scale / v_scale: an fp8 plan's scales for this run, "
           "0 = the plan's).")
      .def("info", &PlanHandle::info, "va_plan_info as a dict.");

  m.def(
      "verify_metadata",
      [](int32_t batch, int32_t real_batch, int32_t num_drafts, uintptr_t prefix_len,
         bool prefix_len_int64, uintptr_t draft_slots, bool draft_slots_int64, int32_t pad_slot,
         uintptr_t draft_mask, uintptr_t qo_indptr, uintptr_t kv_indptr, uintptr_t kv_len,
         uintptr_t kv_indices, int64_t kv_indices_capacity, uintptr_t tree_mask,
         uintptr_t error_word, uintptr_t stream) {
        va_verify_metadata_args a;
        va_verify_metadata_args_init(&a);
        a.batch = batch;
        a.real_batch = real_batch;
        a.num_drafts = num_drafts;
        a.prefix_len = reinterpret_cast<const void*>(prefix_len);
        a.prefix_len_int64 = prefix_len_int64 ? 1 : 0;
        a.draft_slots = reinterpret_cast<const void*>(draft_slots);
        a.draft_slots_int64 = draft_slots_int64 ? 1 : 0;
        a.pad_slot = pad_slot;
        a.draft_mask = reinterpret_cast<const uint8_t*>(draft_mask);
        a.qo_indptr = reinterpret_cast<int32_t*>(qo_indptr);
        a.kv_indptr = reinterpret_cast<int32_t*>(kv_indptr);
        a.kv_len = reinterpret_cast<int32_t*>(kv_len);
        a.kv_indices = reinterpret_cast<int32_t*>(kv_indices);
        a.kv_indices_capacity = kv_indices_capacity;
        a.tree_mask = reinterpret_cast<int32_t*>(tree_mask);
        a.error_word = reinterpret_cast<int32_t*>(error_word);
        a.stream = reinterpret_cast<void*>(stream);
        check(va_verify_metadata(&a), "va_verify_metadata");
      },
      "va_verify_metadata (device pointers as ints, 0 = NULL).");

  m.def(
      "scaled_copy",
      [](uintptr_t x, uintptr_t y, int64_t n, float scale, int32_t dtype, uintptr_t stream) {
        check(va_scaled_copy(reinterpret_cast<const void*>(x), reinterpret_cast<void*>(y), n,
                             scale, dtype, reinterpret_cast<void*>(stream)),
              "va_scaled_copy");
      },
      py::arg("x"), py::arg("y"), py::arg("n"), py::arg("scale"), py::arg("dtype"),
      py::arg("stream"), "Smoke kernel: y = scale * x (device pointers).");

  m.def(
      "cuda_versions",
      []() {
        int32_t rt = 0, drv = 0;
        check(va_cuda_versions(&rt, &drv), "va_cuda_versions");
        return py::make_tuple(rt, drv);
      },
      "(CUDA runtime version linked in, driver version or 0).");

  m.def("compiled_archs", []() { return std::string(va_compiled_archs()); },
        "Comma-separated GPU archs compiled in, e.g. 'sm_90a,sm_120a'.");
  m.def("abi_version", []() { return va_abi_version(); });
  m.def("config_tags", []() { return std::string(va_config_tags()); },
        "Comma-separated kernel configuration tags (the names Plan's `config` takes).");
  m.def("status_name", [](int s) { return std::string(va_status_name(static_cast<va_status>(s))); });
}
