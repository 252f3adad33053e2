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
  exercises.py check EX [--build B] builds what EX needs and runs its graded tests, PASS or FAIL each

Standard library only. Exit codes: 0 done, 1 a test failed, 2 bad input.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (".cpp", ".h", ".cu")
HEADER = re.compile(r"^\s*// EXERCISE (\d\d\.\d+): (.+?)\.?\s*$")
BEGIN = re.compile(r"^(\s*)// BEGIN EXERCISE (\d\d\.\d+)\s*$")
END = re.compile(r"^\s*// END EXERCISE (\d\d\.\d+)\s*$")
STUB = "course::exercise::not_done("
# tests/CMakeLists.txt: course_exercise(NN.K EXECUTABLE name FILTER "pattern" LABEL chapter)
REGISTERED = re.compile(r"^course_exercise\((\d\d\.\d+)\s+EXECUTABLE\s+(\S+)\s+FILTER\s+\"([^\"]+)\"", re.M)
TIME_LIMIT_S = 600  # a check's build and tests together


class Bad(Exception):
    """Bad input or a malformed region: one line, exit code 2."""


class Exercise:
    def __init__(self, id, title, path, begin, end, indent, body, inputs):
        self.id, self.title, self.path, self.begin, self.end = id, title, path, begin, end
        self.indent, self.body = indent, body  # begin, end: 1-based lines of the markers
        self.inputs = inputs  # the enclosing function's parameters, when the region is its body

    @property
    def chapter(self):
        return self.path.parts[0] if self.path.parts[0][:2].isdigit() else "common"

    @property
    def handout(self):
        chapter = next((d.name for d in ROOT.iterdir() if d.name.startswith(self.id[:2] + "_")), None)
        return f"{chapter}/README.md#exercises" if chapter else "README.md"

    @property
    def done(self):
        return STUB not in "".join(self.body)

    def stub(self, begin=None):
        where = f"{self.path}:{begin or self.begin}"  # `begin`: the marker's line in the participant's file
        inputs = "".join(", " + name for name in self.inputs)
        return f'{self.indent}{STUB}"{self.id}", "{c_string(self.title)}", "{where}", "{self.handout}"{inputs});\n'


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


def find(root=ROOT):
    """Every exercise region under `root`, checked for shape: a header, one BEGIN, one END."""
    found = {}
    for rel in source_files(root):
        lines = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        title = None
        open_at = None
        signature = ""
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
                id = m.group(1)
                if id in found:
                    raise Bad(f"{rel}:{n}: exercise {id} is also at {found[id].path}:{found[id].begin}")
                found[id] = Exercise(id, title[1], rel, open_at[0], n, open_at[2], lines[open_at[0]:n - 1],
                                     parameters(open_at[3]))
                open_at, title = None, None
        if open_at:
            raise Bad(f"{rel}:{open_at[0]}: exercise {open_at[1]} never ends")
    return dict(sorted(found.items()))


def registered(root=ROOT):
    text = (root / "tests" / "CMakeLists.txt").read_text(encoding="utf-8")
    return {m.group(1): (m.group(2), m.group(3)) for m in REGISTERED.finditer(text)}


def pick(exercises, name):
    if name in exercises:
        return exercises[name]
    raise Bad(f"exercise '{name}' does not exist (exercises: {', '.join(exercises) or 'none'})")


def cmd_list(args):
    exercises, tests = find(), registered()
    for ex in exercises.values():
        graded = tests.get(ex.id)
        graded = f"{graded[0]} {graded[1]}" if graded else "NO GRADED TESTS"
        print(f"{ex.id}  {ex.chapter:24} {str(ex.path)}:{ex.begin}  {ex.title}\n"
              f"       graded by ctest -L ^ex{ex.id}$ ({graded}); {'done' if ex.done else 'not done'} here")
    return 0


def cmd_solution(args):
    ex = pick(find(), args.exercise)
    if not ex.done:
        raise Bad(f"exercise {ex.id} is a stub in this tree ({ex.path}:{ex.begin}): its solution is in the course's own")
    sys.stdout.write("".join(ex.body))
    return 0


def release(dest):
    """Writes the participant's repository into `dest` (which must not exist): the course's tracked
    files, every exercise region replaced by its stub, a fresh history of one commit."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise Bad(f"release: {dest} already exists (give a new folder)")
    if not dest.parent.is_dir():
        raise Bad(f"release: {dest.parent} is not a folder (the copy is made beside it, then moved into place)")
    exercises = find()
    by_file = {}
    for ex in exercises.values():
        by_file.setdefault(ex.path, []).append(ex)
    scratch = Path(tempfile.mkdtemp(prefix=".release.", dir=dest.parent))
    try:
        for rel in (Path(p) for p in subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                                                      text=True, check=True).stdout.splitlines()):
            src = ROOT / rel
            if not src.is_file() or src.is_symlink():
                continue
            out = scratch / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            if rel in by_file:
                lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
                regions = sorted(by_file[rel], key=lambda e: e.begin)
                # Each stub names its BEGIN line in the participant's file: earlier regions, shortened to one
                # line, move it up.
                begins, shift = [], 0
                for ex in regions:
                    begins.append(ex.begin - shift)
                    shift += (ex.end - 1 - ex.begin) - 1
                for ex, begin in reversed(list(zip(regions, begins))):
                    lines[ex.begin:ex.end - 1] = [ex.stub(begin)]
                out.write_text("".join(lines), encoding="utf-8")
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
    build = Path(args.build)
    if not (build / "CMakeCache.txt").is_file():
        raise Bad(f"--build: {build} is not a configured build folder (scripts/setup.sh makes build/release)")
    executable = tests[ex.id][0]
    try:
        made = subprocess.run(["cmake", "--build", str(build), "--target", executable, ex.chapter],
                              capture_output=True, text=True, timeout=TIME_LIMIT_S)
        if made.returncode != 0:
            print(f"FAIL  exercise {ex.id} does not build:\n{made.stdout[-3000:]}{made.stderr[-3000:]}")
            return 1
        ran = subprocess.run(["ctest", "--test-dir", str(build), "-L", f"^ex{re.escape(ex.id)}$", "--output-on-failure"],
                             capture_output=True, text=True, timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        print(f"FAIL  exercise {ex.id}: no answer within {TIME_LIMIT_S} s (a rank waiting forever?)")
        return 1
    print(("PASS" if ran.returncode == 0 else "FAIL") + f"  exercise {ex.id} ({ex.title})")
    if ran.returncode != 0:
        lines = ran.stdout.splitlines()
        first = next((l for key in ("is not done yet", "FAILED at", "Failure") for l in lines if key in l), None)
        if first:
            print("      " + first.strip())
        print(ran.stdout[-4000:])
    return 0 if ran.returncode == 0 else 1


def main():
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
    args = parser.parse_args()
    try:
        return {"list": cmd_list, "solution": cmd_solution, "release": cmd_release, "check": cmd_check}[args.verb](args)
    except Bad as e:
        print(f"exercises.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
