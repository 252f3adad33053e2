// COURSE_CHECK_COLLECTIVES=1: before every collective the ranks compare what they are about to run, the
// idea of PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL. Ranks that disagree (one broadcasts from another
// root, reduces another count, or calls another collective, having skipped one) would wait for each other
// forever, or silently mix unrelated data; with the check every rank stops at once with the same line,
// which names the collective and what each rank gave. It costs one small all-gather per collective:
// for the workshop's graded tests (tests/CMakeLists.txt, course_exercise) and for debugging, not for speed.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/comm/communicator.h"
#include "common/core/errors.h"  // UsageError

namespace course::comm {
namespace {

// What every rank must agree on. (Not the collective's number: every check is itself a collective of
// them all, so the ranks' counts advance together; a rank that skipped a collective shows as the next one
// it calls, of another kind, or as a wait the watchdog ends.)
enum Field { kKind, kRoot, kOp, kElement, kDType, kCount, kFields };
const char* const kFieldNames[kFields] = {"collective", "root", "reduction", "packed element type", "element type",
                                          "element count"};

bool rooted(OpKind k) { return k == OpKind::broadcast || k == OpKind::reduce || k == OpKind::scatter || k == OpKind::gather; }
bool reduces(OpKind k) { return k == OpKind::reduce || k == OpKind::all_reduce || k == OpKind::reduce_scatter; }

// The tensor whose size every rank shares, or none (scatter's and gather's are the root's alone).
const Tensor* shared_tensor(const Collective& c) {
  switch (c.kind) {
    case OpKind::broadcast:
    case OpKind::reduce:
    case OpKind::all_reduce:
    case OpKind::all_gather:
    case OpKind::all_to_all: return &c.input;
    case OpKind::reduce_scatter: return &c.output;
    default: return nullptr;
  }
}

std::string value_text(int field, float value) {
  const int v = static_cast<int>(value);
  switch (field) {
    case kKind: return op_name(static_cast<OpKind>(v));
    case kOp: return reduce_op_name(static_cast<ReduceOp>(v));
    case kDType: return v < 0 ? "none" : dtype_name(static_cast<DType>(v));
    default: return std::to_string(v);
  }
}

}  // namespace

bool Communicator::consistency_checks() {
  static const bool on = [] {
    const char* value = std::getenv("COURSE_CHECK_COLLECTIVES");
    if (!value || !*value || std::strcmp(value, "0") == 0) return false;
    if (std::strcmp(value, "1") == 0) return true;
    throw UsageError(std::string("COURSE_CHECK_COLLECTIVES: '") + value + "' is not 0 or 1");  // exit code 2
  }();
  return on;
}

void Communicator::check_consistency(const Collective& c) {
  if (c.kind == OpKind::send || c.kind == OpKind::recv || c.kind == OpKind::send_recv) return;  // not collective
  const long sequence = ++collectives_;  // this group's collectives so far, to name this one
  const Tensor* shared = shared_tensor(c);
  const bool sized = shared && shared->defined();
  float mine[kFields] = {static_cast<float>(c.kind),
                         rooted(c.kind) ? static_cast<float>(c.root) : 0.0f,
                         reduces(c.kind) ? static_cast<float>(c.op) : 0.0f,
                         static_cast<float>(c.element),
                         sized ? static_cast<float>(shared->dtype()) : -1.0f,
                         sized ? static_cast<float>(shared->numel()) : 0.0f};
  Tensor fingerprint = Tensor::from_host(std::vector<float>(mine, mine + kFields), {kFields});
  Tensor table = Tensor::zeros({static_cast<std::int64_t>(kFields) * size()});
  start({OpKind::all_gather, fingerprint, table})->wait();  // straight to the backend: not itself checked
  const std::vector<float> all = table.to_host();
  for (int field = 0; field < kFields; ++field) {
    bool same = true;
    for (int r = 1; r < size(); ++r) same = same && all[static_cast<std::size_t>(r * kFields + field)] == all[static_cast<std::size_t>(field)];
    if (same) continue;
    std::string message = std::string(op_name(c.kind)) + " #" + std::to_string(sequence) +
                          " (COURSE_CHECK_COLLECTIVES): the ranks disagree on the " + kFieldNames[field] + ":";
    for (int r = 0; r < size(); ++r)
      message += std::string(r ? "," : "") + " rank " + std::to_string(r) + " gives " +
                 value_text(field, all[static_cast<std::size_t>(r * kFields + field)]);
    throw std::logic_error(message);  // on every rank alike: each saw the same table
  }
}

}  // namespace course::comm
