"""Study ``precision``: accumulation error by dtype and the dtypes autocast gives each tensor (handout §1.1.5)."""

from cs336sys.studies import Study

STUDY = Study(
    name="precision",
    question="What does accumulating in each precision give, and which dtype does autocast give each tensor? (§1.1.5)",
    axes=("part",),
    kind="numerics",  # accumulation error and autocast dtypes: nothing timed
    cell_table=False,  # its tables are the findings
    estimate_s=0.5,  # the median cell of the H100 default sweep (results/h100), rounded
)
