"""`exercises.py grade`: participants' exercises graded in the course's own tree, each submission in a sandbox.

For each submission (a participant's copy of the course, or any folder holding its exercise files), only the
exercise regions' contents are taken, written into the course's own files in place of the solutions, built,
and every exercise's graded tests run, the hidden ones too (tests/hidden/). A participant who edits a test
or any line outside a region gains nothing: those lines are the course's. The course's own files are put
back when the last submission is graded (or grading stops), and rebuilt.

Submissions are untrusted code. Their tests run, one at a time, in a sandbox (`unshare`, util-linux):
- as `nobody` when the grader is root (setpriv), with at most NPROC processes; its own user otherwise;
- in new user, mount, PID and network namespaces (the network: loopback only, where `ip` can raise it):
  the course, its build, every submission and the feedback folder mounted read-only, capabilities dropped
  before the test starts (no remounting), and every process the test started killed with it (a job that
  forks away dies with the namespace);
- with a scratch folder of its own as HOME and TMPDIR, removed after; no core files; files of at most 4 GiB;
- under a time limit per test (the test's own ctest TIMEOUT, or --time-limit when smaller).
The build itself (the compiler, on the submission's code) runs as the grader, under a time limit.

Writes one CSV row per submission and exercise (grades.csv: submission, exercise, title, result, tests
passed, tests run, first failure) and a feedback file per submission (FEEDBACK/NAME.txt).
"""
import argparse
import csv
import datetime
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import exercises as ex_tool
from exercises import Bad, ROOT

TEST_LIMIT_S = 300        # a test's limit where ctest gives it none (course_exercise's mpirun parts have 300)
BUILD_LIMIT_S = 1200      # one build of a submission's code (a few files, the exercises' tests relinked)
FILE_LIMIT = 2 << 20      # a submitted source file larger than this is refused (the course's are < 100 KB)
OUTPUT_HEAD = 16 << 10    # what a test's output keeps for its feedback: its first lines (the first failure)
OUTPUT_TAIL = 48 << 10    # and its last (the summary)
NOBODY = 65534
NPROC = "4096"            # processes and threads of nobody at once (a fork bomb stops there); only when
                          # the tests run as nobody: for the grader's own user it would count its other work
# Run inside the namespaces, as their root: each protected path bound read-only onto itself, then the test
# started with no capabilities left (it cannot undo the mounts), in its scratch folder. A read-only bind
# mount keeps the flags of the mount it copies (nosuid, nodev, noexec, the atime ones): the kernel locks
# them inside a user namespace and refuses a remount without them.
INNER = r'''set -e
cwd=$1; ip=$2; nproc=$3; shift 3
if [ -n "$ip" ]; then "$ip" link set lo up; fi
while [ "$1" != "--" ]; do
  if [ -d "$1" ] && [ -x "$1" ]; then  # a folder the test cannot even reach needs no mount
    keep=$(findmnt -no OPTIONS -T "$1" | tr ',' '\n' | grep -xE 'nosuid|nodev|noexec|noatime|nodiratime|relatime|strictatime' | paste -sd, -)
    mount --bind "$1" "$1"
    mount -o "remount,bind,ro${keep:+,$keep}" "$1"
  fi
  shift
done
shift
cd "$cwd"
exec prlimit --core=0 --fsize=4294967296 ${nproc:+--nproc=$nproc} -- \
  setpriv --bounding-set=-all --inh-caps=-all --no-new-privs -- "$@"
'''


class Sandbox:
    """How a test of a submission runs: the command prefix, the paths it may not write."""

    def __init__(self, protected):
        self.root = os.geteuid() == 0
        self.protected = []
        for path in sorted({os.path.realpath(p) for p in protected}):
            if not any(path == q or path.startswith(q + os.sep) for q in self.protected):
                self.protected.append(path)  # a path inside one already protected is read-only with it
        if not all(shutil.which(tool) for tool in ("unshare", "setpriv", "findmnt", "prlimit")):
            raise Bad("grade: the sandbox needs unshare, setpriv, findmnt and prlimit (Debian's util-linux)")
        # A network namespace of its own needs its loopback raised (mpirun talks over it): iproute2's ip.
        self.ip = shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin") or ""

    def protect(self, path):
        self.protected.append(os.path.realpath(path))

    def command(self, scratch, cwd, argv):
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs"] if self.root else []
        net = ["--net"] if self.ip else []
        return prefix + ["unshare", "--user", "--map-root-user", "--mount", "--pid", *net, "--fork", "--kill-child", "--",
                         "sh", "-c", INNER, "sandbox", cwd, self.ip, NPROC if self.root else "", *self.protected, "--", *argv]

    def scratch(self):
        folder = tempfile.mkdtemp(prefix="course-grade.")
        real = os.path.realpath(folder)
        if any(real == p or real.startswith(p + os.sep) for p in self.protected):
            shutil.rmtree(folder)
            raise Bad(f"grade: the scratch folder {real} lies inside {next(p for p in self.protected if real.startswith(p))}, "
                      "which the sandbox makes read-only; set TMPDIR to a folder outside the course and the submissions")
        if self.root:
            os.chown(folder, NOBODY, NOBODY)
        return folder

    def probe(self, build):
        """That a test can run at all: the sandbox starts, and reads the build (as nobody, when root)."""
        scratch = self.scratch()
        try:
            rc, output = bounded(self.command(scratch, scratch, ["test", "-r", str(build / "CMakeCache.txt")]),
                                 clean_environment(scratch, []), 60)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if rc != 0:
            who = "nobody" if self.root else "this user"
            raise Bad(f"grade: the sandbox cannot run a test here ({who} in new user, mount and PID namespaces "
                      f"reading {build}): {output.strip()[-300:] or f'exit code {rc}'}")


PASSED_ON = ("PATH", "LANG", "LC_", "OPENBLAS_", "OMP_", "GOTO", "MKL_", "OMPI_MCA_", "PMIX_MCA_", "PRTE_MCA_",
             "CUDA_", "NCCL_", "COURSE_", "LD_LIBRARY_PATH")


def clean_environment(scratch, extra):
    """What a test sees: of the grader's environment only what runs the course (PATH, the locale, the math
    libraries', MPI's, CUDA's and the course's settings: no token or key reaches a submission), its scratch
    folder as HOME and TMPDIR, Open MPI allowed to run as the namespace's root, and the test's own ctest
    ENVIRONMENT."""
    env = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ON)}
    env.update({"HOME": scratch, "TMPDIR": scratch, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    for item in extra:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def bounded(argv, env, limit, cwd=None):
    """Runs `argv` in a session of its own, killed whole after `limit` seconds: (exit code or None when it
    ran out of time, the head and the tail of what it printed)."""
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=cwd, start_new_session=True)
        try:
            rc = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what it left running, the namespace's init among them
        except ProcessLookupError:
            pass
        process.wait()
        size = out.seek(0, io.SEEK_END)
        out.seek(0)
        if size <= OUTPUT_HEAD + OUTPUT_TAIL:
            return rc, out.read().decode("utf-8", errors="replace")
        head = out.read(OUTPUT_HEAD)
        out.seek(size - OUTPUT_TAIL)
        return rc, (head.decode("utf-8", errors="replace") + f"\n[... {size - OUTPUT_HEAD - OUTPUT_TAIL} bytes ...]\n"
                    + out.read().decode("utf-8", errors="replace"))


def graded_tests(build, exercise_id, quick):
    """ctest's graded tests of one exercise: [(name, argv, environment, working folder, limit)]."""
    command = ["ctest", "--test-dir", str(build), "--show-only=json-v1", "-L", f"^ex{re.escape(exercise_id)}$"]
    listed = subprocess.run(command + (["-LE", "long"] if quick else []), capture_output=True, text=True)
    if listed.returncode != 0:
        raise Bad(f"grade: ctest cannot list the tests of {build}: {listed.stderr.strip()[-300:]}")
    tests = []
    for test in json.loads(listed.stdout).get("tests", []):  # ctest's own order
        properties = {p["name"]: p["value"] for p in test.get("properties", [])}
        tests.append((test["name"], test["command"], properties.get("ENVIRONMENT", []),
                      properties.get("WORKING_DIRECTORY", str(build)), float(properties.get("TIMEOUT", TEST_LIMIT_S))))
    if not tests:
        raise Bad(f"grade: {build} registers no graded test of exercise {exercise_id} (configure it again?)")
    return tests


def read_submitted(root, rel):
    """(the text of `rel` in the submission `root`, None) or (None, why it cannot be read): a file missing, a
    link leading out of the submission, not a plain file (a FIFO is never opened blocking), too large, not
    UTF-8."""
    real = os.path.realpath(root / rel)
    if not real.startswith(str(root) + os.sep):
        return None, f"{rel} is a link out of the submission"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, f"{rel} is missing"
    except OSError as e:
        return None, f"{rel} cannot be read ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, f"{rel} is not a plain file"
        if info.st_size > FILE_LIMIT:
            return None, f"{rel} holds {info.st_size} bytes, more than the {FILE_LIMIT} a source file may"
        data = f.read(FILE_LIMIT + 1)
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"{rel} is not UTF-8 text (byte {e.start})"


def submitted_bodies(submission, exercises):
    """Each exercise's region contents in the submission: {id: [lines of each region]} or {id: why not}."""
    root = Path(os.path.realpath(submission))
    texts, found = {}, {}
    for ex in exercises.values():
        bodies = []
        for k, region in enumerate(ex.regions):
            rel = str(region.path)
            if rel not in texts:
                text, why = read_submitted(root, rel)
                try:
                    texts[rel] = why or ex_tool.regions_in(text, rel)
                except Bad as e:
                    texts[rel] = f"the exercise markers are broken: {e}"
            regions = texts[rel]
            if isinstance(regions, str):
                bodies = regions
                break
            mine = [r for r in regions if r.id == ex.id]
            wanted = [r for r in ex.regions if str(r.path) == rel]
            if len(mine) != len(wanted):
                bodies = (f"{rel} marks {len(mine)} region(s) of exercise {ex.id}, the course {len(wanted)}: keep each "
                          f"'// BEGIN EXERCISE {ex.id}' and '// END EXERCISE {ex.id}' line as handed out")
                break
            body = mine[wanted.index(region)].body
            directive = next((n for n, line in enumerate(body, 1) if line.lstrip().startswith("#")), None)
            if directive:
                bodies = (f"{rel}: line {directive} of exercise {ex.id}'s region is a preprocessor line; a region "
                          "holds code only (#include and #define belong to the course's lines)")
                break
            bodies.append(body)
        found[ex.id] = bodies
    return found


def transplanted(originals, exercises, bodies):
    """The course's files (`originals`, {path: text}) with each exercise's regions holding the submission's
    lines, or the stub where it gives none: {path: text}."""
    by_file = {}
    for ex in exercises.values():
        given = bodies.get(ex.id)
        for k, region in enumerate(ex.regions):
            lines = given[k] if isinstance(given, list) else [region.stub(ex.handout)]
            by_file.setdefault(str(region.path), []).append((region, lines))
    return {rel: ex_tool.with_bodies(originals[rel], pairs) for rel, pairs in by_file.items()}


def write_changed(texts):
    """Writes each file whose text differs: what did not change is not rebuilt."""
    for rel, text in texts.items():
        if (ROOT / rel).read_text(encoding="utf-8") != text:
            ex_tool.write_atomically(ROOT / rel, text)


COMPILER_ERROR = re.compile(r"^(\S+?\.(?:cpp|h|cu|hpp)):\d+:(?:\d+:)? (?:fatal )?error: .*$", re.M)


def compile_errors(output, exercises):
    """{exercise id: its first compiler error} for the exercises whose files the build's errors name."""
    blamed = {}
    for m in COMPILER_ERROR.finditer(output):
        rel = os.path.relpath(os.path.realpath(m.group(1)), ROOT)
        for ex in exercises.values():
            if ex.id not in blamed and any(str(r.path) == rel for r in ex.regions):
                blamed[ex.id] = m.group(0).replace(str(ROOT) + os.sep, "")
    return blamed


def build(build_dir, target):
    rc, output = bounded(["cmake", "--build", str(build_dir), "--target", target, "--parallel", str(os.cpu_count() or 1)],
                         dict(os.environ), BUILD_LIMIT_S)
    return rc == 0, ("" if rc is not None else f"the build ran past {BUILD_LIMIT_S} s\n") + output


def first_error(output):
    return next((line.replace(str(ROOT) + os.sep, "") for line in output.splitlines()
                 if "error" in line.lower()), output.strip().splitlines()[-1] if output.strip() else "no output")


def verdict(rc, output):
    """A test's result from its exit code and output."""
    if rc is None:
        return "time out"
    if "is not done yet" in output and rc != 0:
        return "not done"
    if rc == 0:
        return "pass"
    if rc < 0 or rc > 128 or re.search(r"on signal \d+|Segmentation fault|core dumped|terminate called", output):
        return "crash"
    return "fail"


def first_failure(name, result, rc, output, limit):
    """The line a participant reads first: where the test failed and why, in the test's words."""
    if result == "time out":
        return f"{name}: no answer within {limit:.0f} s (a rank waiting forever?)"
    lines = [l.replace(str(ROOT) + os.sep, "").strip() for l in output.splitlines()]
    if result == "crash" and rc is not None and (rc < 0 or rc > 128):
        number = -rc if rc < 0 else rc - 128
        try:
            name_of = signal.Signals(number).name
        except ValueError:
            name_of = f"signal {number}"
        last = next((l for l in reversed(lines) if l), "nothing")
        return f"{name}: killed by {name_of}; the last line it printed: {last[:400]}"
    for key in ("is not done yet", "FAILED at", "Failure", "error", "signal", "Aborted"):
        for i, line in enumerate(lines):
            if key in line:
                more = [l for l in lines[i + 1:i + 4] if l] if key == "Failure" else []
                return f"{name}: " + " ".join([line] + more)[:600]
    last = next((l for l in reversed(lines) if l), "no output")
    return f"{name}: {last[:600]}"


def remove(folder):
    """A scratch folder removed, whatever modes the test left on what it made."""
    def unlock(function, path, _):
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
        function(path)
    shutil.rmtree(folder, onerror=unlock)


def run_tests(sandbox, tests, time_limit):
    """Each test in the sandbox: [(name, result, exit code, output, limit)]."""
    done = []
    for name, argv, environment, cwd, timeout in tests:
        limit = min(timeout, time_limit)
        scratch = sandbox.scratch()
        try:
            rc, output = bounded(sandbox.command(scratch, cwd, argv), clean_environment(scratch, environment), limit)
        finally:
            remove(scratch)
        done.append((name, verdict(rc, output), rc, output, limit))
    return done


def grade_one(name, submission, exercises, originals, tests_of, build_dir, target, sandbox, time_limit):
    """One submission: {exercise id: (result, tests passed, tests run, first failure, [(test, result, output)])}."""
    outcome = {}
    bodies = submitted_bodies(submission, exercises)
    for id, given in bodies.items():
        total = len(tests_of[id])
        if isinstance(given, str):
            outcome[id] = ("no region", 0, total, given, [])
        elif all(ex_tool.STUB in "".join(body) for body in given):
            outcome[id] = ("not done", 0, total, f"exercise {id} is still its stub", [])
    print(f"grading {name}: building {len(exercises) - len(outcome)} exercise(s)", flush=True)
    texts = transplanted(originals, exercises, {id: b for id, b in bodies.items() if id not in outcome})
    write_changed(texts)
    built, output = build(build_dir, target)
    if not built:
        # The exercises whose files the errors name do not compile; the others are graded with those stubbed.
        blamed = compile_errors(output, exercises)
        for id, error in blamed.items():
            outcome[id] = ("does not compile", 0, len(tests_of[id]), error, [])
        if blamed:
            write_changed(transplanted(originals, exercises, {id: b for id, b in bodies.items() if id not in outcome}))
            built, output = build(build_dir, target)
        if not built:
            for id in exercises:
                if id not in outcome:
                    outcome[id] = ("does not compile", 0, len(tests_of[id]), first_error(output), [])
    for id, ex in exercises.items():
        if id in outcome:
            continue
        ran = run_tests(sandbox, tests_of[id], time_limit)
        failed = [test for test in ran if test[1] != "pass"]
        result = failed[0][1] if failed else "pass"
        first = first_failure(*failed[0]) if failed else ""
        outcome[id] = (result, len(ran) - len(failed), len(ran), first, [(n, r, o) for n, r, _, o, _ in ran])
        print(f"  {id} {result} ({len(ran) - len(failed)} of {len(ran)} tests)", flush=True)
    return outcome


def feedback_text(name, exercises, outcome, when):
    out = [f"Exercises of {name}, graded {when}.", ""]
    for id, ex in exercises.items():
        result, passed, total, first, _ = outcome[id]
        out.append(f"{id}  {ex.title}: {result.upper()} ({passed} of {total} tests)" + (f"\n      {first}" if first else ""))
    for id, ex in exercises.items():
        for test, result, output in outcome[id][4]:
            if result != "pass":
                tail = "\n".join(output.splitlines()[-60:])
                out += ["", f"--- {id}, {test}: {result.upper()} (its last lines)", tail]
    return "\n".join(out) + "\n"


def create_new(path, text):
    """`path` written whole, never over something there (O_EXCL): the run that finds it there says so."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def grade(args):
    build_dir = ex_tool.configured(args.build).resolve()
    exercises = ex_tool.find()
    if not exercises:
        raise Bad("grade: this course holds no exercise")
    for ex in exercises.values():
        if not ex.done:
            raise Bad(f"grade: exercise {ex.id} is a stub in this tree ({ex.path}:{ex.begin}); grade in the course's own")
    if args.time_limit <= 0:
        raise Bad(f"--time-limit: {args.time_limit} is not a positive number of seconds")
    out = Path(args.out)
    if out.exists() or out.is_symlink():
        raise Bad(f"--out: {out} already exists (give a new file: grades are never written over)")
    if not out.parent.is_dir():
        raise Bad(f"--out: {out.parent} is not a folder")
    feedback = Path(args.feedback) if args.feedback else out.with_name(out.stem + "-feedback")
    if feedback.exists() or feedback.is_symlink():
        raise Bad(f"--feedback: {feedback} already exists (give a new folder)")
    if not feedback.parent.is_dir():
        raise Bad(f"--feedback: {feedback.parent} is not a folder")
    names = {}
    for given in args.submissions:
        path = Path(given)
        if not path.is_dir():
            raise Bad(f"grade: submission {given} is not a folder")
        name = Path(os.path.realpath(path)).name
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "submission"
        if safe in {s for _, s in names.values()}:
            raise Bad(f"grade: two submissions are named {safe} ({given} and another): give each its own folder name")
        names[given] = (name, safe)
    tests_of = {id: graded_tests(build_dir, id, args.quick) for id in exercises}
    sandbox = Sandbox([ROOT, build_dir, *args.submissions])
    sandbox.probe(build_dir)

    feedback.mkdir()
    sandbox.protect(feedback)
    target = "course_exercises_quick" if args.quick else "course_exercises"
    originals = {str(r.path): (ROOT / r.path).read_text(encoding="utf-8") for ex in exercises.values() for r in ex.regions}
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    rows = []
    try:
        for given, (name, safe) in names.items():
            outcome = grade_one(name, given, exercises, originals, tests_of, build_dir, target, sandbox, args.time_limit)
            create_new(feedback / f"{safe}.txt", feedback_text(name, exercises, outcome, when))
            for id, ex in exercises.items():
                result, passed, total, first, _ = outcome[id]
                rows.append([name, id, ex.title, result, passed, total, first])
            passed = sum(outcome[id][0] == "pass" for id in exercises)
            print(f"graded {name}: {passed} of {len(exercises)} exercise(s) pass; feedback in {feedback / (safe + '.txt')}",
                  flush=True)
    finally:
        write_changed(originals)  # the course's own solutions back; the caller rebuilds
    table = io.StringIO()
    writer = csv.writer(table)
    writer.writerow(["submission", "exercise", "title", "result", "tests_passed", "tests_run", "first_failure"])
    writer.writerows(rows)
    try:
        create_new(out, table.getvalue())
    except FileExistsError:  # made while the submissions were graded: kept, and the grades written beside it
        out = out.with_name(f"{out.name}.{os.getpid()}")
        create_new(out, table.getvalue())
    print(f"wrote {len(rows)} row(s) to {out}")
    return rows



FIXTURE_MISTAKE = "05.1_one_cap_for_every_bucket"  # caught by quick tests, in a file of its own
FIXTURE_BROKEN = "08.1"                            # the exercise the third submission breaks


def fixtures(build_dir, quick):
    """CI's proof of `grade`: three submissions made from the course (the solution; a common mistake; one
    exercise that does not compile), graded, each row and feedback file as it must be. Returns how many
    rows were wrong."""
    exercises = ex_tool.find()
    mistake = ex_tool.mistakes([FIXTURE_MISTAKE])[0]
    originals = {str(r.path): (ROOT / r.path).read_text(encoding="utf-8") for ex in exercises.values() for r in ex.regions}
    broken = exercises[FIXTURE_BROKEN]
    submissions = {
        "solution": {},
        "mistake": {str(rel): text for rel, text in mistake.apply(exercises[mistake.exercise]).items()},
        "broken": transplanted(originals, {broken.id: broken}, {broken.id: [["  this is not C++;\n"]] * len(broken.regions)}),
    }
    expected = {("mistake", mistake.exercise): "fail", ("broken", broken.id): "does not compile"}
    wrong = 0
    with tempfile.TemporaryDirectory(prefix="course-grade-fixtures.") as folder:
        for name, texts in submissions.items():
            for rel, text in originals.items():
                path = Path(folder) / name / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(texts.get(rel, text), encoding="utf-8")
        out = Path(folder) / "grades.csv"
        args = argparse.Namespace(build=str(build_dir), submissions=[str(Path(folder) / n) for n in submissions],
                                  out=str(out), feedback=None, quick=quick, time_limit=float(TEST_LIMIT_S))
        grade(args)
        rows = list(csv.DictReader(out.open(encoding="utf-8")))
        feedback = {n: (Path(folder) / "grades-feedback" / f"{n}.txt").read_text(encoding="utf-8") for n in submissions}
    for name in submissions:
        for id in exercises:
            row = next((r for r in rows if r["submission"] == name and r["exercise"] == id), None)
            want = expected.get((name, id), "pass")
            ok = row is not None and row["result"] == want
            if ok and want == "fail":
                ok = mistake.caught_by in feedback[name] and row["first_failure"] != ""
            if ok and want == "does not compile":
                ok = "schedule.cpp" in row["first_failure"] and "error" in row["first_failure"]
            wrong += not ok
            if not ok or want != "pass":
                print(f"{'GRADED' if ok else 'WRONG '}  {name} {id}: {row['result'] if row else 'no row'} (expected {want})"
                      + (f": {row['first_failure']}" if row and row["first_failure"] else ""))
    print(f"{'GRADED' if wrong == 0 else 'WRONG '}  grade on 3 fixture submissions: {len(rows)} row(s), {wrong} wrong")
    return wrong
