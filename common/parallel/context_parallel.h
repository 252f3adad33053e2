// Context parallelism: the sequence split across the ranks of a context-parallel group, for sequences
// whose activations do not fit one rank. Everything in a GPT block but attention works token by token,
// so each rank runs it on its shard of the tokens as it is; attention needs every key for every query,
// and there are two ways to give it them:
//   Ulysses (Jacobs et al., "DeepSpeed Ulysses", 2023): an all-to-all turns the sequence shards of q, k
//     and v into head shards (each rank all tokens of H / N heads), attention runs unchanged on those
//     heads, and a second all-to-all turns its output back into sequence shards. Each rank sends 4/N of
//     its activations per all-to-all whatever N is; the heads must divide by N.
//   Ring (Liu et al., "Ring Attention with Blockwise Transformers", 2023): the ranks keep their queries
//     and pass blocks of keys and values around a ring, each rank folding every block into an online
//     softmax (kernels.h, attention_block); backward passes the blocks round again with their gradients.
//     Nothing of size T x T is kept, and no restriction on the heads; N - 1 hops forward, N backward.
// With the causal mask, contiguous shards would give the last rank N times the first rank's work; the
// ring uses the balanced layout of Megatron-LM's context parallelism instead: the sequence cut into 2N
// chunks, rank r holding chunks r and 2N - 1 - r, so every rank has the same number of visible
// (query, key) pairs. Ulysses computes every token of its heads, so it keeps contiguous shards.
// Parameters are whole on every rank of the group, each rank's gradient a partial sum over its tokens:
// the gradients are averaged over the data-parallel and the context-parallel ranks together
// (Topology::dp_cp_group), as Megatron-LM does.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/comm/communicator.h"

namespace course::parallel {

enum class ContextMethod { ulysses, ring };
// "ulysses" | "ring"; throws UsageError naming --cp-method otherwise.
ContextMethod parse_context_method(const std::string& name);
const char* context_method_name(ContextMethod method);

class ContextParallel {
 public:
  ContextParallel(comm::Communicator& group, ContextMethod method);
  comm::Communicator& group() const { return group_; }
  ContextMethod method() const { return method_; }
  int size() const { return group_.size(); }

  // check_context_parallel for this group's size and method.
  void check(std::int64_t t, std::int64_t heads) const;

  // The positions in the sequence of the tokens that `rank` holds, in the order it holds them.
  std::vector<std::int64_t> positions(std::int64_t t, int rank) const;
  std::vector<std::int64_t> positions(std::int64_t t) const { return positions(t, group_.rank()); }
  // This rank's tokens of x [B, T, ...] (ids; targets as [B, T]): [B, T / N, ...]. Not differentiable.
  Tensor shard(const Tensor& x) const;

  // Causal self-attention of this rank's shard of the packed projection qkv [B, T / N, 3C] (c_attn's
  // layout, scaled_dot_product_attention's) with `n_head` heads: [B, T / N, C], this rank's tokens of
  // the whole sequence's attention. `keep_probabilities` as scaled_dot_product_attention's (Ulysses
  // keeps its heads' probabilities unless false; the ring never keeps any).
  Tensor attention(const Tensor& qkv, std::int64_t n_head, bool keep_probabilities = true) const;

  // What one attention forward and backward hands to the group's collectives and sends, per rank, for a
  // micro-batch of `batch` sequences of `t` tokens and width `c` in elements of `element_bytes` (what
  // Communicator::bytes_sent counts: an all-to-all's whole input):
  //   Ulysses: 4 all-to-alls of B (T/N) 3C or B (T/N) C elements: 8 B (T/N) C.
  //   Ring:    forward N - 1 hops of k and v (2 B (T/N) C each); backward N - 1 hops of k, v and their
  //            gradients (4 B (T/N) C) and a last hop of the gradients home (2 B (T/N) C): (6N - 4) B (T/N) C.
  // With `forward_twice` (full recomputation runs every block's forward again in backward), the
  // forward's part twice.
  std::int64_t bytes_per_attention(std::int64_t batch, std::int64_t t, std::int64_t c, std::int64_t element_bytes,
                                   bool forward_twice = false) const;
  // What this object's attention has handed to the group so far (the same count as bytes_sent's, of
  // this traffic alone: the group may carry other traffic too). Ulysses' all-to-alls carry qkv's type
  // (16 bits under autocast), the ring's blocks float32.
  std::int64_t bytes_sent() const { return bytes_; }

 private:
  comm::Communicator& group_;
  ContextMethod method_;
  mutable std::int64_t bytes_ = 0;
};

// Throws UsageError naming the flag when a sequence of `t` tokens or `heads` heads (those of one
// tensor-parallel rank) cannot be split among `size` ranks by `method`: t must divide by N (Ulysses) or
// 2N (ring), the heads by N (Ulysses).
void check_context_parallel(std::int64_t t, std::int64_t heads, int size, ContextMethod method);

// The sequence length that `size` context-parallel ranks can split by `method`: t rounded up to a
// multiple of size (Ulysses) or 2 size (the ring's balanced chunks). Sequences are padded to it at the
// end, the padding's targets ignored: under the causal mask no real token sees a later one, so the
// padding changes no real token's output (as Megatron-LM pads to a multiple of 2 CP).
std::int64_t context_parallel_length(std::int64_t t, int size, ContextMethod method);

// The all-to-all as an op (Communicator::all_to_all): x [N, ...] sends slice d to rank d and returns
// [N, ...] whose slice s came from rank s. Its gradient is the same exchange of the gradient.
// `counter`, when given, adds the bytes handed to the group, forward and backward.
Tensor all_to_all(const Tensor& x, comm::Communicator& group, std::int64_t* counter = nullptr);

}  // namespace course::parallel
