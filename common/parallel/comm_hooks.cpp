// The default and the 16-bit compression hooks.
#include "common/parallel/comm_hooks.h"

#include "common/core/errors.h"
#include "common/core/memory.h"

namespace course::parallel {
namespace {

// The all-reduce of the packed 16-bit copy; when it completes, the result is converted back into
// the float32 bucket, once.
class DecompressWork final : public comm::Work {
 public:
  DecompressWork(comm::WorkHandle inner, Tensor packed, Tensor bucket, HalfFormat format)
      : inner_(std::move(inner)), packed_(std::move(packed)), bucket_(std::move(bucket)), format_(format) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    kernels(bucket_.device())
        .from_half(format_, reinterpret_cast<const std::uint16_t*>(packed_.data()), bucket_.data(),
                   static_cast<std::size_t>(bucket_.numel()));
  }
  comm::WorkHandle inner_;
  Tensor packed_, bucket_;
  HalfFormat format_;
  bool done_ = false;
};

}  // namespace

CommHook allreduce_hook() {
  return [](comm::Communicator& group, Tensor& bucket) { return group.all_reduce_async(bucket, comm::ReduceOp::average); };
}

CommHook compress_hook(HalfFormat format) {
  return [format](comm::Communicator& group, Tensor& bucket) -> comm::WorkHandle {
    const auto n = static_cast<std::size_t>(bucket.numel());
    Kernels& k = kernels(bucket.device());
    Tensor packed;
    {
      MemoryCategoryScope scope(MemoryCategory::communication);
      packed = Tensor::zeros({static_cast<std::int64_t>((n + 1) / 2)}, bucket.device());  // two values per slot
    }
    k.scale(bucket.data(), 1.0f / static_cast<float>(group.size()), bucket.data(), n);
    k.to_half(format, bucket.data(), reinterpret_cast<std::uint16_t*>(packed.data()), n);
    auto work = group.all_reduce_async(packed, comm::ReduceOp::sum,
                                       format == HalfFormat::float16 ? comm::Element::float16 : comm::Element::bfloat16);
    return std::make_shared<DecompressWork>(std::move(work), packed, bucket, format);
  };
}

CommHook average_hook(DType reduce_dtype) {
  return is_16bit(reduce_dtype) ? compress_hook(half_format(reduce_dtype)) : allreduce_hook();
}

CommHook comm_hook_named(const std::string& name) {
  if (name == "none") return allreduce_hook();
  if (name == "fp16") return compress_hook(HalfFormat::float16);
  if (name == "bf16") return compress_hook(HalfFormat::bfloat16);
  throw UsageError("unknown communication hook '" + name + "' (expected none, fp16 or bf16)");
}

}  // namespace course::parallel
