CELLS = [
("md", """
# Stage 5 — The migration report

A verdict per target — **ready**, **ready with work** or **blocked** — with the findings that decide it,
Neuron and TPU side by side, and the checklist of work a migration needs. Built only from the stage
results already in `out_dir`: a missing or unreadable stage is named as a gap.

Logic: `portkit/report.py`. Headless: `portkit report DIR` (no stage is rerun).
"""),
("params", """
model = "minilm"  # model the run folder was made for (shown in the report)
targets = ["neuron", "tpu"]  # targets to report on, side by side
out_dir = "../runs/notebook"  # run folder holding the stage results; report.html and report.json go here
"""),
("code", """
from portkit import environment, params, report

model, targets, out = params.common(model, targets, out_dir)
print(environment.block(targets))
"""),
("md", """
## Verdicts, side by side
"""),
("code", """
r = report.build_report(out, targets)
print(r)
"""),
("code", """
r
"""),
("md", """
## Write report.html (self-contained, opens offline) and report.json (stable keys for CI)
"""),
("code", """
html_path = r.save(out)
print(f"wrote {html_path} and {out / 'report.json'}")
print(r.summary())
"""),
]
