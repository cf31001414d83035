"""Where a pipeline stage's idle time goes: measured idle against two models of it.

For each row on several ranks (plain model parallel and the pipelined ones) of one or more `lockstep bench --pipeline-sweep --out DIR` runs, prints
the bubble formula (K-1)/(M+K-1), which assumes stages of equal cost, beside a prediction from the
stage costs the run itself timed when it cut the model (`--balance time` logs the forward +
backward of one micro-batch on each stage, e.g. "326.3, 269.9 ms"), and the idle each stage
measured (the profiler's sync phase over the step time).

With stage costs t_0 .. t_{K-1} per micro-batch (forward + backward) and M micro-batches, GPipe's
and 1F1B's steps both take about (M - 1) * max(t) + sum(t): the slowest stage sets the pace of
the M - 1 micro-batches in the middle, and every stage is on the path of the first and the last.
A stage then computes M * t_i of it and waits for the rest:
    idle_i = 1 - M * t_i / ((M - 1) * max(t) + sum(t)),
which is the bubble formula when all t are equal. What the prediction leaves over is what the
hand-off (sending activations and gradients between the ranks) and the schedule's own waits cost.

Usage: .venv/bin/python bench/pipeline_idle.py SWEEP_DIR [SWEEP_DIR ...]
"""
import json
import os
import re
import statistics
import sys

CUT = re.compile(r"blocks per stage ([\d,]+) \(forward \+ backward of one micro-batch of (\d+): ([\d., ]+) ms\)")


def stage_costs(log_path):
    """The stage costs (ms) and the cut a row's log reports, or None when it did not time them."""
    with open(log_path) as f:
        for line in f:
            m = CUT.search(line)
            if m:
                return [float(x) for x in m.group(3).split(",")], m.group(1)
    return None


def predicted_idle(costs, m):
    step = (m - 1) * max(costs) + sum(costs)
    return [1 - m * t / step for t in costs]


def rows(sweep_dir):
    with open(os.path.join(sweep_dir, "pipeline_sweep.json")) as f:
        sweep = json.load(f)
    for row in sweep["rows"]:
        if row["ranks"] < 2 or not row["ok"]:
            continue
        # "gpipe M=4" -> logs/gpipe-m4.log, "model parallel" -> logs/model-parallel.log
        log = os.path.join(sweep_dir, "logs", row["name"].lower().replace(" m=", "-m").replace(" ", "-") + ".log")
        timed = stage_costs(log)
        if timed is None:
            continue
        costs, cut = timed
        m, k = row["micro_batches"], len(costs)
        yield {
            "row": row["name"], "cut": cut, "costs": costs, "bubble": (k - 1) / (m + k - 1),
            "predicted": predicted_idle(costs, m), "measured": [s["idle_fraction"] for s in row["stages"]],
        }


def pct(xs):
    return " / ".join("%.0f%%" % (100 * x) for x in xs)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    by_row = {}
    print("| sweep | row | cut | stage cost ms | bubble | predicted idle per stage | measured idle per stage |")
    print("|---|---|---|---|---|---|---|")
    for d in sys.argv[1:]:
        for r in rows(d):
            print("| %s | %s | %s | %s | %.0f%% | %s | %s |" % (os.path.basename(d.rstrip("/")), r["row"], r["cut"],
                                                            ", ".join("%.1f" % c for c in r["costs"]), 100 * r["bubble"],
                                                            pct(r["predicted"]), pct(r["measured"])))
            by_row.setdefault(r["row"], []).append(r)
    print()
    print("| row | runs | bubble | median measured idle per stage | worst distance from the bubble, points"
          " | median measured - predicted, points per stage |")
    print("|---|---|---|---|---|---|")
    for name, rs in by_row.items():
        k = len(rs[0]["measured"])
        med = [statistics.median(r["measured"][i] for r in rs) for i in range(k)]
        worst = max(abs(r["measured"][i] - r["bubble"]) for r in rs for i in range(k))
        left = [statistics.median(r["measured"][i] - r["predicted"][i] for r in rs) for i in range(k)]
        print("| %s | %d | %.0f%% | %s | %.1f | %s |" % (name, len(rs), 100 * rs[0]["bubble"], pct(med), 100 * worst,
                                                       " / ".join("%+.1f" % (100 * x) for x in left)))


if __name__ == "__main__":
    main()
