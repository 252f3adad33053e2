#!/usr/bin/env python3
"""The workshop's exercises: each chapter's core, written by the participant, graded by tests.

An exercise is a region of the course's own source, between `// BEGIN EXERCISE NN.K` and
`// END EXERCISE NN.K`, after a comment that starts `// EXERCISE NN.K: title` and says what to write
(that comment stays in the participant's copy). Its graded tests are the ctest entry `exNN.K`
(tests/CMakeLists.txt, course_exercise), which also carries the chapter's label.

  exercises.py list                 each exercise: chapter, file and line, graded tests, done or not here
  exercises.py solution EX          the reference solution (for the instructor)
  exercises.py release DIR          the participant's repository: every region a stub that stops the run
                                    with "exercise NN.K (...) is not done yet", a fresh history of one commit
  exercises.py check EX [--build B] [--runs R]
                                    builds what EX needs and runs its graded tests, PASS or FAIL, the
                                    verdict added to R/exercises/checks.jsonl for the results page
  exercises.py mistakes [--build B] [--quick] [NAME...]
                                    each common mistake (tests/mistakes/) written into its region: its
                                    exercise's graded tests must fail, saying what it names (mistakes in
                                    different files are tried together); the solutions are put back and
                                    rebuilt after
  exercises.py stubs [--build B] [--quick]
                                    every region its stub, as in the participant's copy: every graded test
                                    must fail with its exercise's not-done line (no crash, no hang)
  exercises.py grade SUBMISSION... --out grades.csv [--feedback DIR] [--build B] [--quick] [--time-limit S]
                                    each participant's regions (only those) built into the course and its
                                    graded and hidden tests run in a sandbox (scripts/grading.py): a row per
                                    submission and exercise, a feedback file per submission
  exercises.py selftest [--build B] [--quick]
                                    stubs, then mistakes, then grade on three fixture submissions (the
                                    solution, a mistake, one that does not compile), one rebuild after: CI
  --quick: the graded tests without the long ones (those that run the chapters)

Standard library only. Exit codes: 0 done, 1 a test failed, 2 bad input.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.modules.setdefault("exercises", sys.modules[__name__])  # grading.py's `import exercises` is this module, run as a script too
SOURCES = (".cpp", ".h", ".cu")
HEADER = re.compile(r"^\s*// EXERCISE (\d\d\.\d+): (.+?)\.?\s*$")
BEGIN = re.compile(r"^(\s*)// BEGIN EXERCISE (\d\d\.\d+)\s*$")
END = re.compile(r"^\s*// END EXERCISE (\d\d\.\d+)\s*$")
STUB = "course::exercise::not_done("
# tests/CMakeLists.txt: course_exercise(NN.K [NAME part] EXECUTABLE name ... FILTER "pattern" ...), one call a part
REGISTERED = re.compile(r"^course_exercise\((\d\d\.\d+)\s([^)]*)\)", re.M)
TIME_LIMIT_S = 600  # a check's build and tests together
MISTAKES = ROOT / "tests" / "mistakes"
HIDDEN = ROOT / "tests" / "hidden"  # the hidden graded tests: the instructor's, run by `grade`


class Bad(Exception):
    """Bad input or a malformed region: one line, exit code 2."""


class Region:
    """One region of an exercise: the lines between its BEGIN and END markers."""

    def __init__(self, id, title, path, begin, end, indent, body, inputs):
        self.id, self.title, self.path, self.begin, self.end = id, title, path, begin, end
        self.indent, self.body = indent, body  # begin, end: 1-based lines of the markers
        self.inputs = inputs  # the enclosing function's parameters, when the region is its body

    @property
    def done(self):
        return STUB not in "".join(self.body)

    def stub(self, handout, begin=None):
        where = f"{self.path}:{begin or self.begin}"  # `begin`: the marker's line in the participant's file
        inputs = "".join(", " + name for name in self.inputs)
        return f'{self.indent}{STUB}"{self.id}", "{c_string(self.title)}", "{where}", "{handout}"{inputs});\n'


class Exercise:
    """An exercise: one region, or several in the same chapter where the idea is written in more than one
    place (a broadcast in a constructor and an average after backward). Each region has its own task
    comment and becomes its own stub."""

    def __init__(self, first):
        self.id, self.regions = first.id, [first]

    # The first region stands for the exercise where one place is named (list, check).
    title = property(lambda self: self.regions[0].title)
    path = property(lambda self: self.regions[0].path)
    begin = property(lambda self: self.regions[0].begin)
    body = property(lambda self: [line for r in self.regions for line in r.body])

    @property
    def chapter(self):
        return self.path.parts[0] if self.path.parts[0][:2].isdigit() else "common"

    @property
    def handout(self):
        chapter = next((d.name for d in ROOT.iterdir() if d.name.startswith(self.id[:2] + "_")), None)
        return f"{chapter}/README.md#exercises" if chapter else "README.md"

    @property
    def done(self):
        return all(r.done for r in self.regions)


def parameters(signature):
    """The parameter names of the function whose header is `signature` (the text between the task
    comment and BEGIN), or none when it is not a function's opening."""
    if "(" not in signature or not signature.rstrip().endswith("{"):
        return []
    inner = signature[signature.index("(") + 1:signature.rindex(")")]
    names, depth, part = [], 0, ""
    for ch in inner + ",":
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            part = part.split("=")[0].strip()
            if part and part != "void":
                names.append(re.findall(r"\w+", part)[-1])
            part = ""
        else:
            part += ch
    return names


def c_string(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')


def source_files(root):
    out = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:
        raise Bad(f"{root}: not a git checkout of the course ({out.stderr.strip()})")
    return [Path(p) for p in out.stdout.splitlines() if p.endswith(SOURCES) and (root / p).is_file()]


def regions_in(text, rel):
    """The exercise regions of one file's text, in order, checked for shape: a header, one BEGIN, one END
    (Bad, naming `rel` and the line, otherwise)."""
    lines = text.splitlines(keepends=True)
    found, title, open_at, signature = [], None, None, ""
    for n, line in enumerate(lines, 1):
        if m := HEADER.match(line):
            title = (m.group(1), m.group(2))
            signature = ""
        elif title and not open_at and not BEGIN.match(line) and not line.lstrip().startswith("//"):
            signature += line
        elif m := BEGIN.match(line):
            if open_at:
                raise Bad(f"{rel}:{n}: exercise {m.group(2)} begins inside exercise {open_at[1]}")
            if not title or title[0] != m.group(2):
                raise Bad(f"{rel}:{n}: exercise {m.group(2)} has no '// EXERCISE {m.group(2)}: title' comment above it")
            open_at = (n, m.group(2), m.group(1), signature)
        elif m := END.match(line):
            if not open_at or open_at[1] != m.group(1):
                raise Bad(f"{rel}:{n}: END EXERCISE {m.group(1)} without its BEGIN")
            found.append(Region(m.group(1), title[1], rel, open_at[0], n, open_at[2], lines[open_at[0]:n - 1],
                                parameters(open_at[3])))
            open_at, title = None, None
    if open_at:
        raise Bad(f"{rel}:{open_at[0]}: exercise {open_at[1]} never ends")
    return found


def find(root=ROOT):
    """Every exercise under `root`: its regions, in the order of the files and lines."""
    found = {}
    for rel in source_files(root):
        for region in regions_in((root / rel).read_text(encoding="utf-8"), rel):
            if region.id not in found:
                found[region.id] = Exercise(region)
            elif found[region.id].chapter != Exercise(region).chapter:
                raise Bad(f"{rel}:{region.end}: exercise {region.id} is also at {found[region.id].path}:"
                          f"{found[region.id].begin}, another chapter's")
            else:
                found[region.id].regions.append(region)
    return dict(sorted(found.items()))


def registered(root=ROOT):
    """Each exercise's graded parts: [(test executable, gtest filter)], in the order registered, the hidden
    ones (tests/hidden/hidden.cmake) after, where this tree has them."""
    text = (root / "tests" / "CMakeLists.txt").read_text(encoding="utf-8")
    if (root / "tests" / "hidden" / "hidden.cmake").is_file():
        text += "\n" + (root / "tests" / "hidden" / "hidden.cmake").read_text(encoding="utf-8")
    parts = {}
    for m in REGISTERED.finditer(text):
        executable = re.search(r"\bEXECUTABLE\s+(\S+)", m.group(2))
        pattern = re.search(r'\bFILTER\s+"([^"]+)"', m.group(2))
        if not executable or not pattern:
            raise Bad(f"tests/CMakeLists.txt: course_exercise({m.group(1)} ...) needs EXECUTABLE and FILTER")
        parts.setdefault(m.group(1), []).append((executable.group(1), pattern.group(1)))
    return parts


def pick(exercises, name):
    if name in exercises:
        return exercises[name]
    raise Bad(f"exercise '{name}' does not exist (exercises: {', '.join(exercises) or 'none'})")


def cmd_list(args):
    exercises, tests = find(), registered()
    for ex in exercises.values():
        graded = "; ".join(f"{e} {f}" for e, f in tests.get(ex.id, [])) or "NO GRADED TESTS"
        where = ", ".join(f"{r.path}:{r.begin}" for r in ex.regions)
        print(f"{ex.id}  {ex.chapter:24} {where}  {ex.title}\n"
              f"       graded by ctest -L ^ex{ex.id}$ ({graded}); {'done' if ex.done else 'not done'} here")
    return 0


def cmd_solution(args):
    ex = pick(find(), args.exercise)
    if not ex.done:
        raise Bad(f"exercise {ex.id} is a stub in this tree ({ex.path}:{ex.begin}): its solution is in the course's own")
    for k, region in enumerate(ex.regions):
        if len(ex.regions) > 1:  # where each part goes
            print(f"{'' if k == 0 else chr(10)}// {region.path}:{region.begin}: {region.title}")
        sys.stdout.write("".join(region.body))
    return 0


def with_bodies(text, bodies):
    """A file's text with the lines between each region's markers replaced: `bodies` [(Region, lines)], all
    regions of this file. Later regions first, so that the earlier ones' line numbers still hold."""
    lines = text.splitlines(keepends=True)
    for region, body in sorted(bodies, key=lambda pair: pair[0].begin, reverse=True):
        lines[region.begin:region.end - 1] = body
    return "".join(lines)


def stubbed(text, regions):
    """A file's text with each of `regions` ([(Region, handout)], all in this file) replaced by its stub.
    Each stub names its BEGIN line in the participant's file, moved up by the regions above it."""
    stubs = [region for region, _ in regions]
    return with_bodies(text, [(region, [region.stub(handout, moved(region.begin, stubs)[0])])
                              for region, handout in regions])


CITATION = re.compile(r"\((?:([\w./]+), )?(lines?) (\d+(?:, \d+)*)\)")  # a handout's "(line N)", as readme_test reads it


def moved(line, regions):
    """Where line `line` of a file is once `regions` (its regions, each shortened to its stub's one line) are
    stubbed: up by what the regions above it lost. A line inside a region has no place there: (None, the
    region)."""
    shift = 0
    for region in sorted(regions, key=lambda r: r.begin):
        if line >= region.end:
            shift += (region.end - 1 - region.begin) - 1
        elif line > region.begin:
            return None, region
    return line - shift, None


def cited(text, chapter, by_file):
    """A chapter handout's line citations ("(line N)" of main.cpp, "(file.cpp, line N)") moved with the
    stubs, so that they still name the lines they named (readme_test checks them in either copy); one of a
    line inside a region becomes "(exercise NN.K)": that line is the participant's to write."""
    def move(m):
        path = Path(chapter) / (m.group(1) or "main.cpp")
        regions = [region for region, _ in by_file.get(path, [])]
        if not regions:
            return m.group(0)
        places = [moved(int(n), regions) for n in m.group(3).split(", ")]
        inside = next((region for line, region in places if line is None), None)
        if inside:
            return f"(exercise {inside.id})"
        return f"({m.group(1) + ', ' if m.group(1) else ''}{m.group(2)} {', '.join(str(line) for line, _ in places)})"
    return CITATION.sub(move, text)


def release(dest):
    """Writes the participant's repository into `dest` (which must not exist): the course's tracked
    files but the common mistakes (tests/mistakes/, near-solutions) and the hidden tests (tests/hidden/),
    every exercise region replaced by its stub, a fresh history of one commit."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise Bad(f"release: {dest} already exists (give a new folder)")
    if not dest.parent.is_dir():
        raise Bad(f"release: {dest.parent} is not a folder (the copy is made beside it, then moved into place)")
    exercises = find()
    by_file = {}
    for ex in exercises.values():
        for region in ex.regions:
            by_file.setdefault(region.path, []).append((region, ex.handout))
    scratch = Path(tempfile.mkdtemp(prefix=".release.", dir=dest.parent))
    try:
        for rel in (Path(p) for p in subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                                                      text=True, check=True).stdout.splitlines()):
            src = ROOT / rel
            if not src.is_file() or src.is_symlink() or MISTAKES in src.parents or HIDDEN in src.parents:
                continue  # the common mistakes are near-solutions, the hidden tests `grade`'s: the instructor's alone
            out = scratch / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            if rel in by_file:
                out.write_text(stubbed(src.read_text(encoding="utf-8"), by_file[rel]), encoding="utf-8")
            elif rel.suffix == ".md" and len(rel.parts) == 2 and rel.parts[0][:2].isdigit():
                out.write_text(cited(src.read_text(encoding="utf-8"), rel.parts[0], by_file), encoding="utf-8")
            else:
                shutil.copyfile(src, out)
            shutil.copymode(src, out)
        git = ["git", "-C", str(scratch), "-c", "user.name=course", "-c", "user.email=course@localhost"]
        subprocess.run(git[:3] + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", "The course, with its exercises to write"], check=True)
        os.rename(scratch, dest)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return exercises


def cmd_release(args):
    exercises = release(args.dir)
    print(f"released {len(exercises)} exercise(s) into {args.dir}: {', '.join(exercises)}")
    return 0


def cmd_check(args):
    ex = pick(find(), args.exercise)
    tests = registered()
    if ex.id not in tests:
        raise Bad(f"exercise {ex.id} has no graded tests (course_exercise in tests/CMakeLists.txt)")
    build = configured(args.build)
    try:
        passed, output, reason = build_and_grade(build, ex, sorted({e for e, _ in tests[ex.id]}))
    except subprocess.TimeoutExpired:
        print(f"FAIL  exercise {ex.id}: no answer within {TIME_LIMIT_S} s (a rank waiting forever?)")
        return 1
    print(("PASS" if passed else "FAIL") + f"  exercise {ex.id} ({ex.title})" + ("" if passed else f": {reason}"))
    first = None
    if not passed:
        lines = output.splitlines()
        first = next((l.strip() for key in ("is not done yet", "FAILED at", "Failure") for l in lines if key in l), None)
        if first:
            print("      " + first)
        print(output[-4000:])
    record_check(Path(args.runs), ex, passed, first or ("" if passed else reason))
    return 0 if passed else 1


def record_check(runs, ex, passed, first_failure):
    """One JSON line in RUNS/exercises/checks.jsonl for the results page (scripts/report.py): the exercise,
    its verdict, the first failure's line, when. Appended through no link (O_NOFOLLOW); a folder that cannot
    take it is named and the check's verdict stands."""
    record = {"event": "exercise_check", "exercise": ex.id, "title": ex.title, "passed": passed,
              "first_failure": first_failure, "when": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    folder = runs / "exercises"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():
            raise OSError(f"{folder} is a link")
        fd = os.open(folder / "checks.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        print(f"exercises.py: --runs: {folder / 'checks.jsonl'} could not be written ({e}); the verdict above stands",
              file=sys.stderr)


class Mistake:
    """A common mistake in an exercise, kept as tests/mistakes/NN.K_name.txt:

        # what the mistake is, in a line or more
        # exercise: 04.1
        # caught by: text the failing graded tests print (a test's name, a message)
        --- region 1
        the region's lines, mistaken (regions not given keep the course's solution)
    """

    def __init__(self, path):
        self.path, self.name, self.regions, self.why = path, path.stem, {}, []
        self.exercise = self.caught_by = None
        current = None
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(keepends=True), 1):
            if current is None and line.startswith("# exercise:"):
                self.exercise = line.split(":", 1)[1].strip()
            elif current is None and line.startswith("# caught by:"):
                self.caught_by = line.split(":", 1)[1].strip()
            elif current is None and line.startswith("#"):
                self.why.append(line[1:].strip())
            elif m := re.match(r"^--- region (\d+)\s*$", line):
                current = int(m.group(1))
                self.regions[current] = []
            elif current is not None:
                self.regions[current].append(line)
            elif line.strip():
                raise Bad(f"{path}:{n}: a line outside '--- region N' (comments start with #)")
        if not self.exercise or not self.caught_by or not self.regions:
            raise Bad(f"{path}: a mistake needs '# exercise: NN.K', '# caught by: text' and a '--- region N'")

    def apply(self, exercise):
        """The files as this mistake writes them: {path: text}."""
        by_file = {}
        for number, body in self.regions.items():
            if not 1 <= number <= len(exercise.regions):
                raise Bad(f"{self.path}: exercise {exercise.id} has {len(exercise.regions)} region(s), not {number}")
            region = exercise.regions[number - 1]
            by_file.setdefault(region.path, []).append((region, body))
        return {path: with_bodies((ROOT / path).read_text(encoding="utf-8"), bodies) for path, bodies in by_file.items()}


def mistakes(names=None):
    found = sorted(MISTAKES.glob("*.txt")) if MISTAKES.is_dir() else []
    if names:
        known = {p.stem: p for p in found}
        missing = [n for n in names if n not in known]
        if missing:
            raise Bad(f"mistake '{missing[0]}' does not exist (mistakes: {', '.join(known) or 'none'})")
        found = [known[n] for n in names]
    return [Mistake(p) for p in found]


def write_atomically(path, text):
    """`path`'s new text through a temporary beside it (O_EXCL) renamed over it: never half written, and a
    symlink at `path` is replaced, not followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def build_and_grade(build, exercise, executables):
    """Builds the exercise's tests and chapter, then runs its graded tests: (passed, output, reason)."""
    made = subprocess.run(["cmake", "--build", str(build), "--target", *executables, exercise.chapter],
                          capture_output=True, text=True, timeout=TIME_LIMIT_S)
    if made.returncode != 0:
        return False, made.stdout[-3000:] + made.stderr[-3000:], "does not build"
    ran = subprocess.run(["ctest", "--test-dir", str(build), "-L", f"^ex{re.escape(exercise.id)}$", "--output-on-failure"],
                         capture_output=True, text=True, timeout=TIME_LIMIT_S)
    return ran.returncode == 0, ran.stdout + ran.stderr, "a graded test failed"


TEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(\S.*?)\s+[\d.]+ sec\s*$")


def per_test(output):
    """ctest's output split by test: {name: (status, the lines ctest printed after it)}."""
    tests, current = {}, None
    for line in output.splitlines():
        if m := TEST_LINE.match(line):
            current = m.group(1)
            tests[current] = [m.group(2), []]
        elif current:
            tests[current][1].append(line)
    return {name: (status, "\n".join(lines)) for name, (status, lines) in tests.items()}


def graded_round(build, paths, exercises, quick):
    """Writes `paths` ({path: text}), builds every exercise's graded tests at once, runs those of
    `exercises` (without the long ones when `quick`), and puts the files back. Returns {exercise id:
    ctest's output}; when the edited tree does not build, the build's output for each."""
    originals = {path: (ROOT / path).read_text(encoding="utf-8") for path in paths}
    # Every exercise's graded tests in one target (tests/CMakeLists.txt; a chapter's test brings its chapter),
    # built in parallel: what the edits did not touch is already up to date.
    target = "course_exercises_quick" if quick else "course_exercises"
    outputs = {}
    try:
        for path, text in paths.items():
            write_atomically(ROOT / path, text)
        made = subprocess.run(["cmake", "--build", str(build), "--target", target, "--parallel", str(os.cpu_count() or 1)],
                              capture_output=True, text=True)
        if made.returncode != 0:
            return {ex.id: "does not build:\n" + made.stdout[-3000:] + made.stderr[-3000:] for ex in exercises}
        for ex in exercises:
            command = ["ctest", "--test-dir", str(build), "-L", f"^ex{re.escape(ex.id)}$", "--output-on-failure"]
            try:
                ran = subprocess.run(command + (["-LE", "long"] if quick else []), capture_output=True, text=True,
                                     timeout=TIME_LIMIT_S)
                outputs[ex.id] = ran.stdout + ran.stderr
            except subprocess.TimeoutExpired:
                outputs[ex.id] = f"(no answer within {TIME_LIMIT_S} s)"
    finally:
        for path, text in originals.items():
            write_atomically(ROOT / path, text)
    return outputs


def rebuild(build):
    """The course's own solutions back in the build, so that what runs next tests them."""
    restored = subprocess.run(["cmake", "--build", str(build), "--parallel", str(os.cpu_count() or 1)],
                              capture_output=True, text=True)
    if restored.returncode != 0:
        print(f"FAIL  the build with the solutions put back:\n{restored.stdout[-3000:]}{restored.stderr[-3000:]}")
    return restored.returncode == 0


def cmd_mistakes(args):
    build = configured(args.build)
    missed = try_mistakes(build, args.names, args.quick)
    return 0 if rebuild(build) and missed == 0 else 1


def cmd_stubs(args):
    build = configured(args.build)
    wrong = try_stubs(build, args.quick)
    return 0 if rebuild(build) and wrong == 0 else 1


def cmd_grade(args):
    import grading  # scripts/, beside this file
    grading.grade(args)
    return 0 if rebuild(configured(args.build)) else 1


def cmd_selftest(args):
    """stubs, then mistakes, then grade on fixtures, then one rebuild: what CI runs."""
    import grading
    build = configured(args.build)
    failures = try_stubs(build, args.quick) + try_mistakes(build, [], args.quick) + grading.fixtures(build, args.quick)
    return 0 if rebuild(build) and failures == 0 else 1


def try_mistakes(build, names, quick):
    """Each common mistake in its region; returns how many its graded tests missed."""
    exercises = find()
    chosen = mistakes(names)
    if not chosen:
        raise Bad(f"no mistakes in {MISTAKES.relative_to(ROOT)}")
    # Rounds of mistakes in different files, each round built once: as many rounds as the most mistakes
    # one file has.
    rounds = []
    for mistake in chosen:
        ex = pick(exercises, mistake.exercise)
        texts = mistake.apply(ex)
        home = next((r for r in rounds if not set(texts) & set(r["paths"])), None)
        if home is None:
            home = {"paths": {}, "mistakes": []}
            rounds.append(home)
        home["paths"].update(texts)
        home["mistakes"].append((mistake, ex))
    missed = 0
    for r in rounds:
        outputs = graded_round(build, r["paths"], [ex for _, ex in r["mistakes"]], quick)
        for mistake, ex in r["mistakes"]:
            output = outputs[ex.id]
            caught = mistake.caught_by in output and "100% tests passed" not in output
            missed += not caught
            print(f"{'CAUGHT' if caught else 'MISSED'}  {mistake.name} (exercise {ex.id}): {' '.join(mistake.why)}")
            if not caught:
                print(f"      expected the graded tests to fail saying '{mistake.caught_by}':\n{output[-3000:]}")
    return missed


def try_stubs(build, quick):
    """Every region a stub at once, as in the participant's copy: every graded test must fail, each saying
    which exercise is not done yet (no crash, no hang, no other failure). Returns how many exercises' did not."""
    exercises = find()
    by_file = {}
    for ex in exercises.values():
        for region in ex.regions:
            by_file.setdefault(region.path, []).append((region, ex.handout))
    paths = {rel: stubbed((ROOT / rel).read_text(encoding="utf-8"), regions) for rel, regions in by_file.items()}
    outputs = graded_round(build, paths, list(exercises.values()), quick)
    wrong = 0
    for ex in exercises.values():
        tests = per_test(outputs[ex.id])
        clean = [name for name, (status, text) in tests.items() if status != "Passed" and
                 f"exercise {ex.id} (" in text and "is not done yet" in text]
        ok = bool(tests) and len(clean) == len(tests)
        wrong += not ok
        print(f"{'STOPS' if ok else 'WRONG'}  exercise {ex.id} stubbed: {len(clean)} of {len(tests)} graded test(s) "
              "fail with its not-done line")
        if not ok:
            print(outputs[ex.id][-3000:])
    return wrong


def configured(build):
    build = Path(build)
    if not (build / "CMakeCache.txt").is_file():
        raise Bad(f"--build: {build} is not a configured build folder (scripts/setup.sh makes build/release)")
    return build


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `list | head` ends quietly
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="every exercise, where it is, its tests, done or not")
    s = verbs.add_parser("solution", help="the reference solution of an exercise")
    s.add_argument("exercise")
    r = verbs.add_parser("release", help="the participant's repository, regions as stubs")
    r.add_argument("dir")
    c = verbs.add_parser("check", help="build and run an exercise's graded tests")
    c.add_argument("exercise")
    c.add_argument("--build", default=os.environ.get("COURSE_BUILD", str(ROOT / "build" / "release")))
    c.add_argument("--runs", default=str(ROOT / "runs"),
                   help="the results page's folder: the verdict is added to RUNS/exercises/checks.jsonl")
    m = verbs.add_parser("mistakes", help="each common mistake must fail its exercise's graded tests")
    m.add_argument("names", nargs="*", help="mistakes by name (tests/mistakes/NAME.txt); all by default")
    t = verbs.add_parser("stubs", help="every exercise a stub: each graded test must stop with its not-done line")
    g = verbs.add_parser("grade", help="grade participants' submissions: a CSV row per exercise, a feedback file each")
    g.add_argument("submissions", nargs="+", metavar="SUBMISSION", help="a participant's copy of the course (a folder)")
    g.add_argument("--out", required=True, help="the grades, a new CSV file")
    g.add_argument("--feedback", help="a new folder for the feedback files (default: beside --out, OUT-feedback)")
    g.add_argument("--time-limit", type=float, default=300.0, help="seconds a test may run at most (default 300)")
    a = verbs.add_parser("selftest", help="stubs, mistakes, grade on fixtures, one rebuild after (CI)")
    for v in (m, t, g, a):
        v.add_argument("--build", default=os.environ.get("COURSE_BUILD", str(ROOT / "build" / "release")))
        v.add_argument("--quick", action="store_true", help="the graded tests without the long ones (the chapters' runs)")
    args = parser.parse_args()
    try:
        return {"list": cmd_list, "solution": cmd_solution, "release": cmd_release, "check": cmd_check,
                "mistakes": cmd_mistakes, "stubs": cmd_stubs, "grade": cmd_grade, "selftest": cmd_selftest}[args.verb](args)
    except Bad as e:
        print(f"exercises.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
