#include <sstream>

#include "shardopt/memory_report.hpp"
#include "shardopt/views.hpp"

namespace shardopt {

std::vector<std::int64_t> row_major_strides(const Shape& shape) {
  std::vector<std::int64_t> s(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

TensorView contiguous_view(void* data, const Shape& shape, DType dtype) {
  TensorView v;
  v.data = data;
  v.shape = shape;
  v.strides = row_major_strides(shape);
  v.dtype = dtype;
  return v;
}

bool TensorView::contiguous() const noexcept { return strides == row_major_strides(shape); }

std::string MemoryReport::to_string() const {
  std::ostringstream os;
  auto row = [&](const char* name, std::int64_t b) {
    os << "  " << name << ": " << b << " B (" << static_cast<double>(b) / (1 << 20) << " MiB)\n";
  };
  row("params       ", params);
  row("grads        ", grads);
  row("master       ", master);
  row("remainders   ", remainders);
  row("moments      ", moments);
  row("moment scales", moment_scales);
  row("copies       ", copies);
  row("pool         ", pool);
  row("mxfp8        ", mxfp8);
  row("nvfp4        ", nvfp4);
  row("nccl overhead", nccl_overhead);
  row("offload slots", offload_staging);
  row("total        ", total());
  row("of it padding", padding);
  row("offloaded (host)", offloaded);
  return os.str();
}

}  // namespace shardopt
