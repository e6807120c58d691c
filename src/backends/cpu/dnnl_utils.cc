#include "backends/cpu/dnnl_utils.h"

namespace onnxtrain::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

dnnl::memory::desc plain_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt) {
  dnnl::memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(dims[i], 1);
  return dnnl::memory::desc(dims, dt, strides);
}

dnnl::memory::desc channels_last_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt) {
  dnnl::memory::dims strides(dims.size(), 1);
  int64_t step = std::max<int64_t>(dims[1], 1);  // spatial dims row-major outside C
  for (size_t i = dims.size(); i-- > 2;) {
    strides[i] = step;
    step *= std::max<int64_t>(dims[i], 1);
  }
  strides[0] = step;
  return dnnl::memory::desc(dims, dt, strides);
}

dnnl::memory::desc strided_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt,
                              const dnnl::memory::dims& strides) {
  return dnnl::memory::desc(dims, dt, strides);
}

void throw_dnnl_error(const dnnl::error& e, const std::string& context, const char* what) {
  OT_THROW(kRuntime, context, "oneDNN failed to ", what, ": ", e.what(), " (status ", int(e.status), ")");
}

}  // namespace onnxtrain::cpu
