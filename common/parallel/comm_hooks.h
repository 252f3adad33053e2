// Communication hooks for DDP's buckets (PyTorch's register_comm_hook and its default hooks):
//   allreduce        all-reduce the float32 bucket, average (the default)
//   fp16, bf16       Horovod's compression (Sergeev & Del Balso, 2018): divide by the world size,
//                    convert the bucket to 16 bits, all-reduce that (half the bytes on the wire),
//                    convert back. The sum is rounded to 16 bits at every addition.
// Dividing first keeps the sum in range: fp16 overflows above 65504.
// average_hook(dtype) is the hook of DDP's reduce_dtype (ReducerOptions, chapter 04's --reduce-dtype):
// mixed precision's choice of the type gradients are averaged in, which is the same arithmetic.
#pragma once
#include <functional>
#include <string>

#include "common/comm/communicator.h"
#include "common/core/dtype.h"
#include "common/kernels/kernels.h"
#include "common/tensor/tensor.h"

namespace course::parallel {

// How a bucket is synchronised (PyTorch's register_comm_hook): start the communication of `bucket`
// (a flat buffer) and return its work; when the work completes, the buffer must hold the group's
// average. The default all-reduces with ReduceOp::average.
using CommHook = std::function<comm::WorkHandle(comm::Communicator& group, Tensor& bucket)>;

CommHook allreduce_hook();
CommHook compress_hook(HalfFormat format);
// The average in `reduce_dtype`: allreduce_hook() for float32, compress_hook() for a 16-bit type.
CommHook average_hook(DType reduce_dtype);
// "none" (the default all-reduce), "fp16" or "bf16"; throws UsageError otherwise.
CommHook comm_hook_named(const std::string& name);

}  // namespace course::parallel
