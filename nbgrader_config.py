"""nbgrader's configuration for the course. nbgrader reads it from the folder its commands run in:
run them from the course's folder (as `make release-assignment`, `make collect` and `make grade` do).

One assignment per notebook, named after it (00_gpu_basics). Its source is written from notebooks/
by scripts/student_copies.py, which makes the nbgrader metadata from the course's own markers: each
exercise an autograded answer cell, each check cell a read-only test cell; scripts/grade.py
scores each from the verdict its check cell showed in the submission's sandboxed run.
"""

import os

c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "attention-course"
# source/, release/, submitted/, autograded/, feedback/ and the gradebook; not committed.
c.CourseDirectory.root = os.environ.get("ATTENTION_COURSE_DIR", os.path.join(here, "grading"))
# Where release, fetch, submit and collect meet: a folder every user of the machine or hub can
# write (see classroom/README.md). nbgrader's own default, unless ATTENTION_EXCHANGE names another.
c.Exchange.root = os.environ.get("ATTENTION_EXCHANGE", "/srv/nbgrader/exchange")
# A cell's time limit when grading. A check stops an answer after 30 s of CPU time (a loop that
# never ends is the verdict `timeout`); a whole notebook runs in under 15 s on the simulator and
# the kernel report's first compile of 40 kernels took 21 s (INSTRUCTORS.md, README). 120 s leaves
# a loaded machine room, and is what a loop outside any check (at an answer cell's top level)
# costs before nbgrader interrupts it and goes on.
c.Execute.timeout = 120
# A locked check cell the student deleted is added back and run (and the exercise flagged).
c.OverwriteCells.add_missing_cells = True
# Late work: nbgrader's own penalty, from the due date of `make release-assignment DUE=...`:
# "none" (lateness only reported) or "zero" (a late submission scores 0).
c.LateSubmissionPlugin.penalty_method = os.environ.get("ATTENTION_LATE_PENALTY", "none")
