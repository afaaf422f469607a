"""The HTML memory page in a real headless browser (ctest label `browser`).

Usage: test_memory_page.py REMAT CONFIG OUTDIR [--policy P1,P2,...] [--batch B] [--name NAME]
                           [--max-bytes N] [--max-draw-ms MS]

Runs `remat memprof CONFIG --json --html` into OUTDIR, opens the page from disk in Debian's
chromium driven by Playwright (which never downloads a browser of its own: it is pointed at
/usr/bin/chromium) and checks: no console error or page error, no network request, the peak
shown equals the JSON's peak_bytes to the byte for every policy, hovering the peak lists
exactly the tensors the JSON lists live at the peak (largest first), the policy table sorts
by peak both ways, clicking a layer highlights it, offloading policies draw their pinned
host tier (peaking at host_peak_bytes, listed in the panel), and (with --max-bytes /
--max-draw-ms, for a big model) the page's size and the time until it is drawn. Writes
OUTDIR/NAME.png, and OUTDIR/NAME_offload.png where a policy offloads.

Exits 77 (ctest SKIP_RETURN_CODE) saying why when there is no browser or no Playwright.
"""

import argparse
import json
import math
import os
import subprocess
import sys

SKIP = 77
CHROMIUM = os.environ.get("REMAT_CHROMIUM", "/usr/bin/chromium")


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("remat")
    ap.add_argument("config")
    ap.add_argument("outdir")
    ap.add_argument("--policy", default="none,all,every:2,budget:1.2MiB")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--name", default="memory_page")
    ap.add_argument("--max-bytes", type=int, default=0)
    ap.add_argument("--max-draw-ms", type=float, default=0)
    a = ap.parse_args()
    remat, config, outdir = a.remat, a.config, a.outdir
    if not os.access(CHROMIUM, os.X_OK):
        skip(CHROMIUM + " not found (Debian package chromium; tools/bootstrap.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip("Playwright for Python is not installed (tools/bootstrap.sh puts it into the browser venv)")
    os.makedirs(outdir, exist_ok=True)
    html = os.path.join(outdir, a.name + ".html")
    js = os.path.join(outdir, a.name + ".json")
    cmd = [remat, "memprof", config, "--policy", a.policy, "--json", js, "--html", html]
    if a.batch:
        cmd += ["--batch", str(a.batch)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        sys.exit("remat memprof failed")
    report = json.load(open(js))
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors, requests = [], []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda q: requests.append(q.url) if not q.url.startswith(("file:", "data:")) else None)
        url = "file://" + os.path.abspath(html)
        page.goto(url)
        page.wait_for_function("window.rematPage && window.rematPage.ready === true", timeout=20000)
        drawn = page.evaluate("() => window.rematPage.drawnAtMs")
        size = os.path.getsize(html)
        print("page %s: %d bytes, drawn %.0f ms after navigation started" % (html, size, drawn))
        if a.max_bytes:
            check(size <= a.max_bytes, "page size %d <= %d bytes" % (size, a.max_bytes))
        if a.max_draw_ms:
            check(drawn <= a.max_draw_ms, "drawn in %.0f ms <= %.0f ms" % (drawn, a.max_draw_ms))

        # The embedded data is the --json report.
        embedded = json.loads(page.eval_on_selector("#remat-data", "e => e.textContent"))
        check(embedded == report, "the page's data equals the --json report")

        for i, pol in enumerate(report["policies"]):
            page.evaluate("i => window.rematPage.selectPolicy(i)", i)
            shown = int(page.get_attribute("#peak-value", "data-bytes"))
            check(shown == pol["peak_bytes"], "policy %s: peak shown %d == peak_bytes %d" %
                  (pol["policy"], shown, pol["peak_bytes"]))
            text = page.text_content("#peak-value")
            check("{:,}".format(pol["peak_bytes"]) in text, "policy %s: peak text names the exact bytes" % pol["policy"])

            # Move the mouse off the chart, then onto the peak.
            page.mouse.move(1, 1)
            box = page.locator("#timeline").bounding_box()
            px, py = page.evaluate("""() => {
                const c = window.rematPage.timeline, tl = window.rematPage.data.policies[window.rematPage.state.policy].timeline;
                return [c.scales.x.getPixelForValue(tl.peak_event), c.scales.y.getPixelForValue(tl.peak_bytes / 2)];
            }""")
            page.mouse.move(box["x"] + px + 20, box["y"] + py)  # away first: a point that is not the peak
            page.mouse.move(box["x"] + px, box["y"] + py)
            ids = page.eval_on_selector_all("#live-rows tr", "rs => rs.map(r => Number(r.dataset.id))")
            byts = page.eval_on_selector_all("#live-rows tr td:last-child", "ts => ts.map(t => Number(t.dataset.bytes))")
            want = [t[0] for t in pol["timeline"]["live_at_peak"]]  # tensor_fields: id first
            check(ids == want, "policy %s: hovering the peak lists the %d tensors live at the peak (got %d)" %
                  (pol["policy"], len(want), len(ids)))
            check(byts == sorted(byts, reverse=True) and sum(byts) == pol["peak_bytes"],
                  "policy %s: largest first, summing to the peak" % pol["policy"])
            head = page.text_content("#live-head")
            check(head.startswith("At the peak"), "policy %s: the panel says it is the peak" % pol["policy"])

        # The policy table sorts by peak, ascending then descending.
        page.evaluate("() => window.rematPage.selectPolicy(0)")
        header = page.locator("#policy-table th", has_text="peak allocated")
        col = [t.strip() for t in page.eval_on_selector_all("#policy-table thead th", "hs => hs.map(h => h.textContent)")]
        k = col.index("peak allocated")
        peaks = {p["policy"]: p["peak_bytes"] for p in report["policies"]}
        for want_dir, rev in (("descending", True), ("ascending", False)):
            header.click()
            order = page.eval_on_selector_all("#policy-table tbody tr", "rs => rs.map(r => r.cells[0].textContent)")
            check(page.get_attribute("#policy-table thead th:nth-child(%d)" % (k + 1), "aria-sort") == want_dir and
                  [peaks[o] for o in order] == sorted(peaks.values(), reverse=rev),
                  "policy table sorted by peak, %s: %s" % (want_dir, order))

        # Clicking a layer in the live list highlights its tensors, its spans and its row of
        # the layer table. The first row naming a graph layer (or a parameter of one).
        names = [l["name"] for l in report["policies"][0]["layers"]]
        owners = page.eval_on_selector_all("#live-rows tr", "rs => rs.map(r => r.dataset.layer)")
        k = next(i for i, o in enumerate(owners) if any(o == n or o.startswith(n + ".") for n in names))
        layer = max((n for n in names if owners[k] == n or owners[k].startswith(n + ".")), key=len)
        page.locator("#live-rows tr .layer").nth(k).click()
        hl = page.eval_on_selector_all("#live-rows tr.hl", "rs => rs.map(r => r.dataset.layer)")
        sel = page.eval_on_selector_all("#layer-table tbody tr.sel", "rs => rs.map(r => r.dataset.key)")
        check(len(hl) > 0 and all(h == layer or h.startswith(layer + ".") for h in hl),
              "clicking layer %s highlights its tensors (%d)" % (layer, len(hl)))
        check(sel == [layer], "... and its row of the layer table: %s" % sel)
        check(page.evaluate("() => window.rematPage.state.layer") == layer, "... and its spans in the timeline")
        check(page.evaluate("() => typeof window.pwned") == "undefined", "no layer name ran as script")

        # Readable at 1400 px: the page does not scroll sideways; byte axes step by round
        # binary values (1, 2 or 5 x 10^k of KiB, MiB or GiB); every policy its own line
        # style; the reserved swatch is not a filled block.
        check(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"),
              "no horizontal scrolling at 1400 px")
        for chart in ("timeline", "compare"):
            ticks = page.evaluate("c => window.rematPage[c].scales.y.ticks.map(x => x.value)", chart)
            steps = [b - a for a, b in zip(ticks, ticks[1:])]
            # The axis's unit is its largest tick's (GiB, MiB or KiB); steps are 1, 2 or 5
            # times a power of ten of it.
            unit = next((u for u in (2 ** 30, 2 ** 20, 2 ** 10) if max(ticks) >= u), 1)

            def round_step(d):
                m = d / unit
                e = 10 ** math.floor(math.log10(m))
                return any(abs(m - k * e) < 1e-9 * m for k in (1, 2, 5))
            check(len(steps) >= 3 and all(round_step(d) for d in steps),
                  "%s: byte ticks on round binary steps (%s)" % (chart, steps[:3]))
        styles = page.evaluate("""() => window.rematPage.compare.data.datasets
            .filter(d => d.label.includes('(peak ')).map(d => d.borderColor + '/' + (d.borderDash || []).join(','))""")
        check(len(styles) == len(report["policies"]) and len(set(styles)) == len(styles),
              "every policy drawn in its own colour or dash (%d policies)" % len(styles))
        fill = page.evaluate("""() => window.rematPage.timeline.data.datasets.find(d => d.label === 'reserved').backgroundColor""")
        check(fill in ("rgba(0,0,0,0)", "transparent"), "the reserved swatch is an outline, not a block: " + str(fill))
        check(page.evaluate("() => !document.getElementById('pareto-section').hidden") == ("pareto" in report),
              "the checkpoint-plan section is shown exactly when the report has planner data")

        # Offload: the pinned host tier drawn beside the device's bytes exactly for the policies
        # that offload, its line peaking at host_peak_bytes, and the panel's host list at the
        # hovered point summing to the drawn value there (largest first, the first ten).
        offloading = None
        for i, pol in enumerate(report["policies"]):
            host = pol.get("timeline", {}).get("host")
            check((host is not None) == (pol.get("host_peak_bytes", 0) > 0),
                  "policy %s: a host tier exactly where it offloads" % pol["policy"])
            if host is None:
                continue
            offloading = i if offloading is None else offloading
            page.evaluate("i => window.rematPage.selectPolicy(i)", i)
            drawn = page.evaluate("""() => {
                const d = window.rematPage.timeline.data.datasets.find(d => d.label === 'pinned host memory (offloaded)');
                return d ? Math.max(...d.data.map(p => p.y)) : -1; }""")
            check(drawn == pol["host_peak_bytes"], "policy %s: the host line peaks at host_peak_bytes %d (drawn %d)" %
                  (pol["policy"], pol["host_peak_bytes"], drawn))
            k = page.evaluate("() => window.rematPage.state.hover")
            shown = int(page.get_attribute("#host-head", "data-bytes"))
            rows = page.eval_on_selector_all("#host-rows tr td:last-child", "ts => ts.map(t => Number(t.dataset.bytes))")
            check(shown == host["values"][k] and rows == sorted(rows, reverse=True) and
                  (sum(rows) == shown or len(rows) == 10),
                  "policy %s: the panel's host list at the peak: %d bytes, drawn %d, rows %s" %
                  (pol["policy"], shown, host["values"][k], rows[:4]))
        if offloading is not None:  # the first offloading policy, hovered at its peak
            page.evaluate("i => window.rematPage.selectPolicy(i)", offloading)
            shot = os.path.join(outdir, a.name + "_offload.png")
            page.screenshot(path=shot, full_page=True)
            check(os.path.getsize(shot) > 10000, "screenshot written: " + shot)
        page.evaluate("() => window.rematPage.selectPolicy(0)")

        page.mouse.move(box["x"] + px, box["y"] + py)
        shot = os.path.join(outdir, a.name + ".png")
        page.screenshot(path=shot, full_page=True)
        check(os.path.getsize(shot) > 10000, "screenshot written: " + shot)
        browser.close()

    check(not errors, "no console error: %s" % errors[:5])
    check(not requests, "no network request: %s" % requests[:5])
    print("%d passed, %d failed" % (0 if failures else 1, 1 if failures else 0))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
