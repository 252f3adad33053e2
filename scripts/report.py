#!/usr/bin/env python3
"""The course's runs on one page: writes RUNS/index.html from what the chapters left under RUNS.

  report.py RUNS        (re)writes RUNS/index.html (scripts/run_course.sh calls it at its end; after a
                        chapter run alone with --metrics RUNS/<chapter>/metrics.jsonl, it refreshes that
                        chapter's section)

The page is static and self-contained: inline CSS, the charts referenced relative to RUNS, the timelines
drawn in place as SVG from the chapters' Chrome traces, nothing fetched from anywhere. It reads the runs
through scripts/plot.py (the same summary line, figures and trace reading as the charts): for each
chapter its verdict, device and time (run.json, written by run_course.sh; or the metrics' own verdict),
the figures that carry its lesson beside what they are measured against, its charts and timelines, a
link to its output, and for a failed run its error line. A chapter that did not run says so. When
`scripts/exercises.py check` has run, the workshop's exercises with their last verdicts.
"""
import datetime
import glob
import html
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot  # noqa: E402  (the one reading of the metrics)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAPTERS = ["01_single_gpu", "02_grad_accumulation", "03_collectives", "04_ddp", "05_bucketing_overlap",
            "06_checkpoint_failover", "07_zero", "08_tensor_pipeline"]
SKIPPED_FOLDERS = {"checkpoints", "sweep", "repeats"}  # what a run keeps that is not a run (a chart's points)
# A chart's caption line that says its figure contradicts its lesson or cannot carry it (scripts/plot.py).
FLAGGED = re.compile(r"NOISY|ABOVE IDEAL|ABOVE 1F1B|DIFFER|SLOWER THAN")

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; } td, th { border: 1px solid #ddd; padding: 3px 8px;
vertical-align: top; text-align: left; } th { background: #f4f4f4; }
.PASSED { color: #176117; font-weight: bold; } .FAILED { color: #a31515; font-weight: bold; }
.absent, .ran { color: #777; } .error { font-family: monospace; color: #a31515; white-space: pre-wrap; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; } figure img { max-width: 520px; border: 1px solid #eee; }
figcaption, .note { color: #555; font-size: 0.9em; } svg { border: 1px solid #eee; background: #fff; }
"""


# The most lanes a timeline draws (a trace of more is cut, and the page says so): beyond, an SVG of
# megabytes that no reader can read.
TIMELINE_LANES = 64


def open_regular(path):
    """PATH opened for reading as bytes if it is a regular file (a FIFO would hang the page, a folder fail
    it); None otherwise, or when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_records(path):
    """A metrics file's records, line by line: the good ones kept (a run killed mid-line, a bad byte or a
    line that is no JSON object costs that line only), and the first bad line's number and why; ([], None)
    for a file that is not there or not a regular file. Of the per-step records, which the page never
    shows and a long run writes by the million, only the last is kept: the page's memory is the run's
    summaries', not its length's."""
    f = open_regular(path)
    if f is None:
        return [], None
    records, bad, last_step = [], None, None
    with f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                if record.get("event") == "step":
                    last_step = record
                else:
                    records.append(record)
            except (ValueError, RecursionError) as e:
                bad = bad or f"{os.path.basename(path)} line {number}: {str(e)[:80] or type(e).__name__}"
    return records + ([last_step] if last_step else []), bad


def read_json(path):
    f = open_regular(path)
    if f is None:
        return None
    try:
        with f:
            return json.loads(f.read().decode("utf-8"))
    except (ValueError, RecursionError):
        return None


def caption_of(image):
    """The lines of IMAGE's caption file (IMAGE without .png, .caption.txt), read only as a plain file of at
    most 64 KB (never a link, a FIFO or a folder); none when there is none."""
    path = os.path.splitext(image)[0] + ".caption.txt"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > 65536:
            return []
        return [line.strip() for line in f.read().decode("utf-8", errors="replace").splitlines() if line.strip()]


def error_line(output_path):
    """What went wrong, in the run's own words: its last "error:" line, else its last line saying FAILED
    with a reason (a bare verdict with the two lines before it), else its last line. mpirun's own notices
    (the blocks between its lines of dashes) say only that a rank exited."""
    f = open_regular(output_path)
    if f is None:
        return "no output was written"
    with f:
        lines = [line.decode("utf-8", errors="replace").rstrip() for line in f if line.strip()]
    own, inside = [], False
    for line in lines:
        if re.fullmatch(r"-{20,}", line.strip()):
            inside = not inside
        elif not inside:
            own.append(line)
    for pattern in (r"^error:|Error:|terminate called|what\(\)", r".FAILED|FAILED.", r"FAILED"):
        for at in range(len(own) - 1, -1, -1):
            if re.search(pattern, own[at]):
                return "\n".join(own[max(0, at - 2):at + 1]) if own[at].strip() == "FAILED" else own[at]
    return own[-1] if own else (lines[-1] if lines else "the output is empty")


def describe_run(runs, folder, metrics, output, label):
    """One run: its verdict, device, time, summary line and figures, from run.json (if run_course.sh
    wrote one) and its metrics."""
    meta = read_json(os.path.join(folder, "run.json")) if os.path.basename(metrics) == "metrics.jsonl" else None
    meta = meta if isinstance(meta, dict) else {}
    records, bad = read_records(metrics)
    status = meta.get("status") or plot.verdict(records) or ("ran" if records or os.path.exists(output) else None)
    if status is None:
        return None
    last = lambda key: next((r[key] for r in reversed(records) if key in r), None)  # noqa: E731
    run = {"label": label, "status": str(status), "seconds": meta.get("seconds"), "device": last("device"),
           "backend": last("backend"), "ranks": meta.get("ranks") or last("ranks"),
           "summary": plot.summary_of(records) if records else "no metrics", "figures": plot.figures(records),
           "output": os.path.relpath(output, runs) if os.path.exists(output) else None, "error": None}
    # A failed run's own words; a run without a verdict (it stopped before writing one) shows its error
    # line when it printed one.
    said = error_line(output) if status in ("FAILED", "ran") else None
    if status == "FAILED" or (said and re.match(r"error:", said)):
        run["error"] = said
    if bad:
        run["summary"] += f" (a line of its metrics could not be read, and was left out: {bad})"
    return run


def chapter_runs(runs, chapter):
    """The chapter's main run, then each variant (a folder with its own metrics.jsonl), then its other
    metrics files (X.jsonl beside X.txt)."""
    folder = os.path.join(runs, chapter)
    found = []
    main = describe_run(runs, folder, os.path.join(folder, "metrics.jsonl"), os.path.join(folder, "output.txt"), chapter)
    if main:
        found.append(main)
    for sub in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, sub)
        if sub in SKIPPED_FOLDERS or not os.path.isdir(path):
            continue
        variant = describe_run(runs, path, os.path.join(path, "metrics.jsonl"), os.path.join(path, "output.txt"),
                               f"{chapter} {sub}")
        if variant:
            found.append(variant)
    for metrics in sorted(glob.glob(os.path.join(folder, "*.jsonl")) + glob.glob(os.path.join(folder, "*", "*.jsonl"))):
        if os.path.basename(metrics) == "metrics.jsonl" or SKIPPED_FOLDERS & set(metrics.split(os.sep)):
            continue
        extra = describe_run(runs, os.path.dirname(metrics), metrics, metrics[:-len(".jsonl")] + ".txt",
                             os.path.relpath(metrics, runs)[:-len(".jsonl")].replace(os.sep, " "))
        if extra:
            extra["extra"] = True  # a sweep's point, a side run: in the chapter's section, not the summary
            found.append(extra)
    return found


def title_of(chapter):
    try:
        with open(os.path.join(ROOT, chapter, "README.md")) as f:
            return f.readline().lstrip("# ").strip()
    except OSError:
        return chapter


def files_under(runs, chapter, pattern):
    folder = os.path.join(runs, chapter)
    paths = glob.glob(os.path.join(folder, pattern)) + glob.glob(os.path.join(folder, "*", pattern))
    return sorted(p for p in paths if not SKIPPED_FOLDERS & set(os.path.relpath(p, folder).split(os.sep)))


def timeline_svg(doc, width=1000):
    """A Chrome trace as SVG: one row per lane, each span a box (its name inside where it fits, and as
    its tooltip), coloured by pass for a pipeline and in turns otherwise."""
    spans, lanes, names, pipeline = plot.trace_lanes(doc)
    if not spans:
        return "<p class='note'>the trace holds no spans</p>"
    cut = len(lanes) - TIMELINE_LANES
    lanes = lanes[:TIMELINE_LANES]
    by_lane = {}  # each lane's spans, gathered once (not every span scanned for every lane)
    for e in spans:
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e)
    left, row_h = 170, 24
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + max(e["dur"], 1) for e in spans)
    scale = (width - left - 10) / max(end - start, 1)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    height = row_h * len(lanes) + 30
    out = [f"<svg width='{width}' height='{height}' role='img'>"]
    for row, lane in enumerate(lanes):
        y = 5 + row * row_h
        out.append(f"<text x='4' y='{y + 16}' font-size='11'>{html.escape(f'rank {lane[0]}: {names.get(lane, lane[1])}')}</text>")
        for i, e in enumerate(by_lane.get(lane, [])):
            x, w = left + (e["ts"] - start) * scale, max(e["dur"] * scale, 0.5)
            color = colors["FBW".index(e["name"][0])] if pipeline else colors[i % len(colors)]
            name = html.escape(e["name"])
            out.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{row_h - 4}' fill='{color}' "
                       f"fill-opacity='0.75' stroke='#333' stroke-width='0.3'><title>{name}: {e['dur'] / 1000:.3f} ms"
                       f"</title></rect>")
            if w > 7 * len(e["name"]):
                out.append(f"<text x='{x + w / 2:.1f}' y='{y + 14}' font-size='10' text-anchor='middle'>{name}</text>")
    out.append(f"<text x='{left}' y='{height - 6}' font-size='11'>{(end - start) / 1000:.2f} ms from the first span to "
               "the last" + ("; F forward, B backward, W weights' backward of micro-batch i (.c chunk c); white: "
                             "the bubble" if pipeline else "") + "</text></svg>")
    if cut > 0:
        out.append(f"<p class='note'>{cut} more lanes are in the file, not drawn here</p>")
    return "".join(out)


def machine():
    """Where the page was made: the CPU, its cores, the GPU, the libraries, the date."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass

    def line_of(command, pattern=""):  # the first line of a tool's answer that holds `pattern`
        if not shutil.which(command[0]):
            return None
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if pattern in line and line.strip()]
        return lines[0] if done.returncode == 0 and lines else None

    gpu = line_of(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) or "none found"
    try:
        import matplotlib
        mpl = matplotlib.__version__
    except ImportError:
        mpl = "not installed"
    return [("date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M")), ("CPU", f"{cpu}, {os.cpu_count()} cores"),
            ("GPU", gpu), ("MPI", line_of(["mpirun", "--version"]) or "not found"),
            ("CUDA compiler", line_of(["nvcc", "--version"], "release") or "not found"),
            ("Python", platform.python_version()), ("matplotlib", mpl), ("system", platform.platform())]


def cell(value):
    return html.escape("" if value is None else str(value))


def exercises_section(runs):
    """The workshop's exercises as `exercises.py check` last found them (RUNS/exercises/checks.jsonl), or
    nothing when no check has run here."""
    latest = {}
    for record in read_records(os.path.join(runs, "exercises", "checks.jsonl"))[0]:
        if isinstance(record, dict) and record.get("event") == "exercise_check" and isinstance(record.get("exercise"), str):
            latest[record["exercise"]] = record
    if not latest:
        return ""
    rows = []
    for exercise in sorted(latest):
        r = latest[exercise]
        verdict = "PASSED" if r.get("passed") is True else "FAILED"
        rows.append(f"<tr><td>{cell(exercise)}</td><td>{cell(r.get('title'))}</td><td class='{verdict}'>{verdict}</td>"
                    f"<td>{cell(r.get('when'))}</td><td class='error'>{cell(r.get('first_failure'))}</td></tr>")
    return ("<h2 id='exercises'>Exercises</h2><p class='note'>The last <code>scripts/exercises.py check</code> of each "
            "exercise in this checkout.</p><table><tr><th>exercise</th><th>what</th><th>verdict</th><th>checked</th>"
            f"<th>first failure</th></tr>{''.join(rows)}</table>")


def chapter_html(runs, chapter, title, anchor):
    """One chapter's rows of the summary table and its section."""
    rows = []
    found = chapter_runs(runs, chapter)
    if not found:
        rows.append(f"<tr><td><a href='#{anchor}'>{cell(title)}</a></td><td class='absent'>not run</td>"
                    "<td colspan='4' class='absent'>no output under this folder</td></tr>")
        return rows, f"<h2 id='{anchor}'>{cell(title)}</h2><p class='absent'>This chapter did not run.</p>"
    body, extras = [f"<h2 id='{anchor}'>{cell(title)}</h2>"], []
    for i, run in enumerate(found):
        ranks = run["ranks"]
        where = ", ".join(str(x) for x in (run["device"], run["backend"],
                                            f"{ranks} rank{'s' if ranks != 1 else ''}" if ranks else None) if x)
        seconds = f"{run['seconds']:.0f} s" if isinstance(run["seconds"], (int, float)) else ""
        output = f"<a href='{cell(run['output'])}'>output</a>" if run["output"] else ""
        detail = cell(run["summary"]) + (f"<div class='error'>{cell(run['error'])}</div>" if run["error"] else "")
        name = cell(title if i == 0 and run["label"] == chapter else run["label"])
        if run.get("extra"):
            extras.append(f"<tr><td>{cell(run['label'])}</td><td class='{cell(run['status'])}'>{cell(run['status'])}"
                          f"</td><td>{cell(where)}</td><td>{detail}</td><td>{output}</td></tr>")
            continue
        rows.append(f"<tr class='run'><td><a href='#{anchor}'>{name}</a></td><td class='{cell(run['status'])}'>"
                    f"{cell(run['status'])}</td><td>{cell(where)}</td><td>{seconds}</td><td>{detail}</td>"
                    f"<td>{output}</td></tr>")
        body.append(f"<h3>{cell(run['label'])}: <span class='{cell(run['status'])}'>{cell(run['status'])}</span></h3>")
        if run["error"]:
            body.append(f"<p class='error'>{cell(run['error'])}</p>")
        if run["figures"]:
            body.append("<table><tr><th>figure</th><th>measured</th><th>against</th></tr>" + "".join(
                f"<tr><td>{cell(a)}</td><td>{cell(b)}</td><td>{cell(c)}</td></tr>" for a, b, c in run["figures"])
                + "</table>")
    if extras:
        body.append("<h3>More runs</h3><table><tr><th>run</th><th>verdict</th><th>ran on</th><th>key figures</th>"
                    f"<th></th></tr>{''.join(extras)}</table>")
    for image in files_under(runs, chapter, "*.png"):
        rel = os.path.relpath(image, runs)
        notes = "".join(f"<div class='{'error' if FLAGGED.search(line) else 'note'}'>{cell(line)}</div>"
                        for line in caption_of(image))
        body.append(f"<figure><img src='{cell(rel)}' alt='{cell(rel)}'><figcaption>{cell(rel)}{notes}</figcaption>"
                    "</figure>")
    for trace in files_under(runs, chapter, "*.json"):
        doc = read_json(trace)
        if not isinstance(doc, dict) or "traceEvents" not in doc:
            continue
        rel = os.path.relpath(trace, runs)
        label = doc.get("metadata", {}).get("label", "") if isinstance(doc.get("metadata"), dict) else ""
        body.append(f"<h3>Timeline: {cell(rel)}</h3><p class='note'>{cell(label)} The file opens in a trace "
                    f"viewer (Perfetto, or chrome://tracing): <a href='{cell(rel)}'>{cell(rel)}</a>.</p>")
        try:
            body.append(timeline_svg(doc))
        except Exception as e:  # noqa: BLE001: a trace of another shape is named, not drawn
            body.append(f"<p class='error'>{cell(rel)} could not be drawn ({cell(type(e).__name__)}: "
                        f"{cell(str(e)[:120])})</p>")
    return rows, "".join(body)


def render(runs):
    rows, sections = [], []
    for chapter in CHAPTERS:
        title = title_of(chapter)
        anchor = f"ch{chapter[:2]}"
        # One chapter's files that cannot be read (a shape no chapter writes, a number no float holds)
        # cost that chapter's section, said on the page, never the page.
        try:
            chapter_rows, section = chapter_html(runs, chapter, title, anchor)
        except Exception as e:  # noqa: BLE001: whatever the files hold, the other chapters are shown
            why = f"its files could not be read ({type(e).__name__}: {str(e)[:120]})"
            chapter_rows = [f"<tr><td><a href='#{anchor}'>{cell(title)}</a></td><td class='FAILED'>unreadable</td>"
                            f"<td colspan='4' class='error'>{cell(why)}</td></tr>"]
            section = f"<h2 id='{anchor}'>{cell(title)}</h2><p class='error'>This chapter's {cell(why)}.</p>"
        rows += chapter_rows
        sections.append(section)
    facts = "".join(f"<tr><th>{cell(k)}</th><td>{cell(v)}</td></tr>" for k, v in machine())
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>The course's runs</title>"
            f"<style>{CSS}</style></head><body><h1>The course's runs</h1>"
            "<p class='note'>Written by scripts/report.py from the chapters' metrics under this folder; each "
            "chapter's README says what to expect.</p>"
            "<table id='summary'><tr><th>chapter</th><th>verdict</th><th>ran on</th><th>time</th><th>key figures</th>"
            f"<th></th></tr>{''.join(rows)}</table>{exercises_section(runs)}{''.join(sections)}"
            f"<h2>The machine</h2><table id='machine'>{facts}</table></body></html>\n")


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if len(argv) == 2 else 2
    runs = argv[1]
    if not os.path.isdir(runs):
        print(f"report.py: {runs}: not a folder of runs", file=sys.stderr)
        return 2
    page = os.path.join(runs, "index.html")
    text = render(runs)
    # A reader never sees half a page, and nothing is written through a link: the page goes to a temporary
    # made anew (O_EXCL, never one a link stands in the place of), renamed over index.html (which replaces
    # a link there rather than following it).
    temporary = f"{page}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:
        print(f"report.py: {runs}: the page cannot be written ({e.strerror})", file=sys.stderr)
        return 2
    try:
        # errors="replace": a metrics file's lone surrogate ("\\ud800") is shown as one, not a failure.
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        os.replace(temporary, page)
    except OSError as e:  # index.html a folder, say: one line, and no temporary left
        os.unlink(temporary)
        print(f"report.py: {page}: the page cannot be written ({e.strerror or e})", file=sys.stderr)
        return 2
    except BaseException:
        os.unlink(temporary)
        raise
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
