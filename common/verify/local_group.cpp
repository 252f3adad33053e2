// The members' collectives: each posts its call and a host copy of its input; the last to arrive
// computes every member's result, in rank order, and wakes the others.
#include "common/verify/local_group.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/comm/algorithms.h"
#include "common/kernels/half.h"

namespace course::verify {

using namespace comm;  // the communicator it implements, in comm's own terms

class Turns {
 public:
  std::mutex mutex;  // the turn: held by the thread that computes
  std::condition_variable changed;
  long run = 0;  // which run of run_in_turns
  int threads = 0, waiting = 0, finished = 0;
  bool failed = false;  // a thread threw
  bool stuck = false;   // every thread left waits at a collective that none of them can complete
  bool everyone_waits() const { return waiting > 0 && waiting + finished == threads; }
};

std::shared_ptr<Turns> make_turns() { return std::make_shared<Turns>(); }

namespace {
// Set on each thread of a run: its hold on the turn, and whose turns they are.
thread_local std::unique_lock<std::mutex>* t_turn = nullptr;
thread_local Turns* t_turns = nullptr;

// A thread's wait that ended because another thread failed: the other's error is the one to report.
struct MemberFailed : std::runtime_error {
  MemberFailed() : std::runtime_error("LocalGroup: another thread of the run failed") {}
};
}  // namespace

struct LocalGroup::Exchange {
  explicit Exchange(int n) : posted(static_cast<std::size_t>(n)), inputs(posted.size()), results(posted.size()) {}
  std::vector<Collective> posted;  // this round's call of each member
  std::vector<Tensor> inputs;      // their inputs, copied to the host
  std::vector<Tensor> results;     // each member's output on the host (undefined: left as it is)
  int arrived = 0;
  long round = 0;
  long run = -1;  // the run of the turns whose round this is (a failed run may leave one half posted)
  int size() const { return static_cast<int>(posted.size()); }
};

namespace {

Tensor host_copy(const Tensor& t) {
  const Tensor host = t.to(Device::cpu);
  return host.impl() == t.impl() ? t.clone() : host;
}

// Slice `index` of `count` equal slices of a host tensor, as a host tensor of `shape`.
Tensor slice(const Tensor& t, int index, int count, const Shape& shape) {
  const std::size_t n = static_cast<std::size_t>(t.numel()) / static_cast<std::size_t>(count);
  return t.flat_view(static_cast<std::size_t>(index) * n, n).view(0, shape).clone();
}

// The inputs laid one after the other in rank order, shaped as `shape`.
Tensor concatenate(const std::vector<Tensor>& inputs, const Shape& shape) {
  Tensor out = Tensor::empty(shape, Device::cpu, inputs.front().dtype());
  auto* at = static_cast<char*>(out.raw());
  for (const Tensor& in : inputs) {
    std::memcpy(at, in.raw(), in.nbytes());
    at += in.nbytes();
  }
  return out;
}

// The ring's reduce-scatter run over every member's values at once, step by step
// (algorithms::reduce_scatter_step, the schedule the MPI backend's ring follows on each rank): values[r]
// is member r's copy; in each step every member adds the partial its predecessor sends into its own
// values of that chunk, add(partial, own). Then out[i] of chunk c is member c's complete sum.
template <class Value, class Add>
void ring_sums(std::vector<std::vector<Value>>& values, std::size_t n, Value* out, Add add) {
  const int members = static_cast<int>(values.size());
  for (int s = 0; s + 1 < members; ++s)
    for (int r = 0; r < members; ++r) {
      // The predecessor sends this chunk's partial in this step, and writes only another chunk in it.
      const auto chunk = algorithms::chunk_of(n, members, algorithms::reduce_scatter_step(r, s, members).receive);
      const std::vector<Value>& partial = values[static_cast<std::size_t>((r + members - 1) % members)];
      std::vector<Value>& own = values[static_cast<std::size_t>(r)];
      for (std::size_t i = chunk.begin; i < chunk.end; ++i) own[i] = add(partial[i], own[i]);
    }
  for (int c = 0; c < members; ++c) {
    const auto chunk = algorithms::chunk_of(n, members, c);
    std::copy(values[static_cast<std::size_t>(c)].begin() + static_cast<std::ptrdiff_t>(chunk.begin),
              values[static_cast<std::size_t>(c)].begin() + static_cast<std::ptrdiff_t>(chunk.end), out + chunk.begin);
  }
}

// The reduction of the inputs element by element, as the MPI backend computes it (the file's comment).
Tensor reduce(const std::vector<Tensor>& inputs, ReduceOp op) {
  const DType dtype = inputs.front().dtype();
  const auto n = static_cast<std::size_t>(inputs.front().numel());
  const float inverse = 1.0f / static_cast<float>(inputs.size());
  Tensor out = inputs.front().clone();
  const int members = static_cast<int>(inputs.size());
  if (dtype == DType::float32) {
    float* acc = out.data();
    if (op == ReduceOp::max) {
      for (std::size_t k = 1; k < inputs.size(); ++k) {
        const float* x = inputs[k].data();
        for (std::size_t i = 0; i < n; ++i) acc[i] = x[i] > acc[i] || std::isnan(x[i]) ? x[i] : acc[i];
      }
      return out;
    }
    // Sums in the ring's order, as an MPI group that adds in it (Communicator::add_in_ring_order); an
    // average divided once.
    std::vector<std::vector<float>> values;
    for (const Tensor& in : inputs) values.emplace_back(in.data(), in.data() + n);
    ring_sums(values, n, acc, [](float partial, float own) { return partial + own; });
    if (op == ReduceOp::average)
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] * inverse;
    return out;
  }
  const bool fp16 = dtype == DType::float16;
  const auto widen = [fp16](std::uint16_t b) { return fp16 ? half::from_float16(b) : half::from_bfloat16(b); };
  const auto narrow = [fp16](float v) { return fp16 ? half::to_float16(v) : half::to_bfloat16(v); };
  std::uint16_t* acc = out.data16();
  if (op == ReduceOp::max) {
    for (int k = 1; k < members; ++k) {
      const std::uint16_t* x = inputs[static_cast<std::size_t>(k)].data16();
      for (std::size_t i = 0; i < n; ++i) {
        const float a = widen(x[i]), b = widen(acc[i]);
        acc[i] = narrow(a > b || std::isnan(a) ? a : b);
      }
    }
    return out;
  }
  // Sums in the ring's order, as the MPI backend adds them, each partial rounded to 16 bits; an
  // average's values first multiplied by 1/N and rounded.
  std::vector<std::vector<std::uint16_t>> values;
  for (const Tensor& in : inputs) {
    values.emplace_back(in.data16(), in.data16() + n);
    if (op == ReduceOp::average)
      for (std::uint16_t& b : values.back()) b = narrow(widen(b) * inverse);
  }
  ring_sums(values, n, acc, [&](std::uint16_t partial, std::uint16_t own) { return narrow(widen(partial) + widen(own)); });
  return out;
}

// Every member's result of this round (all have posted).
void compute(LocalGroup::Exchange& e) {
  const int n = e.size();
  const Collective& first = e.posted.front();
  for (int k = 1; k < n; ++k)
    if (e.posted[static_cast<std::size_t>(k)].kind != first.kind)
      throw std::logic_error(std::string("LocalGroup: member ") + std::to_string(k) + " called " +
                             op_name(e.posted[static_cast<std::size_t>(k)].kind) + " while member 0 called " + op_name(first.kind));
  std::vector<Tensor>& out = e.results;
  for (Tensor& r : out) r = Tensor();
  const auto at = [](auto& v, int k) -> decltype(v[0]) { return v[static_cast<std::size_t>(k)]; };
  switch (first.kind) {
    case OpKind::all_reduce: {
      const Tensor sum = reduce(e.inputs, first.op);
      for (Tensor& r : out) r = sum;
      break;
    }
    case OpKind::reduce:
      at(out, first.root) = reduce(e.inputs, first.op);
      break;
    case OpKind::broadcast:
      for (Tensor& r : out) r = at(e.inputs, first.root);
      break;
    case OpKind::all_gather:
      for (int k = 0; k < n; ++k) at(out, k) = concatenate(e.inputs, at(e.posted, k).output.shape());
      break;
    case OpKind::gather:
      at(out, first.root) = concatenate(e.inputs, at(e.posted, first.root).output.shape());
      break;
    case OpKind::reduce_scatter: {
      const Tensor whole = reduce(e.inputs, first.op);  // element by element, so the slices are the sums of slices
      for (int k = 0; k < n; ++k) at(out, k) = slice(whole, k, n, at(e.posted, k).output.shape());
      break;
    }
    case OpKind::scatter:
      for (int k = 0; k < n; ++k) at(out, k) = slice(at(e.inputs, first.root), k, n, at(e.posted, k).output.shape());
      break;
    case OpKind::all_to_all:
      for (int k = 0; k < n; ++k) {
        std::vector<Tensor> pieces;
        for (int j = 0; j < n; ++j) {
          const Tensor& in = at(e.inputs, j);
          pieces.push_back(slice(in, k, n, {in.numel() / n}));
        }
        at(out, k) = concatenate(pieces, at(e.posted, k).output.shape());
      }
      break;
    case OpKind::send_recv:
      for (int k = 0; k < n; ++k) {
        const int source = at(e.posted, k).peer;
        if (at(e.posted, source).root != k)
          throw std::logic_error("LocalGroup: member " + std::to_string(k) + " receives from " + std::to_string(source) +
                                 ", which sends elsewhere");
        at(out, k) = at(e.inputs, source);
      }
      break;
    case OpKind::barrier:
      break;
    case OpKind::send:
    case OpKind::recv:
      throw std::logic_error("LocalGroup: lone sends and receives are not supported (send_recv is)");
  }
}

class Member final : public Communicator {
 public:
  Member(LocalGroup::Exchange& e, Turns& turns, int rank, int size)
      : Communicator(Placement{rank, size, rank, size, 0, 1}), e_(e), turns_(turns) {}
  std::string backend_name() const override { return "in-process"; }

 protected:
  WorkHandle start(const Collective& c) override {
    if (c.kind == OpKind::send || c.kind == OpKind::recv)
      throw std::logic_error("LocalGroup: lone sends and receives are not supported (send_recv is)");
    if (c.element != Element::float32) throw std::logic_error("LocalGroup: packed 16-bit buffers are not supported");
    std::unique_lock<std::mutex>* turn = t_turn;
    if (!turn || t_turns != &turns_) throw std::logic_error("LocalGroup: a member's collective outside a run of its group's turns");
    Turns& t = turns_;
    if (e_.run != t.run) e_.arrived = 0, e_.run = t.run;
    const auto me = static_cast<std::size_t>(rank());
    e_.posted[me] = c;
    e_.inputs[me] = c.input.defined() ? host_copy(c.input) : Tensor();
    if (++e_.arrived == e_.size()) {
      e_.arrived = 0;
      compute(e_);
      ++e_.round;
      t.waiting -= e_.size() - 1;  // the others may go on (counted here, so no one mistakes them for stuck)
      t.changed.notify_all();
    } else {
      const long round = e_.round;
      ++t.waiting;
      if (t.everyone_waits()) {
        t.stuck = true;
        t.changed.notify_all();
      }
      t.changed.wait(*turn, [&] { return e_.round != round || t.failed || t.stuck; });
      if (e_.round == round) {
        --t.waiting;
        if (t.failed) throw MemberFailed();
        throw std::logic_error(std::string("LocalGroup: member ") + std::to_string(rank()) + " called " + op_name(c.kind) +
                               ", which no thread left running calls");
      }
    }
    if (e_.results[me].defined()) {
      Tensor output = c.output;  // a handle to the caller's tensor
      output.copy_from(e_.results[me]);
    }
    return completed_work();
  }
  std::unique_ptr<Communicator> split_group(int, int) override {
    throw std::logic_error("LocalGroup: its members cannot be split (make a group for each)");
  }

 private:
  LocalGroup::Exchange& e_;
  Turns& turns_;
};

}  // namespace

void run_in_turns(Turns& turns, int n, const std::function<void(int thread)>& work) {
  {
    std::lock_guard<std::mutex> lock(turns.mutex);
    ++turns.run;
    turns.threads = n;
    turns.waiting = turns.finished = 0;
    turns.failed = turns.stuck = false;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      std::unique_lock<std::mutex> turn(turns.mutex);
      t_turn = &turn;
      t_turns = &turns;
      try {
        work(i);
      } catch (...) {
        errors[static_cast<std::size_t>(i)] = std::current_exception();
        turns.failed = true;
      }
      t_turn = nullptr;
      t_turns = nullptr;
      ++turns.finished;
      if (turns.everyone_waits()) turns.stuck = true;
      turns.changed.notify_all();
    });
  for (std::thread& t : threads) t.join();
  std::exception_ptr first;  // the first thread's own error, before any that only followed another's
  for (const std::exception_ptr& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const MemberFailed&) {
      if (!first) first = error;
    } catch (...) {
      std::rethrow_exception(error);
    }
  }
  if (first) std::rethrow_exception(first);
}

LocalGroup::LocalGroup(int size, std::shared_ptr<Turns> turns)
    : turns_(turns ? std::move(turns) : make_turns()), exchange_(std::make_unique<Exchange>(size)) {
  if (size < 1) throw std::invalid_argument("LocalGroup: a group needs a member");
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(*exchange_, *turns_, r, size));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::member(int rank) { return *members_.at(static_cast<std::size_t>(rank)); }

void LocalGroup::run(const std::function<void(Communicator& member)>& work) {
  run_in_turns(*turns_, size(), [&](int r) { work(member(r)); });
}

}  // namespace course::verify
