// Bucket assignment, launch in bucket order, completion, and the one-time rebuild.
#include "common/parallel/reducer.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "common/core/memory.h"
#include "common/parallel/comm_hooks.h"

namespace course::parallel {
namespace {

std::size_t megabytes_to_bytes(double mb) { return static_cast<std::size_t>(mb * 1024.0 * 1024.0); }

// "3.weight" -> "3": the layer a parameter belongs to, for the timeline.
std::string layer_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

}  // namespace

std::vector<std::vector<std::size_t>> assign_buckets_by_size(const std::vector<std::size_t>& order,
                                                             const std::vector<std::size_t>& bytes,
                                                             std::size_t first_cap, std::size_t cap) {
  std::vector<std::vector<std::size_t>> buckets;
  std::size_t filled = 0;
  for (std::size_t index : order) {
    const std::size_t limit = buckets.size() <= 1 ? first_cap : cap;  // the bucket being filled: the first?
    if (buckets.empty() || (!buckets.back().empty() && filled + bytes[index] > limit)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(index);
    filled += bytes[index];
  }
  return buckets;
}

Reducer::Reducer(std::vector<nn::NamedTensor> parameters, comm::Communicator& group, ReducerOptions options)
    : parameters_(std::move(parameters)), group_(group), options_(options) {
  if (!(options_.bucket_cap_mb > 0) || !(options_.first_bucket_mb > 0))
    throw std::invalid_argument("Reducer: bucket caps must be positive (bucket_cap_mb " +
                                std::to_string(options_.bucket_cap_mb) + ", first_bucket_mb " +
                                std::to_string(options_.first_bucket_mb) + ")");
  hook_ = average_hook(options_.reduce_dtype);
  std::vector<std::size_t> reverse(parameters_.size());
  for (std::size_t i = 0; i < reverse.size(); ++i) reverse[i] = reverse.size() - 1 - i;
  build(reverse);
}

void Reducer::build(const std::vector<std::size_t>& order) {
  std::vector<std::size_t> sizes(parameters_.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) sizes[i] = parameters_[i].second.nbytes();
  const BucketAssignment& assign = options_.assign_buckets ? options_.assign_buckets : assign_buckets_by_size;
  const auto groups = assign(order, sizes, megabytes_to_bytes(options_.first_bucket_mb),
                             megabytes_to_bytes(options_.bucket_cap_mb));
  // A wrong assignment would all-reduce a gradient twice or never: refused here, the parameter named.
  std::vector<int> seen(parameters_.size(), 0);
  for (const auto& group : groups) {
    if (group.empty()) throw std::logic_error("Reducer: the bucket assignment made an empty bucket");
    for (std::size_t index : group) {
      if (index >= parameters_.size())
        throw std::logic_error("Reducer: the bucket assignment names parameter " + std::to_string(index) + " of " +
                               std::to_string(parameters_.size()));
      if (++seen[index] > 1)
        throw std::logic_error("Reducer: the bucket assignment puts '" + parameters_[index].first + "' in two buckets");
    }
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (seen[i] == 0) throw std::logic_error("Reducer: the bucket assignment leaves out '" + parameters_[i].first + "'");
  std::vector<Bucket> buckets(groups.size());
  for (std::size_t b = 0; b < groups.size(); ++b) {
    std::size_t elements = 0;
    for (std::size_t index : groups[b]) {
      buckets[b].parameters.push_back(index);
      buckets[b].offsets.push_back(elements);
      elements += static_cast<std::size_t>(parameters_[index].second.numel());
    }
  }
  // One flat buffer per bucket; each gradient becomes a view into it, keeping any values it had.
  bucket_of_.assign(parameters_.size(), 0);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    std::size_t elements = 0;
    for (std::size_t index : bucket.parameters) elements += static_cast<std::size_t>(parameters_[index].second.numel());
    const Tensor& first = parameters_[bucket.parameters.front()].second;
    {
      MemoryCategoryScope scope(MemoryCategory::gradients);
      bucket.buffer = Tensor::zeros({static_cast<std::int64_t>(elements)}, first.device());
    }
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      Tensor& p = parameters_[bucket.parameters[k]].second;
      Tensor view = bucket.buffer.view(bucket.offsets[k], p.shape());
      if (p.grad().defined()) view.copy_from(p.grad());
      p.set_grad(view);
      bucket_of_[bucket.parameters[k]] = b;
    }
    bucket.pending = bucket.parameters.size();
  }
  buckets_ = std::move(buckets);
  ready_.assign(parameters_.size(), false);
  launched_ms_.assign(buckets_.size(), 0);
  completed_ms_.assign(buckets_.size(), 0);
  next_launch_ = 0;
}

double Reducer::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pass_start_).count();
}

void Reducer::mark_ready(std::size_t index, bool sync) {
  if (!pass_started_) {
    pass_started_ = true;
    pass_start_ = std::chrono::steady_clock::now();
    last_ready_ms_ = 0;
    timeline_ = {};
  }
  if (ready_[index]) throw std::logic_error("Reducer: gradient of '" + parameters_[index].first + "' marked ready twice");
  ready_[index] = true;
  ready_order_.push_back(index);
  const double t = now_ms();
  if (options_.record_timeline) {
    const std::string layer = layer_of(parameters_[index].first);
    if (!timeline_.compute.empty() && timeline_.compute.back().name == layer) timeline_.compute.back().end_ms = t;
    else timeline_.compute.push_back({layer, last_ready_ms_, t});
    poll(t);
  }
  last_ready_ms_ = t;
  --buckets_[bucket_of_[index]].pending;
  if (sync && options_.overlap) launch_ready_buckets(false);
}

void Reducer::launch_ready_buckets(bool all) {
  while (next_launch_ < buckets_.size() && (all || buckets_[next_launch_].pending == 0)) {
    Bucket& bucket = buckets_[next_launch_];
    launched_ms_[next_launch_] = now_ms();
    const std::int64_t before = group_.bytes_sent();
    bucket.work = hook_(group_, bucket.buffer);
    bytes_ += group_.bytes_sent() - before;  // what the hook put on the wire (half, when compressed)
    ++next_launch_;
  }
}

// Notes the buckets that have completed by now (for the timeline only).
void Reducer::poll(double now) {
  for (std::size_t b = 0; b < next_launch_; ++b)
    if (completed_ms_[b] == 0 && buckets_[b].work && buckets_[b].work->test()) completed_ms_[b] = now;
}

void Reducer::finalize(bool sync) {
  if (!pass_started_) {  // a backward pass that touched none of these parameters
    pass_start_ = std::chrono::steady_clock::now();
    pass_started_ = true;
  }
  const double backward_end = now_ms();
  std::vector<std::size_t> unused;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (!ready_[i]) unused.push_back(i);
  if (!unused.empty() && !options_.find_unused_parameters) {
    for (auto& bucket : buckets_) bucket.work.reset();  // never leave a launched bucket unwaited
    ready_.assign(parameters_.size(), false);
    ready_order_.clear();
    for (auto& bucket : buckets_) bucket.pending = bucket.parameters.size();
    next_launch_ = 0;
    pass_started_ = false;
    // Every rank must all-reduce the same buckets in the same order, so an unused parameter would leave
    // its bucket waiting forever.
    throw std::logic_error("DistributedDataParallel: parameter '" + parameters_[unused.front()].first +
                           "' received no gradient in this backward pass; every parameter must take part in the "
                           "loss, or set find_unused_parameters");
  }
  for (std::size_t i : unused) {  // find_unused_parameters: their gradient counts as zero
    Tensor g = parameters_[i].second.grad();
    if (sync) g.fill_(0.0f);
    --buckets_[bucket_of_[i]].pending;
  }
  if (sync) {
    launch_ready_buckets(true);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (options_.record_timeline) {
        while (!buckets_[b].work->test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (completed_ms_[b] == 0) completed_ms_[b] = now_ms();
      } else {
        buckets_[b].work->wait();
      }
      buckets_[b].work.reset();
    }
  }
  const double synchronised = now_ms();
  exposed_ms_ = sync ? synchronised - backward_end : 0;
  if (options_.record_timeline && sync) {
    timeline_.backward_end_ms = backward_end;
    timeline_.synchronised_ms = synchronised;
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      timeline_.communication.push_back({"bucket " + std::to_string(b), launched_ms_[b], completed_ms_[b]});
  }
  auto order = std::move(ready_order_);
  ready_order_.clear();
  ready_.assign(parameters_.size(), false);
  for (auto& bucket : buckets_) bucket.pending = bucket.parameters.size();
  std::fill(completed_ms_.begin(), completed_ms_.end(), 0.0);
  next_launch_ = 0;
  pass_started_ = false;
  if (!sync || first_sync_done_) return;
  first_sync_done_ = true;
  if (!options_.rebuild_buckets) return;
  // Rebuild once, in the order the gradients became ready: rank 0's, so every rank builds the same.
  for (std::size_t i : unused) order.push_back(i);
  std::vector<float> as_float(order.begin(), order.end());
  Tensor shared = Tensor::from_host(as_float, {static_cast<std::int64_t>(as_float.size())});
  group_.broadcast(shared, 0);
  std::vector<std::size_t> rank0_order;
  for (float v : shared.to_host()) rank0_order.push_back(static_cast<std::size_t>(v));
  build(rank0_order);
  rebuilt_ = true;
}

}  // namespace course::parallel
