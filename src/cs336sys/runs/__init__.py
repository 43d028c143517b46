"""Floor 7, runs: a whole run and runs side by side — a study's figures job, the run's ``report.md``
and its HTML, a run cut short (``partial``: every output, answers included), two runs compared cell
by cell, repeatability and the between-device figures. The top floor: it reaches the studies through
the registry and never imports torch.
"""
