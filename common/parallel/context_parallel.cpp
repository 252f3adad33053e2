// Context parallelism: the sequence's shards, Ulysses' two all-to-alls and the ring of key-value blocks.
#include "common/parallel/context_parallel.h"

#include <limits>
#include <stdexcept>

#include "common/autograd/autograd.h"
#include "common/core/errors.h"
#include "common/kernels/kernels.h"
#include "common/ops/autocast.h"
#include "common/ops/ops.h"
#include "common/faults/faults.h"

namespace course::parallel {

ContextMethod parse_context_method(const std::string& name) {
  if (name == "ulysses") return ContextMethod::ulysses;
  if (name == "ring") return ContextMethod::ring;
  throw UsageError("--cp-method: '" + name + "' is not a method; use ulysses or ring");
}

const char* context_method_name(ContextMethod method) { return method == ContextMethod::ring ? "ring" : "ulysses"; }

ContextParallel::ContextParallel(comm::Communicator& group, ContextMethod method) : group_(group), method_(method) {}

void check_context_parallel(std::int64_t t, std::int64_t heads, int n, ContextMethod method) {
  const std::int64_t pieces = method == ContextMethod::ring && n > 1 ? 2 * n : n;
  if (t % pieces != 0)
    throw UsageError("--cp: " + std::to_string(t) + " tokens do not divide into " + std::to_string(pieces) +
                     (method == ContextMethod::ring ? " chunks (the ring's balanced layout takes 2 per rank)"
                                                    : " shards") +
                     " for " + std::to_string(n) + " context-parallel ranks");
  if (method == ContextMethod::ulysses && heads % n != 0)
    throw UsageError("--cp: Ulysses gives each of the " + std::to_string(n) + " context-parallel ranks whole heads, and " +
                     std::to_string(heads) + " heads per tensor-parallel rank do not divide among them (--n-head, or "
                     "--cp-method ring)");
}

void ContextParallel::check(std::int64_t t, std::int64_t heads) const { check_context_parallel(t, heads, size(), method_); }

std::vector<std::int64_t> ContextParallel::positions(std::int64_t t, int rank) const {
  const int n = size();
  std::vector<std::int64_t> out;
  // --fault skip-cp-offset (chapter 08): the shard's offset forgotten, every rank takes the first tokens'.
  if (faults::active("skip-cp-offset", this)) rank = 0;
  if (method_ == ContextMethod::ulysses || n == 1) {
    const std::int64_t shard = t / n;
    for (std::int64_t i = 0; i < shard; ++i) out.push_back(rank * shard + i);
    return out;
  }
  // The balanced layout: chunks r and 2N - 1 - r of 2N.
  const std::int64_t chunk = t / (2 * n);
  for (const std::int64_t c : {static_cast<std::int64_t>(rank), static_cast<std::int64_t>(2 * n - 1 - rank)})
    for (std::int64_t i = 0; i < chunk; ++i) out.push_back(c * chunk + i);
  return out;
}

Tensor ContextParallel::shard(const Tensor& x) const {
  if (size() == 1) return x;
  if (x.shape().size() < 2) throw std::invalid_argument("ContextParallel::shard: needs [B, T, ...], got " + shape_string(x.shape()));
  const std::int64_t b = x.dim(0), t = x.dim(1), row = x.numel() / (b * t);
  const auto mine = positions(t);
  const auto whole = x.to_host();
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(b * static_cast<std::int64_t>(mine.size()) * row));
  for (std::int64_t s = 0; s < b; ++s)
    for (const std::int64_t p : mine)
      for (std::int64_t k = 0; k < row; ++k) out.push_back(whole[static_cast<std::size_t>((s * t + p) * row + k)]);
  Shape shape = x.shape();
  shape[1] = static_cast<std::int64_t>(mine.size());
  return Tensor::from_host(out, shape, x.device(), x.dtype());
}

std::int64_t ContextParallel::bytes_per_attention(std::int64_t batch, std::int64_t t, std::int64_t c,
                                                  std::int64_t element_bytes, bool forward_twice) const {
  const std::int64_t n = size(), shard = batch * (t / n) * c * element_bytes;
  if (n == 1) return 0;
  const std::int64_t forward = method_ == ContextMethod::ulysses ? 4 * shard : 2 * (n - 1) * shard;
  const std::int64_t backward = method_ == ContextMethod::ulysses ? 4 * shard : (4 * (n - 1) + 2) * shard;
  return (forward_twice ? 2 : 1) * forward + backward;
}

std::int64_t context_parallel_length(std::int64_t t, int size, ContextMethod method) {
  const std::int64_t pieces = method == ContextMethod::ring && size > 1 ? 2 * size : size;
  return (t + pieces - 1) / pieces * pieces;
}

Tensor all_to_all(const Tensor& x, comm::Communicator& group, std::int64_t* counter) {
  if (group.size() == 1) return x;
  if (x.shape().empty() || x.dim(0) != group.size())
    throw std::invalid_argument("all_to_all: the first dimension must be the group's " + std::to_string(group.size()) +
                                " ranks, got " + shape_string(x.shape()));
  const auto exchange = [&group, counter](const Tensor& t) {
    if (counter) *counter += static_cast<std::int64_t>(t.nbytes());
    Tensor out = Tensor::empty(t.shape(), t.device(), t.dtype());
    group.all_to_all(t, out);
    return out;
  };
  return autograd::record(exchange(x.detach()), "all_to_all", {x},
                          [exchange](const Tensor& g) { return std::vector<Tensor>{exchange(g)}; });
}

namespace {

// Ulysses: sequence shards to head shards, attention on this rank's heads over the whole sequence, and
// back. The shards are contiguous and in rank order, so the gathered sequence is in order.
Tensor ulysses(const Tensor& qkv, std::int64_t n_head, comm::Communicator& group, bool keep_probabilities,
               std::int64_t* bytes) {
  const std::int64_t n = group.size(), b = qkv.dim(0), shard = qkv.dim(1), c = qkv.dim(2) / 3, width = c / n;
  // [B, T/N, 3, N, C/N]: q's, k's and v's columns of each rank's heads -> [N, B, T/N, 3, C/N], slice d for rank d.
  Tensor x = permute(reshape(qkv, {b, shard, 3, n, width}), {3, 0, 1, 2, 4});
  x = all_to_all(x, group, bytes);  // slice s: rank s's tokens of this rank's heads
  x = reshape(permute(x, {1, 0, 2, 3, 4}), {b, n * shard, 3 * width});  // [B, T, 3 C/N], c_attn's layout for H/N heads
  Tensor y = scaled_dot_product_attention(x, n_head / n, /*is_causal=*/true, 0.0f, 0, keep_probabilities);  // [B, T, C/N]
  y = permute(reshape(y, {b, n, shard, width}), {1, 0, 2, 3});  // slice d: rank d's tokens
  y = all_to_all(y, group, bytes);                                // slice s: rank s's heads of this rank's tokens
  return reshape(permute(y, {1, 2, 0, 3}), {b, shard, c});
}

// The ring: this rank's queries stay, the blocks of keys and values go round (to the next rank, from the
// one before), each folded into the online softmax on arrival; one autograd node with its own backward.
Tensor ring(const ContextParallel& cp, const Tensor& qkv_in, std::int64_t n_head, std::int64_t* bytes) {
  const Tensor qkv = autocast_input("attention", qkv_in);
  comm::Communicator& group = cp.group();
  const int n = group.size(), r = group.rank(), next = (r + 1) % n, previous = (r + n - 1) % n;
  const Device device = qkv.device();
  const std::int64_t b = qkv.dim(0), shard = qkv.dim(1), c = qkv.dim(2) / 3, t = shard * n;
  // --fault ring-drop-block: the last block to arrive is left out, in forward and in backward.
  const bool drop = n > 1 && faults::active("ring-drop-block");
  AttentionBlockShape s;
  s.batch = b, s.heads = n_head, s.head_size = c / n_head, s.queries = shard, s.keys = shard, s.causal = true;
  std::vector<Tensor> positions;  // of each rank's tokens, where the kernels read them
  for (int rank = 0; rank < n; ++rank) {
    std::vector<float> p;
    for (const std::int64_t i : cp.positions(t, rank)) p.push_back(static_cast<float>(i));
    positions.push_back(Tensor::from_host(p, {shard}, device));
  }
  const auto e = static_cast<std::size_t>(b * shard * c);
  Kernels& kernel = kernels(device);
  Tensor qkv3, y, lse;  // [3, B, T/N, C]: q, then k and v, each token's heads side by side
  {
    autograd::NoGradGuard no_grad;
    qkv3 = permute(reshape(qkv.to(DType::float32), {b, shard, 3, c}), {2, 0, 1, 3});
    Tensor kv = Tensor::empty({2, b, shard, c}, device);
    kv.copy_from(qkv3.view(e, {2, b, shard, c}));
    Tensor row_max = Tensor::full({b, n_head, shard}, -std::numeric_limits<float>::infinity(), device);
    Tensor row_sum = Tensor::zeros({b, n_head, shard}, device);
    y = Tensor::zeros({b, shard, c}, device);
    for (int j = 0; j < n; ++j) {
      const int owner = (r - j + n) % n;  // whose keys and values this rank holds at hop j
      if (!(drop && j == n - 1))
        kernel.attention_block(qkv3.data(), kv.data(), kv.data() + e, positions[static_cast<std::size_t>(r)].data(),
                               positions[static_cast<std::size_t>(owner)].data(), s, row_max.data(), row_sum.data(), y.data());
      if (j + 1 < n) {
        Tensor arriving = Tensor::empty(kv.shape(), device);
        group.send_recv(kv, next, arriving, previous, j);
        *bytes += static_cast<std::int64_t>(kv.nbytes());
        kv = arriving;
      }
    }
    lse = Tensor::empty({b, n_head, shard}, device);
    kernel.attention_block_finish(row_max.data(), row_sum.data(), s, y.data(), lse.data());
  }
  return autograd::record(y.to(qkv.dtype()), "ring_attention", {qkv}, [&group, qkv3, y, lse, positions, s, e, r, n, next,
                                                                       previous, bytes, drop, dtype = qkv.dtype()](const Tensor& g) {
    const Device device = qkv3.device();
    Kernels& kernel = kernels(device);
    const Tensor dy = g.to(DType::float32);
    // Travelling with each block: its keys and values, then their gradients so far.
    Tensor block = Tensor::zeros({4, s.batch, s.queries, s.heads * s.head_size}, device);
    block.view(0, {2, s.batch, s.queries, s.heads * s.head_size}).copy_from(qkv3.view(e, {2, s.batch, s.queries, s.heads * s.head_size}));
    Tensor grad = Tensor::zeros(qkv3.shape(), device);  // [3, B, T/N, C]: dq here; dk, dv when they come home
    for (int j = 0; j < n; ++j) {
      const int owner = (r - j + n) % n;
      float* at = block.data();
      if (!(drop && j == n - 1))
        kernel.attention_block_backward(qkv3.data(), at, at + e, positions[static_cast<std::size_t>(r)].data(),
                                        positions[static_cast<std::size_t>(owner)].data(), y.data(), lse.data(), dy.data(),
                                        s, grad.data(), at + 2 * e, at + 3 * e);
      if (j + 1 < n) {
        Tensor arriving = Tensor::empty(block.shape(), device);
        group.send_recv(block, next, arriving, previous, n + j);
        *bytes += static_cast<std::int64_t>(block.nbytes());
        block = arriving;
      } else if (n > 1) {  // the block of rank r + 1 is here: its gradients go home, this rank's arrive
        Tensor arriving = Tensor::empty({2 * static_cast<std::int64_t>(e)}, device);
        group.send_recv(block.view(2 * e, {2 * static_cast<std::int64_t>(e)}), next, arriving, previous, 2 * n);
        *bytes += static_cast<std::int64_t>(arriving.nbytes());
        grad.view(e, {2 * static_cast<std::int64_t>(e)}).copy_from(arriving);
      } else {
        grad.view(e, {2 * static_cast<std::int64_t>(e)}).copy_from(block.view(2 * e, {2 * static_cast<std::int64_t>(e)}));
      }
    }
    autograd::NoGradGuard no_grad;
    Tensor packed = reshape(permute(grad, {1, 2, 0, 3}), {s.batch, s.queries, 3 * s.heads * s.head_size});
    return std::vector<Tensor>{packed.to(dtype)};
  });
}

}  // namespace

Tensor ContextParallel::attention(const Tensor& qkv, std::int64_t n_head, bool keep_probabilities) const {
  if (qkv.shape().size() != 3 || n_head < 1 || qkv.dim(2) % (3 * n_head) != 0)
    throw std::invalid_argument("ContextParallel::attention: qkv must be [B, T/N, 3C] with C a multiple of " +
                                std::to_string(n_head) + " heads, got " + shape_string(qkv.shape()));
  check(qkv.dim(1) * size(), n_head);
  if (method_ == ContextMethod::ulysses) {
    if (size() == 1) return scaled_dot_product_attention(qkv, n_head, true, 0.0f, 0, keep_probabilities);
    return ulysses(qkv, n_head, group_, keep_probabilities, &bytes_);
  }
  return ring(*this, qkv, n_head, &bytes_);
}

}  // namespace course::parallel
