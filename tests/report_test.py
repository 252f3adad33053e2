#!/usr/bin/env python3
"""The course's page (scripts/report.py), made from a small runs/ tree that this test records by running
the chapters with tiny settings, then checked twice:

  report_test.py tree BUILD RUNS MPIRUN...   records the tree: 01, 03, 04 (a passing run, a chart, and a
                                             run broken on purpose that --verify fails), 05 and 08 with their
                                             traces, 07; 02 and 06 left out (a chapter that did not run)
  report_test.py page RUNS                   renders the page and checks its structure: a row per chapter
                                             with its verdict, the failure's error line, every image a file
                                             under RUNS, no absolute path, no address elsewhere, under 2 MB
  report_test.py robust                      a tree of what a killed run, a stray file or another program
                                             leaves (a cut-off last line, FIFOs, JSON of other shapes, a
                                             number no float holds, a trace of 20,000 lanes, a run that died
                                             before its metrics, index.html a folder): the page keeps every
                                             good line, names the bad one, degrades one chapter at a time,
                                             never hangs, and a page it cannot write is one line, exit 2
  report_test.py browser RUNS SCREENSHOT     loads the page from disk in headless Chromium (Debian's
                                             chromium; exit 77, skipped, where it is absent) through the
                                             DevTools protocol over a pipe: no console error, every image
                                             decoded (naturalWidth > 0), a summary row per chapter; keeps a
                                             screenshot
"""
import base64
import html.parser
import json
import re
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHAPTERS = ["01_single_gpu", "02_grad_accumulation", "03_collectives", "04_ddp", "05_bucketing_overlap",
            "06_checkpoint_failover", "07_zero", "08_tensor_pipeline"]
NOT_RUN = {"02_grad_accumulation", "06_checkpoint_failover"}
PAGE_LIMIT = 2 * 2**20
SKIP = 77


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def python_with_matplotlib():
    for candidate in ("python3", "/usr/bin/python3"):
        if shutil.which(candidate) and subprocess.run([candidate, "-c", "import matplotlib"],
                                                      capture_output=True).returncode == 0:
            return candidate
    fail("no python3 with matplotlib (scripts/setup.sh installs python3-matplotlib)")


def record_tree(build, runs, mpirun):
    shutil.rmtree(runs, ignore_errors=True)
    os.makedirs(runs)
    python = python_with_matplotlib()

    def run(chapter, sub, ranks, *args, trace=False):
        folder = os.path.join(runs, chapter, sub)
        os.makedirs(folder, exist_ok=True)
        command = mpirun + [str(ranks), os.path.join(build, chapter, chapter), "--device", "cpu",
                            "--metrics", os.path.join(folder, "metrics.jsonl"), *args]
        if trace:
            command += ["--trace", os.path.join(folder, "trace.json")]
        start = time.monotonic()
        with open(os.path.join(folder, "output.txt"), "w") as out:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
        # As scripts/run_course.sh records a run.
        with open(os.path.join(folder, "run.json"), "w") as f:
            json.dump({"status": "PASSED" if code == 0 else "FAILED", "seconds": time.monotonic() - start,
                       "ranks": ranks, "date": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
        return code, folder

    code, _ = run("01_single_gpu", "", 1, "--epochs", "3", "--samples", "512")
    run("03_collectives", "", 2, "-e", "64K", "-n", "1", "-w", "0")
    code, folder = run("04_ddp", "", 2, "--steps", "4", "--samples", "64", "--global-batch", "8", "--verify")
    if code != 0:
        fail("04_ddp's tiny run failed: " + open(os.path.join(folder, "output.txt")).read())
    subprocess.run([python, os.path.join(ROOT, "scripts", "plot.py"), "loss", os.path.join(folder, "metrics.jsonl"),
                    os.path.join(folder, "loss.png")], check=True, capture_output=True)
    code, _ = run("04_ddp", "broken", 2, "--steps", "4", "--samples", "64", "--global-batch", "8", "--verify",
                  "--fault", "average-twice")
    if code == 0:
        fail("04_ddp --fault average-twice --verify passed")
    # 04's scaling chart as scripts/sweep.sh draws it, from recorded points (no timing here): two ranks
    # above ideal, which the page must flag.
    sweep = os.path.join(runs, "04_ddp", "sweep")
    os.makedirs(sweep)
    points = []
    for ranks, samples_per_s in ((1, 100.0), (1, 101.0), (2, 240.0), (2, 242.0)):
        points.append(os.path.join(sweep, f"strong_np{ranks}_r{len(points)}.jsonl"))
        with open(points[-1], "w") as f:
            f.write(json.dumps({"event": "cpu_cores", "threads": 1}) + "\n" + json.dumps(
                {"event": "ddp_summary", "ranks": ranks, "samples_per_s": samples_per_s, "local_size": ranks, "cores": 2,
                 "global_batch": 240, "per_rank_batch": 240 // ranks, "step_ms": 1.0}) + "\n")
    subprocess.run([python, os.path.join(ROOT, "scripts", "plot.py"), "speedup", os.path.join(runs, "04_ddp", "speedup.png"),
                    "--strong", *points], check=True, capture_output=True)
    run("05_bucketing_overlap", "", 2, "--steps", "4", "--verify", trace=True)
    run("07_zero", "", 2, "--steps", "2", "--hidden", "8", "--layers", "2", "--global-batch", "8", "--compare")
    run("08_tensor_pipeline", "", 2, "--pp", "2", "--n-layer", "2", "--n-embd", "16", "--n-head", "2",
        "--micro-batches", "4", "--steps", "3", "--verify", trace=True)
    print(f"recorded {runs}")


class Page(html.parser.HTMLParser):
    """What the checks need of the page: the summary table's rows, every src and href, the SVGs."""

    def __init__(self):
        super().__init__()
        self.rows, self.links, self.svgs = [], [], 0
        self.in_summary = False
        self.row = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.in_summary = attrs.get("id") == "summary"
        if tag == "tr" and self.in_summary:
            self.row = []
        if tag == "svg":
            self.svgs += 1
        for key in ("src", "href"):
            if key in attrs:
                self.links.append((tag, attrs[key]))

    def handle_endtag(self, tag):
        if tag == "tr" and self.row is not None:
            self.rows.append(" ".join(self.row))
            self.row = None
        if tag == "table":
            self.in_summary = False

    def handle_data(self, data):
        if self.row is not None:
            self.row.append(data.strip())


def render(runs):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "report.py"), runs], capture_output=True,
                          text=True)
    if done.returncode != 0:
        fail("report.py failed: " + done.stderr)
    with open(os.path.join(runs, "index.html")) as f:
        return f.read()


def check_page(runs):
    # Nothing is written through a link: not a link at index.html, nor one where a temporary used to be.
    victim = os.path.join(os.path.dirname(os.path.abspath(runs)), "report_victim.txt")
    with open(victim, "w") as f:
        f.write("keep me")
    for name in ("index.html", "index.html.tmp"):
        if os.path.lexists(os.path.join(runs, name)):
            os.unlink(os.path.join(runs, name))
        os.symlink(victim, os.path.join(runs, name))
    render(runs)
    with open(victim) as f:
        kept = f.read() == "keep me"
    if os.path.lexists(os.path.join(runs, "index.html.tmp")):
        os.unlink(os.path.join(runs, "index.html.tmp"))
    os.unlink(victim)
    if not kept or os.path.islink(os.path.join(runs, "index.html")):
        fail("report.py wrote through a link in the runs folder")
    text = render(runs)
    page = Page()
    page.feed(text)
    titles = {}
    for chapter in CHAPTERS:
        with open(os.path.join(ROOT, chapter, "README.md")) as f:
            titles[chapter] = f.readline().lstrip("# ").strip()
    for chapter, title in titles.items():
        rows = [r for r in page.rows if r.startswith(title)]
        if not rows:
            fail(f"no summary row for {chapter} ('{title}')")
        want = "not run" if chapter in NOT_RUN else None
        if want and want not in rows[0]:
            fail(f"{chapter}'s row does not say '{want}': {rows[0]}")
        if not want and not any(v in rows[0] for v in ("PASSED", "FAILED")):
            fail(f"{chapter}'s row has no verdict: {rows[0]}")
    passed = [r for r in page.rows if r.startswith(titles["04_ddp"]) and "PASSED" in r]
    broken = [r for r in page.rows if r.startswith("04_ddp broken")]
    if not passed or not broken or "FAILED" not in broken[0]:
        fail(f"04_ddp should show a PASSED run and a FAILED one: {passed} {broken}")
    # The failed run's own reason, not mpirun's notice that a rank exited.
    with open(os.path.join(runs, "04_ddp", "broken", "output.txt")) as f:
        said = [line.strip() for line in f if line.startswith("lock-step check FAILED")]
    if not said or said[-1] not in text.replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&"):
        fail(f"the failed run's error line is not on the page: {said[-1:]}")
    # A chart's caption: a figure that contradicts its lesson is flagged with its reason; a sweep's points
    # are the chart's, not runs of their own.
    if not re.search(r"<div class='error'>strong scaling at 2 ranks is ABOVE IDEAL \(efficiency 1\.20\): [^<]+</div>", text):
        fail("04's speedup chart above ideal is not flagged under it")
    if "sweep strong_np" in text:
        fail("a sweep's points are listed as runs")
    if page.svgs < 2:
        fail(f"{page.svgs} timelines drawn; 05's and 08's traces make two")
    size = len(text.encode())
    images = 0
    for tag, link in page.links:
        if link.startswith("#"):
            continue
        if link.startswith("/") or ":" in link or ".." in link.split("/"):
            fail(f"<{tag}> links to '{link}', not a path inside the runs folder")
        path = os.path.join(runs, link)
        if not os.path.isfile(path):
            fail(f"<{tag}> links to '{link}', which does not exist")
        if tag == "img":
            images += 1
            size += os.path.getsize(path)
    if images < 1:
        fail("no chart on the page (04's loss chart was made)")
    for scheme in ("http://", "https://", "file://", "//cdn", "@import"):
        if scheme in text:
            fail(f"the page names an address elsewhere: '{scheme}'")
    if size > PAGE_LIMIT:
        fail(f"the page and its images are {size} bytes, over {PAGE_LIMIT}")
    print(f"page: {len(page.rows) - 1} summary rows, {images} images, {page.svgs} timelines, {size} bytes")


class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe: JSON messages separated by NUL bytes,
    written to the browser's fd 3 and read from its fd 4."""

    def __init__(self, browser):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--window-size=1200,1600", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: self._pipes_at_3_and_4(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.next_id, self.buffer, self.events = 0, b"", []

    @staticmethod
    def _pipes_at_3_and_4(reader, writer):  # in the child, before it starts the browser
        reader, writer = os.dup(reader), os.dup(writer)  # out of the way of 3 and 4 first
        os.dup2(reader, 3)
        os.dup2(writer, 4)

    def _read(self, deadline):
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                fail("the browser did not answer within its time")
            chunk = os.read(self.from_browser, 65536)
            if not chunk:
                fail("the browser closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, session=None, timeout=30, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    fail(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(deadline))

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (SystemExit, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


CHECK_IN_PAGE = """(() => {
  const images = Array.from(document.images);
  return JSON.stringify({
    images: images.length,
    undecoded: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src')),
    rows: Array.from(document.querySelectorAll('#summary tr')).slice(1).map(r => r.cells[0].textContent.trim()),
  });
})()"""


def check_in_browser(runs, screenshot):
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if not browser:
        print("SKIP: no Chromium here (Debian's chromium package; scripts/setup.sh --test-packages installs it)")
        return SKIP
    render(runs)
    tools = DevTools(browser)
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable", session=session)
        url = "file://" + os.path.abspath(os.path.join(runs, "index.html"))
        tools.call("Page.navigate", session=session, url=url)
        tools.wait_for("Page.loadEventFired")
        found = json.loads(tools.call("Runtime.evaluate", session=session, expression=CHECK_IN_PAGE,
                                      returnByValue=True)["result"]["value"])
        shot = tools.call("Page.captureScreenshot", session=session, format="png", captureBeyondViewport=True)
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        errors = [e for e in tools.events if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") == "error")
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")]
    finally:
        tools.close()
    if errors:
        fail(f"the page logged {len(errors)} errors in the browser, the first: {json.dumps(errors[0])[:400]}")
    if found["images"] < 1 or found["undecoded"]:
        fail(f"images not decoded: {found['undecoded']} of {found['images']}")
    for chapter in CHAPTERS:
        with open(os.path.join(ROOT, chapter, "README.md")) as f:
            title = f.readline().lstrip("# ").strip()
        if not any(row.startswith(title) for row in found["rows"]):
            fail(f"the browser found no summary row for {chapter}: {found['rows']}")
    print(f"browser: {found['images']} images decoded, {len(found['rows'])} summary rows, no console error; "
          f"screenshot {screenshot}")
    return 0


def check_robust():
    import tempfile
    with tempfile.TemporaryDirectory() as runs:
        def put(chapter, name, text):
            os.makedirs(os.path.join(runs, chapter), exist_ok=True)
            with open(os.path.join(runs, chapter, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
        good = json.dumps({"event": "final", "loss": 0.0112, "w": [2.996, 1.488], "b": 1.999, "passed": True})
        put("01_single_gpu", "metrics.jsonl", json.dumps({"event": "step", "step": 0, "loss": 1.0}) + "\n" + good +
            "\n" + '{"event": "step", "ste')  # killed mid-line
        put("02_grad_accumulation", "metrics.jsonl", "[1, 2]\nnull\n" + "[" * 100000 + "\n" + '"\\ud800"\n' +
            json.dumps({"event": "step", "step": 0, "loss": 2.5, "note": "\ud800"}) + "\n")
        for chapter, name in (("03_collectives", "metrics.jsonl"), ("03_collectives", "output.txt"),
                              ("05_bucketing_overlap", "trace.json")):  # nothing writes into them: a read hangs
            os.makedirs(os.path.join(runs, chapter), exist_ok=True)
            os.mkfifo(os.path.join(runs, chapter, name))
        put("05_bucketing_overlap", "output.txt", "ran\n")
        put("04_ddp", "metrics.jsonl", json.dumps({"event": "ddp_summary", "ranks": 2, "samples_per_s": int("9" * 400),
                                                   "step_ms": 1.0, "comm_ms": 0.5}) + "\n")
        put("07_zero", "output.txt", "cpu: 1 thread\nerror: out of memory (a size flag may be too large for this machine)\n")
        lanes = [{"ph": "X", "name": "F0", "pid": i, "tid": 0, "ts": i, "dur": 1} for i in range(20000)]
        put("08_tensor_pipeline", "trace.json", json.dumps({"traceEvents": lanes}))
        put("08_tensor_pipeline", "metrics.jsonl", json.dumps({"event": "step", "step": 0, "loss": 2.0}) + "\n")
        os.makedirs(os.path.join(runs, "08_tensor_pipeline", "broken"))
        put("08_tensor_pipeline/broken", "trace.json", json.dumps({"traceEvents": [
            {"ph": "X", "name": "F0", "pid": 0, "tid": 0, "ts": 0, "dur": "long"}], "metadata": [1]}))
        text = render(runs)
        checks = [
            ("metrics.jsonl line 3", "a cut-off last line is named, the rest of the file kept"),
            ("loss 0.0112", "the good lines of a cut-off file still give the summary"),
            ("19936 more lanes are in the file", "a trace of 20,000 lanes is cut to 64"),
            ("broken/trace.json could not be drawn", "a trace of another shape is named, not drawn"),
            ("error: out of memory", "a run that died before its metrics shows its error line"),
            ("its files could not be read (OverflowError", "a number no float holds costs its chapter only"),
        ]
        for needle, what in checks:
            if needle not in text:
                fail(f"{what}: '{needle}' is not on the page")
        if "metrics.jsonl line 1: not a JSON object" not in text:
            fail("JSON of another shape ([1, 2], null, a string) is a bad line, named")
        if os.listdir(runs).count("index.html") != 1 or any(n.endswith(".tmp") for n in os.listdir(runs)):
            fail(f"one page and no temporary: {os.listdir(runs)}")
    with tempfile.TemporaryDirectory() as runs:
        os.makedirs(os.path.join(runs, "index.html"))
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "report.py"), runs], capture_output=True, text=True)
        if r.returncode != 2 or r.stderr.count("\n") != 1 or not r.stderr.startswith("report.py: ") or "Traceback" in r.stderr:
            fail(f"index.html a folder: one report.py line, exit 2 ({r.returncode}: {r.stderr})")
        if any(n.endswith(".tmp") for n in os.listdir(runs)):
            fail(f"a temporary left behind: {os.listdir(runs)}")
    print("PASSED")


def main(argv):
    if len(argv) == 2 and argv[1] == "robust":
        check_robust()
        return 0
    if len(argv) >= 5 and argv[1] == "tree":
        record_tree(argv[2], argv[3], argv[4:])
        return 0
    if len(argv) == 3 and argv[1] == "page":
        check_page(argv[2])
        return 0
    if len(argv) == 4 and argv[1] == "browser":
        return check_in_browser(argv[2], argv[3])
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
