// The run's fault: --fault NAME from --fault-from-step K, a bug made on purpose so that --verify can be
// seen, and tested, to catch one that begins at any step. One per process, armed once from the flags
// (cli::arm_faults) before the first step. The loop never mentions it: the step it is at comes
// from the loop's own markers (verify::StepCheck's begin_step and check_update, which every chapter
// calls, checked or not), and the fault acts where the chapter installed it below its fence, through
// the seams that exist: a communicator decorator (communicator.h), a communication hook, a hook at the
// end of a step, or the layer code itself asking `active`.
//
// A fault of the layer code acts wherever that code runs in the process (a reference that runs the same
// layers makes the same mistake, as it would with a real bug: only one that shares none of that code
// sees it). Code that asks with `this` asks for a fault of its own object: that acts only on the objects
// the chapter placed it on (`place`: the run's model, not the reference's), and nowhere if none.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace course::faults {

// From the flags, once: `name` ("none": no fault) acts from step `from_step` on.
void arm(const std::string& name, std::int64_t from_step);
// Whether the armed fault is `name`, at any step: to install its seam only when it is the run's.
bool armed(std::string_view name);
// Whether fault `name` acts now: it is armed, the step begun is `from_step` or later, and, asked for an
// object (`where`), it was placed on that object.
bool active(std::string_view name, const void* where = nullptr);

// The loop's markers (verify::StepCheck calls them): step `step` begins (the hooks of `on_step_begin`
// run then, before the check reads the step's parameters); step `step`'s update is done (the hooks of
// `on_step_end` run then, before the check judges the update). Hooks run at the steps the fault is
// active in.
void begin_step(std::int64_t step);
void end_step(std::int64_t step);
// The step begun last, and the first step the armed fault acts in.
std::int64_t step();
std::int64_t first_step();

// What a chapter installs below its fence, for as long as the Installation lives (a run's life): the
// objects the armed fault acts on, and what it does once a step's update is done while it is active.
class Installation {
 public:
  Installation() = default;
  Installation(Installation&& other) noexcept;
  Installation& operator=(Installation&& other) noexcept;
  ~Installation();
  void place(const void* where);
  void on_step_begin(std::function<void()> hook);
  void on_step_end(std::function<void()> hook);

 private:
  void clear();
  std::vector<const void*> places_;
  std::vector<int> hooks_;  // of either kind (faults.cpp numbers them apart)
};

// For a test: `name` armed from step 0 for the life of the scope (and the step begun, 0).
class Armed {
 public:
  explicit Armed(const std::string& name);
  ~Armed();
  Armed(const Armed&) = delete;
  Armed& operator=(const Armed&) = delete;
};

}  // namespace course::faults
