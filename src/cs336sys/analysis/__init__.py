"""Floor 3, analysis: the torch-free toolkit the studies' report modules draw on — derived metrics
(TFLOP/s, MFU, tokens/s, energy, the roofline), the fold of a cell's passes, intervals and findings,
markdown tables, figures and their style, filters of a study table. It sits below the studies and
knows none of them (a study's name reaches it only as a row's ``study`` column); the merge, the run
report and the comparisons that assemble these pieces per study live above (``pipeline.merge``,
``runs``). Never imports torch (a test checks it).
"""
