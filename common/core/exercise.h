// A workshop exercise not written yet. In the participant's copy of the course (scripts/exercises.py
// release) each exercise region is replaced by one call of exercise::not_done, which says which exercise
// the run reached, where it lives and where its handout is, on one line, and ends the process with its
// own exit code. Ranks that reach it together leave together; a rank that reaches it alone (an exercise
// only one rank runs) says the line itself and ends the job within seconds.
#pragma once

namespace course::exercise {

// The exit code of a run that reached an exercise not written yet (0 passed, 1 failed, 2 bad input).
inline constexpr int kNotDone = 3;

// "exercise 02.1 (what, where) is not done yet; see handout" on stderr (once under mpirun when every rank
// reaches it; by each that reached it otherwise), then exit(kNotDone). `where`: the region's file and line from the repository's root.
[[noreturn]] void not_done(const char* id, const char* what, const char* where, const char* handout);
// The same, handed the inputs the exercise is to use (the stub of a function's body passes its
// parameters, so the participant's copy compiles without a warning for each).
template <class... Inputs>
[[noreturn]] void not_done(const char* id, const char* what, const char* where, const char* handout, const Inputs&...) {
  not_done(id, what, where, handout);
}

}  // namespace course::exercise
