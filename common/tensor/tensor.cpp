// Tensor creation, copies between devices, views and the autograd accessors.
#include "common/tensor/tensor.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/cuda_runtime.h"
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

}  // namespace

Tensor Tensor::empty(const Shape& shape, Device device) {
  for (auto d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_string(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->storage = std::make_shared<Storage>(device, static_cast<std::size_t>(shape_numel(shape)) * sizeof(float),
                                            current_memory_category());
  return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, device);
  t.fill_(value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, Device device) { return full(shape, 0.0f, device); }
Tensor Tensor::ones(const Shape& shape, Device device) { return full(shape, 1.0f, device); }

Tensor Tensor::from_host(const std::vector<float>& values, const Shape& shape, Device device) {
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_host: " + std::to_string(values.size()) + " values for shape " +
                                shape_string(shape));
  Tensor t = empty(shape, device);
  copy_bytes(t.data(), device, values.data(), Device::cpu, t.nbytes());
  return t;
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

float* Tensor::data() const {
  if (!impl_ || !impl_->storage) return nullptr;
  return static_cast<float*>(impl_->storage->data) + impl_->offset;
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor out = empty(shape(), target);
  copy_bytes(out.data(), target, data(), device(), nbytes());
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), device());
  copy_bytes(out.data(), device(), data(), device(), nbytes());
  return out;
}

std::vector<float> Tensor::to_host() const {
  if (impl_ && impl_->storage && impl_->storage->released())
    throw std::logic_error("to_host: this tensor's storage is released (a ZeRO-3 parameter outside its layer's "
                           "forward and backward: gather it first, e.g. with ZeroOptimizer::full_parameters)");
  std::vector<float> values(static_cast<std::size_t>(numel()));
  copy_bytes(values.data(), Device::cpu, data(), device(), nbytes());
  return values;
}

float Tensor::item() const {
  if (numel() != 1) throw std::invalid_argument("item() needs a one-element tensor, got " + shape_string(shape()));
  return to_host()[0];
}

void Tensor::copy_from(const Tensor& source) {
  if (source.numel() != numel())
    throw std::invalid_argument("copy_from: " + shape_string(source.shape()) + " into " + shape_string(shape()));
  copy_bytes(data(), device(), source.data(), source.device(), nbytes());
}

void Tensor::fill_(float value) { kernels(device()).fill(data(), static_cast<std::size_t>(numel()), value); }

Tensor Tensor::view(std::size_t offset, const Shape& new_shape) const {
  std::size_t available = impl_->storage->bytes / sizeof(float) - impl_->offset;
  if (offset + static_cast<std::size_t>(shape_numel(new_shape)) > available)
    throw std::out_of_range("view " + shape_string(new_shape) + " at offset " + std::to_string(offset) +
                            " exceeds the storage");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + offset;
  impl->shape = new_shape;
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
