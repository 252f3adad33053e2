#!/usr/bin/env python3
"""scripts/exercises.py and the course's exercise regions, checked without building the course:

  exercises_test.py COMPILER BUILD INCLUDE...

- every region is well formed (a task comment, one BEGIN, one END) and has graded tests registered;
- `release` writes a repository of one commit, without the common mistakes, whose regions are stubs that name their exercise, file,
  line and handout, with no line of the solution left, and which the compiler accepts (-Wall -Wextra, no
  warning) in every file that holds a region;
- `solution` prints a region's lines, `release` refuses a folder that exists, a malformed region is one
  line and exit code 2;
- every exercise has a common mistake (tests/mistakes/), each of them well formed and fitting its regions
  (that its graded tests fail is `exercises.py mistakes`, which builds: CI runs it);
- the participant's copy holds no hidden test (tests/hidden/), its handouts' line citations still name
  the lines they name in the course (moved with the stubs), and `grade` refuses bad input with one line
  and exit code 2 before it writes anything (that it grades is `exercises.py selftest`, which builds);
- a submitted file is read only as a plain file inside its submission, and a region that is not code is
  named.
Exit code 0 when all hold, 1 otherwise.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts"))
import exercises  # noqa: E402
from checks import check, failures  # noqa: E402  (tests/, beside this file)


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "exercises.py"), *args], capture_output=True,
                          text=True, cwd=cwd)


def main():
    compiler, build, includes = sys.argv[1], sys.argv[2], sys.argv[3:]
    found = exercises.find()
    check(len(found) > 0, "the course holds exercises")
    graded = exercises.registered()
    for ex in found.values():
        check(ex.id in graded, f"exercise {ex.id} has graded tests (course_exercise)")
        check(ex.id[:2] == str(ex.path)[:2] or ex.chapter == "common", f"exercise {ex.id} lives in its chapter")
    if not exercises.MISTAKES.is_dir():
        # A participant's copy (release leaves the mistakes out): its regions are the participant's to fill,
        # so what is left to hold is their shape, checked above.
        done = sum(ex.done for ex in found.values())
        print(f"{'PASSED' if not failures else 'FAILED'}: a participant's copy, {done} of {len(found)} exercise(s) done")
        return 0 if not failures else 1
    for ex in found.values():
        check(ex.done, f"exercise {ex.id} is solved in the course itself")
    listed = run("list")
    check(listed.returncode == 0 and all(ex.id in listed.stdout for ex in found.values()), "list names every exercise")
    for ex in found.values():
        solution = run("solution", ex.id)
        check(solution.returncode == 0 and all("".join(r.body) in solution.stdout for r in ex.regions) and
              (len(ex.regions) == 1 or all(f"{r.path}:{r.begin}" in solution.stdout for r in ex.regions)),
              f"solution {ex.id} prints its regions, each named where there are several")
    # The common mistakes (exercises.py mistakes; CI runs them): each well formed, for an exercise that
    # exists, within its regions, and every exercise has one.
    known = exercises.mistakes()
    for mistake in known:
        check(mistake.exercise in found, f"mistake {mistake.name} is for an exercise that exists ({mistake.exercise})")
        if mistake.exercise in found:
            try:
                texts = mistake.apply(found[mistake.exercise])
                check(all(texts[p] != (ROOT / p).read_text(encoding="utf-8") for p in texts),
                      f"mistake {mistake.name} changes its exercise's code")
            except exercises.Bad as e:
                check(False, f"mistake {mistake.name} fits its exercise's regions ({e})")
    for ex in found.values():
        check(any(m.exercise == ex.id for m in known), f"exercise {ex.id} has a common mistake in tests/mistakes/")
    missing = run("solution", "99.9")
    check(missing.returncode == 2 and missing.stderr.count("\n") == 1 and "99.9" in missing.stderr,
          "an unknown exercise is one line and exit code 2")

    with tempfile.TemporaryDirectory() as scratch:
        dest = Path(scratch) / "participant"
        released = run("release", str(dest))
        check(released.returncode == 0, f"release writes the participant's copy ({released.stderr.strip()})")
        again = run("release", str(dest))
        check(again.returncode == 2 and "already exists" in again.stderr, "release refuses a folder that exists")
        nowhere = run("release", str(Path(scratch) / "missing" / "participant"))
        check(nowhere.returncode == 2 and "is not a folder" in nowhere.stderr, "release refuses a folder with no parent")
        check(not (dest / "tests" / "mistakes").exists(), "the participant's copy holds no common mistake (near-solutions)")
        check(not (dest / "tests" / "hidden").exists(), "the participant's copy holds no hidden test")
        # The handouts' citations moved with the stubs: "`name` (line N)" still names a line holding it, and
        # none points into a region (readme_test's rule, here for the copy that CI does not build).
        named = re.compile(r"`([^`]+)`\s+\((?:([\w./]+), )?lines? (\d+(?:, \d+)*)\)")
        citations = sum(len(named.findall(r.read_text(encoding="utf-8"))) for r in dest.glob("[0-9][0-9]_*/README.md"))
        check(citations > 20, f"the copy's handouts cite the code ({citations} citations)")
        for readme in sorted(dest.glob("[0-9][0-9]_*/README.md")):
            text = readme.read_text(encoding="utf-8")
            for m in named.finditer(text):
                code = (readme.parent / (m.group(2) or "main.cpp")).read_text(encoding="utf-8").splitlines()
                for n in m.group(3).split(", "):
                    check(int(n) <= len(code) and m.group(1) in code[int(n) - 1],
                          f"{readme.relative_to(dest)} in the copy cites {m.group(0)}, and that line holds it")
        log = subprocess.run(["git", "-C", str(dest), "log", "--oneline"], capture_output=True, text=True).stdout
        check(len(log.splitlines()) == 1, "the participant's copy has a history of one commit")
        stubs = exercises.find(dest)
        check(set(stubs) == set(found), "the copy holds every exercise")
        for id, stub in stubs.items():
            check(len(stub.regions) == len(found[id].regions), f"exercise {id} keeps its {len(found[id].regions)} region(s)")
            for region in stub.regions:
                text = "".join(region.body)
                check(not region.done, f"exercise {id} ({region.path}:{region.begin}) is a stub in the copy")
                check(f'"{id}"' in text and f'"{region.path}:{region.begin}"' in text and "README.md#exercises" in text,
                      f"exercise {id}'s stub names it, its file and line and its handout")
            solution_lines = {l.strip() for l in found[id].body if l.strip() and not l.strip().startswith("//")}
            check(not any(l.strip() in solution_lines for l in stub.body), f"no line of {id}'s solution is left")
        for path in sorted({str(r.path) for ex in stubs.values() for r in ex.regions}):
            source = dest / path
            if path.endswith(".h"):  # a header, compiled as a file that includes it (no "#pragma once in main file")
                source = Path(scratch) / "includes_header.cpp"
                source.write_text(f'#include "{path}"\n')
            compiled = subprocess.run([compiler, "-std=c++20", "-Wall", "-Wextra", "-fsyntax-only", "-I", str(dest)] +
                                      [f"-I{i}" for i in includes] + [str(source)], capture_output=True, text=True)
            check(compiled.returncode == 0 and "warning" not in compiled.stderr,
                  f"{path} compiles in the copy without a warning:\n{compiled.stderr[-2000:]}")

        # check's verdicts on the results page: the last of each exercise, escaped; a link in the file's
        # place is refused and its target left as it was.
        import report  # noqa: E402  (scripts/, on the path above)
        runs = Path(scratch) / "runs"
        first = next(iter(found.values()))
        exercises.record_check(runs, first, False, "<b>the gradient of '0.weight'</b> differs")
        exercises.record_check(runs, first, True, "")
        section = report.exercises_section(str(runs))
        check(f"<td>{first.id}</td>" in section and "PASSED" in section and "FAILED" not in section,
              f"the page shows the last check of {first.id}:\n{section}")
        exercises.record_check(runs, first, False, "<script>x</script>")
        section = report.exercises_section(str(runs))
        check("FAILED" in section and "<script>" not in section and "&lt;script&gt;" in section,
              f"a failure's line is shown escaped:\n{section}")
        check(report.exercises_section(str(Path(scratch) / "nowhere")) == "", "no checks, no section")
        victim = Path(scratch) / "victim.txt"
        victim.write_text("keep me")
        linked = Path(scratch) / "linked_runs"
        (linked / "exercises").mkdir(parents=True)
        (linked / "exercises" / "checks.jsonl").symlink_to(victim)
        exercises.record_check(linked, first, True, "")
        check(victim.read_text() == "keep me", "a checks.jsonl that is a link is never written through")

        # A malformed region: one line naming the file and line, exit code 2.
        broken = Path(scratch) / "broken"
        subprocess.run(["git", "init", "-q", str(broken)], check=True)
        (broken / "tests").mkdir()
        (broken / "tests" / "CMakeLists.txt").write_text("")
        (broken / "a.cpp").write_text("// EXERCISE 01.1: x\nint f() {\n  // BEGIN EXERCISE 01.1\n  return 1;\n}\n")
        subprocess.run(["git", "-C", str(broken), "add", "-A"], check=True)
        try:
            exercises.find(broken)
            check(False, "a region that never ends is refused")
        except exercises.Bad as e:
            check("a.cpp:3" in str(e) and "never ends" in str(e), f"a region that never ends is named ({e})")

        check_grade_input(Path(scratch), build, found)

    print(f"{'PASSED' if not failures else 'FAILED'}: {len(found)} exercise(s), {len(failures)} failure(s)")
    return 0 if not failures else 1


def check_grade_input(scratch, build, found):
    """grade's bad input: one line naming what is wrong, exit code 2, nothing written; and how it reads a
    submission's files."""
    import grading  # noqa: E402  (scripts/)
    (scratch / "one").mkdir()
    (scratch / "other" / "one").mkdir(parents=True)
    (scratch / "taken.csv").write_text("keep me")
    (scratch / "taken-feedback").mkdir()
    one = [str(scratch / "one")]
    cases = [
        (["--out", str(scratch / "taken.csv")], one, "--out", "already exists"),
        (["--out", str(scratch / "g.csv"), "--feedback", str(scratch / "taken-feedback")], one, "--feedback", "already exists"),
        (["--out", str(scratch / "nowhere" / "g.csv")], one, "--out", "is not a folder"),
        (["--out", str(scratch / "g.csv")], [str(scratch / "missing")], "missing", "is not a folder"),
        (["--out", str(scratch / "g.csv"), "--time-limit", "0"], one, "--time-limit", "positive"),
        (["--out", str(scratch / "g.csv")], one + [str(scratch / "other" / "one")], "two submissions", "one"),
        (["--out", str(scratch / "g.csv"), "--build", str(scratch)], one, "--build", "not a configured"),
    ]
    for flags, submissions, names, what in cases:
        graded = run("grade", *submissions, "--build", build, *flags)
        check(graded.returncode == 2 and graded.stderr.count("\n") == 1 and names in graded.stderr and what in graded.stderr,
              f"grade {' '.join(flags)} {' '.join(submissions)} is refused naming {names} ({graded.returncode}: {graded.stderr.strip()})")
    check((scratch / "taken.csv").read_text() == "keep me" and not (scratch / "g.csv").exists() and
          not (scratch / "g-feedback").exists() and not (scratch / "taken-feedback" / "one.txt").exists(),
          "a refused grade writes nothing and keeps what was there")

    # A submission's files: a link out of it, a FIFO, a file that is not UTF-8, a region with a preprocessor
    # line, markers removed: each a reason, never followed, opened blocking or taken as code.
    ex = next(iter(found.values()))
    rel = str(ex.regions[0].path)
    sub = scratch / "sub"
    (sub / rel).parent.mkdir(parents=True)
    outside = scratch / "outside.cpp"
    outside.write_text((ROOT / rel).read_text(encoding="utf-8"))
    (sub / rel).symlink_to(outside)
    check("link out of the submission" in str(grading.submitted_bodies(sub, {ex.id: ex})[ex.id]),
          "a submitted file that links out of the submission is refused")
    (sub / rel).unlink()
    os.mkfifo(sub / rel)
    check("not a plain file" in str(grading.submitted_bodies(sub, {ex.id: ex})[ex.id]), "a FIFO is refused, not read")
    (sub / rel).unlink()
    (sub / rel).write_bytes(b"\xff\xfe")
    check("not UTF-8" in str(grading.submitted_bodies(sub, {ex.id: ex})[ex.id]), "a file that is not UTF-8 is refused")
    lines = (ROOT / rel).read_text(encoding="utf-8").splitlines(keepends=True)
    region = ex.regions[0]
    (sub / rel).write_text("".join(lines[:region.begin] + ["#define float double\n"] + lines[region.end - 1:]))
    check("preprocessor line" in str(grading.submitted_bodies(sub, {ex.id: ex})[ex.id]), "a region's #define is refused")
    (sub / rel).write_text("".join(lines[:region.begin - 1] + lines[region.end:]))
    check("marks 0 region(s)" in str(grading.submitted_bodies(sub, {ex.id: ex})[ex.id]), "removed markers are named")
    (sub / rel).write_text("".join(lines))
    got = grading.submitted_bodies(sub, {ex.id: ex})[ex.id]
    check(got == [r.body for r in ex.regions if str(r.path) == rel], "an intact file gives its regions' lines")


if __name__ == "__main__":
    sys.exit(main())
