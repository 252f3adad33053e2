// Tensor: values with a shape and an element type (float32, bfloat16 or float16), on the CPU or a CUDA
// GPU, over shared, counted storage. It also carries the autograd fields (requires_grad, grad, the
// node that made it, gradient hooks).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/core/device.h"
#include "common/core/dtype.h"
#include "common/core/memory.h"

namespace course {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

// One allocation; several tensors (views) may share it.
struct Storage {
  Storage(Device device, std::size_t bytes, MemoryCategory category);
  ~Storage();
  // Gives the memory back and takes it again, keeping the object (PyTorch's storage().resize_(0) and
  // back, as FSDP does): ZeRO-3 frees a layer's gathered parameters between uses, while the tensors
  // and autograd's saved views that point at this storage stay valid. The contents are lost.
  void release();
  void materialize();
  bool released() const { return data == nullptr && bytes > 0; }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device;
  MemoryCategory category;
};

class Tensor;
struct Node;  // autograd graph node, see common/autograd/autograd.h
using GradHook = std::function<void(Tensor& parameter)>;  // the leaf whose .grad() is now complete

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::size_t offset = 0;  // in elements, for views into a larger storage
  Shape shape;
  DType dtype = DType::float32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  MemoryCategory grad_category = MemoryCategory::gradients;  // where backward counts a gradient it creates
  std::shared_ptr<Node> grad_fn;
  std::vector<GradHook> post_accumulate_grad_hooks;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Creation. New storage is counted under the current MemoryCategoryScope.
  static Tensor empty(const Shape& shape, Device device = Device::cpu, DType dtype = DType::float32);
  static Tensor zeros(const Shape& shape, Device device = Device::cpu, DType dtype = DType::float32);
  static Tensor ones(const Shape& shape, Device device = Device::cpu, DType dtype = DType::float32);
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu, DType dtype = DType::float32);
  // The values rounded to `dtype` (to nearest, ties to even) when it is a 16-bit type.
  static Tensor from_host(const std::vector<float>& values, const Shape& shape, Device device = Device::cpu,
                          DType dtype = DType::float32);
  // Seeded random values: element i depends only on (seed, i), so CPU and CUDA agree bit for bit.
  static Tensor randn(const Shape& shape, std::uint64_t seed, Device device = Device::cpu,
                      float mean = 0.0f, float stddev = 1.0f);
  static Tensor rand_uniform(const Shape& shape, std::uint64_t seed, float low, float high,
                             Device device = Device::cpu);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  std::size_t element_size() const { return course::element_size(impl_->dtype); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  Device device() const { return impl_->storage ? impl_->storage->device : Device::cpu; }
  // The elements (a device pointer for CUDA tensors). data() is for float32 tensors and throws
  // std::logic_error on a 16-bit one, so a kernel can never read 16-bit bits as floats; data16() is
  // for the 16-bit types (their bits), raw() for any.
  float* data() const;
  std::uint16_t* data16() const;
  void* raw() const;

  Tensor to(Device device) const;       // a copy on `device` (or this tensor if already there)
  // A copy in `dtype` (or this tensor if already that type), rounded to nearest, ties to even, when
  // narrowing. Not recorded by autograd (as to(Device) is not); the differentiable cast is ops' cast().
  Tensor to(DType dtype) const;
  Tensor clone() const;                 // a copy with its own storage, same device and type
  std::vector<float> to_host() const;   // the values as floats, copied to the host (16-bit ones widened exactly)
  void to_host(float* out) const;       // the same into numel() floats the caller holds: no temporary
  float item() const;                   // the single value of a one-element tensor
  // Overwrites the values in place (shapes must hold as many elements), converting from the source's
  // type to this one's if they differ (rounded when narrowing).
  void copy_from(const Tensor& source);
  void fill_(float value);              // the value rounded to this tensor's type
  // Adds `other` (as many elements, any type) in place, outside autograd: in float32, the sum rounded
  // once to this tensor's type (as PyTorch adds two bfloat16 tensors).
  Tensor& add_(const Tensor& other);

  // A tensor sharing this storage: `count` elements from element `offset`, with a new shape (same type).
  Tensor view(std::size_t offset, const Shape& shape) const;
  Tensor flat_view(std::size_t offset, std::size_t count) const;
  Tensor detach() const;  // same storage, no autograd history

  // Autograd.
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool value);
  Tensor grad() const;
  void set_grad(const Tensor& grad);  // e.g. to make the gradient a view into a flat buffer
  void zero_grad();                   // fills the gradient with zeros, keeping its memory
  void backward() const;                             // this must be a one-element tensor (a loss)
  void backward(const Tensor& grad_output) const;    // any shape: the gradient of the output arrives from outside
  // Called with this leaf once per backward pass, when its gradient for the pass is complete
  // (PyTorch's register_post_accumulate_grad_hook). DDP starts communicating from here.
  void register_post_accumulate_grad_hook(GradHook hook);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// What the host waited for: on a GPU each read of a tensor's values (to_host, item, a copy to the host),
// each write of host values into a tensor (from_host, a copy to the device) and each explicit
// synchronisation waits for every kernel queued before it. Counted on every backend, the CPU's too, so a
// test on the CPU sees how often a step on a GPU would wait (tests/host_transfers_test.cpp).
struct HostTransfers {
  std::int64_t reads = 0, writes = 0, synchronizations = 0;
};
HostTransfers host_transfers();
void count_synchronization();  // called where the library synchronises a device (the profiler's scopes)

}  // namespace course
