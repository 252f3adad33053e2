// Tensor creation, copies between devices, views and the autograd accessors.
#include "common/tensor/tensor.h"

#include <atomic>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/cuda_runtime.h"
#include "common/core/index_check.h"
#include "common/kernels/half.h"
#include "common/kernels/kernels.h"
#include "common/tensor/random.h"

namespace course {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Storage::Storage(Device d, std::size_t n, MemoryCategory c) : bytes(n), device(d), category(effective_memory_category(c)) {
  data = allocate_bytes(device, bytes, category);
}
Storage::~Storage() { free_bytes(device, data, bytes, category); }
void Storage::release() {
  free_bytes(device, data, bytes, category);
  data = nullptr;
}
void Storage::materialize() {
  if (!data) data = allocate_bytes(device, bytes, category);
}

namespace {

std::atomic<std::int64_t> g_reads{0}, g_writes{0}, g_synchronizations{0};

// A copy between the host and a device is a read or a write of the host's (HostTransfers).
void count_crossing(Device dst_device, Device src_device) {
  if (dst_device == Device::cpu && src_device != Device::cpu) ++g_reads;
  if (dst_device != Device::cpu && src_device == Device::cpu) ++g_writes;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if COURSE_HAVE_CUDA
  auto kind = dst_device == Device::cpu   ? cuda::CopyKind::device_to_host
              : src_device == Device::cpu ? cuda::CopyKind::host_to_device
                                          : cuda::CopyKind::device_to_device;
  cuda::copy(dst, src, bytes, kind);
#else
  throw std::runtime_error("CUDA copy requested in a build without the CUDA backend");
#endif
}

// Converts n elements between types on one device; the 16-bit roundings are half.h's, on both devices.
void convert(const void* src, DType from, void* dst, DType to, std::size_t n, Device device) {
  Kernels& k = kernels(device);
  if (from == to) {
    copy_bytes(dst, device, src, device, n * element_size(from));
  } else if (from == DType::float32) {
    k.to_half(half_format(to), static_cast<const float*>(src), static_cast<std::uint16_t*>(dst), n);
  } else if (to == DType::float32) {
    k.from_half(half_format(from), static_cast<const std::uint16_t*>(src), static_cast<float*>(dst), n);
  } else {  // bfloat16 <-> float16 through float32, which holds both exactly
    Tensor wide = Tensor::empty({static_cast<std::int64_t>(n)}, device);
    k.from_half(half_format(from), static_cast<const std::uint16_t*>(src), wide.data(), n);
    k.to_half(half_format(to), wide.data(), static_cast<std::uint16_t*>(dst), n);
  }
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  for (auto d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_string(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(device, static_cast<std::size_t>(shape_numel(shape)) * course::element_size(dtype),
                                            current_memory_category());
  return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, float value, Device device, DType dtype) {
  Tensor t = empty(shape, device, dtype);
  t.fill_(value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, Device device, DType dtype) { return full(shape, 0.0f, device, dtype); }
Tensor Tensor::ones(const Shape& shape, Device device, DType dtype) { return full(shape, 1.0f, device, dtype); }

Tensor Tensor::from_host(const std::vector<float>& values, const Shape& shape, Device device, DType dtype) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_host: " + std::to_string(values.size()) + " values for shape " +
                                shape_string(shape));
  ++g_writes;
  Tensor t = empty(shape, device);
  copy_bytes(t.data(), device, values.data(), Device::cpu, t.nbytes());
  return t.to(dtype);
}

// Values are made on the host and copied, so both devices hold exactly the same floats.
Tensor Tensor::randn(const Shape& shape, std::uint64_t seed, Device device, float mean, float stddev) {
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(mean + stddev * random_normal(seed, i));
  return from_host(values, shape, device);
}

Tensor Tensor::rand_uniform(const Shape& shape, std::uint64_t seed, float low, float high, Device device) {
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(low + (static_cast<double>(high) - low) * random_uniform(seed, i));
  return from_host(values, shape, device);
}

std::int64_t Tensor::dim(int i) const {
  int rank = static_cast<int>(shape().size());
  if (i < 0) i += rank;
  if (i < 0 || i >= rank) throw std::out_of_range("dimension index out of range for " + shape_string(shape()));
  return shape()[static_cast<std::size_t>(i)];
}

void* Tensor::raw() const {
  if (!impl_ || !impl_->storage || !impl_->storage->data) return nullptr;
  return static_cast<char*>(impl_->storage->data) + impl_->offset * element_size();
}

float* Tensor::data() const {
  if (impl_ && impl_->dtype != DType::float32)
    throw std::logic_error(std::string("data(): this tensor holds ") + dtype_name(impl_->dtype) +
                           ", not float32 (read it with data16(), or convert it with to(DType::float32))");
  return static_cast<float*>(raw());
}

std::uint16_t* Tensor::data16() const {
  if (impl_ && !is_16bit(impl_->dtype))
    throw std::logic_error("data16(): this tensor holds float32, not a 16-bit type");
  return static_cast<std::uint16_t*>(raw());
}

HostTransfers host_transfers() { return {g_reads.load(), g_writes.load(), g_synchronizations.load()}; }
void count_synchronization() { ++g_synchronizations; }

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  count_crossing(target, device());
  Tensor out = empty(shape(), target, dtype());
  copy_bytes(out.raw(), target, raw(), device(), nbytes());
  return out;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = empty(shape(), device(), target);
  convert(raw(), dtype(), out.raw(), target, static_cast<std::size_t>(numel()), device());
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), device(), dtype());
  copy_bytes(out.raw(), device(), raw(), device(), nbytes());
  return out;
}

std::vector<float> Tensor::to_host() const {
  std::vector<float> values(static_cast<std::size_t>(numel()));
  to_host(values.data());
  return values;
}

void Tensor::to_host(float* out) const {
  if (impl_ && impl_->storage && impl_->storage->released())
    throw std::logic_error("to_host: this tensor's storage is released (a ZeRO-3 parameter outside its layer's "
                           "forward and backward: gather it first, e.g. with ZeroOptimizer::full_parameters)");
  ++g_reads;
  const Tensor wide = to(DType::float32);
  copy_bytes(out, Device::cpu, wide.raw(), wide.device(), wide.nbytes());
  if (wide.device() != Device::cpu) raise_failed_index_check();  // the device has finished: its checks too
}

float Tensor::item() const {
  if (numel() != 1) throw std::invalid_argument("item() needs a one-element tensor, got " + shape_string(shape()));
  return to_host()[0];
}

void Tensor::copy_from(const Tensor& source) {
  if (source.numel() != numel())
    throw std::invalid_argument("copy_from: " + shape_string(source.shape()) + " into " + shape_string(shape()));
  if (source.dtype() == dtype()) {
    count_crossing(device(), source.device());
    copy_bytes(raw(), device(), source.raw(), source.device(), nbytes());
  } else if (source.device() == device()) {
    convert(source.raw(), source.dtype(), raw(), dtype(), static_cast<std::size_t>(numel()), device());
  } else {
    const Tensor here = source.to(device());
    convert(here.raw(), here.dtype(), raw(), dtype(), static_cast<std::size_t>(numel()), device());
  }
}

void Tensor::fill_(float value) {
  const auto n = static_cast<std::size_t>(numel());
  if (dtype() == DType::float32) {
    kernels(device()).fill(data(), n, value);
  } else {  // the value rounded here as to_half rounds it, its bits written in place
    const std::uint16_t bits = half::with_format(half_format(dtype()), [value](auto f) {
      return half::narrow<decltype(f)::value>(value);
    });
    kernels(device()).fill_bits(data16(), n, bits);
  }
}

Tensor& Tensor::add_(const Tensor& other) {
  const auto n = static_cast<std::size_t>(numel());
  if (other.numel() != numel())
    throw std::invalid_argument("add_: " + std::to_string(other.numel()) + " elements added to " + std::to_string(numel()));
  const Tensor here = other.device() == device() ? other : other.to(device());
  if (dtype() == DType::float32 && other.dtype() == DType::float32) {
    kernels(device()).binary(BinaryOp::add, data(), n, here.data(), n, data(), n);
    return *this;
  }
  if (dtype() == DType::float32 && is_16bit(other.dtype())) {  // a 16-bit gradient into a float32 one
    kernels(device()).add_half(half_format(other.dtype()), here.data16(), data(), n);
    return *this;
  }
  if (is_16bit(dtype()) && other.dtype() == dtype()) {  // read and written in 16 bits, rounded once
    kernels(device()).binary_half(half_format(dtype()), BinaryOp::add, data16(), n, here.data16(), n, data16(), n);
    return *this;
  }
  Tensor sum = to(DType::float32).clone();
  const Tensor part = here.to(DType::float32);
  kernels(device()).binary(BinaryOp::add, sum.data(), n, part.data(), n, sum.data(), n);
  copy_from(sum);
  return *this;
}

Tensor Tensor::view(std::size_t offset, const Shape& new_shape) const {
  std::size_t available = impl_->storage->bytes / element_size() - impl_->offset;
  if (offset + static_cast<std::size_t>(shape_numel(new_shape)) > available)
    throw std::out_of_range("view " + shape_string(new_shape) + " at offset " + std::to_string(offset) +
                            " exceeds the storage");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + offset;
  impl->shape = new_shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::flat_view(std::size_t offset, std::size_t count) const {
  return view(offset, {static_cast<std::int64_t>(count)});
}

Tensor Tensor::detach() const { return view(0, shape()); }

Tensor& Tensor::set_requires_grad(bool value) {
  impl_->requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return impl_->grad ? Tensor(impl_->grad) : Tensor(); }

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined() && grad.numel() != numel())
    throw std::invalid_argument("set_grad: gradient " + shape_string(grad.shape()) + " for " + shape_string(shape()));
  impl_->grad = grad.impl_ptr();
}

void Tensor::zero_grad() {
  if (impl_->grad) Tensor(impl_->grad).fill_(0.0f);
}

void Tensor::backward() const { autograd::backward(*this); }
void Tensor::backward(const Tensor& grad_output) const { autograd::backward(*this, grad_output); }

void Tensor::register_post_accumulate_grad_hook(GradHook hook) {
  impl_->post_accumulate_grad_hooks.push_back(std::move(hook));
}

}  // namespace course
